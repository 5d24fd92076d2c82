package e2b

// KeysForTokens gives each sandloop token an API key (its bytes in hex
// after e2b_; the token itself is accepted too) whose sandboxes belong
// to the token's owner (ownerOf, as sandloop's own API names it), for
// Options.Keys; first is the first token's key. Without tokens it makes a
// random key: the E2B face never serves without one.
func KeysForTokens(tokens []string, ownerOf func(token string) string) (keys map[string]string, first string) {
	keys = map[string]string{}
	for _, t := range tokens {
		k := KeyForToken(t)
		keys[k], keys[t] = ownerOf(t), ownerOf(t)
		if first == "" {
			first = k
		}
	}
	if first == "" {
		first = NewKey()
		keys[first] = ""
	}
	return keys, first
}
