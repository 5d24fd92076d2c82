package lessons

import (
	"regexp"
	"strings"
)

// Lessons outlive runs and are shown to later runs (and, on a server, kept
// in a database others administer), so nothing that looks like a
// credential may enter one.
var (
	// key=value and key: value where the key names a secret (a value
	// followed by "(" is code, not a secret: token_count = len(...)).
	reSecretAssign = regexp.MustCompile(`(?i)\b([\w-]*(?:api[_-]?key|secret|token|passw(?:or)?d|pwd|auth|credential|private[_-]?key)[\w-]*)(["']?\s*[:=]\s*["']?)([^\s'",;}{()<>]+)([\s'",;}{)]|$)`)
	// Authorization headers.
	reBearer = regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}`)
	// Credentials inside URLs.
	reURLCreds = regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`)
	// Well-known token shapes: OpenAI/Anthropic sk-..., GitHub, Slack, AWS, Google, JWT.
	reTokens = []*regexp.Regexp{
		regexp.MustCompile(`\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}`),
		regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{20,}`),
		regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`),
		regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`),
		regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{30,}`),
		regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`),
	}
	// Any long run of key-like characters mixing letters and digits (hex,
	// base64): high entropy.
	reLongKey = regexp.MustCompile(`\b[A-Za-z0-9+/_-]{32,}={0,2}`)
)

// StripSecrets replaces what looks like a key, token or password in s with
// "<redacted>".
func StripSecrets(s string) string {
	s = reBearer.ReplaceAllString(s, "$1 <redacted>")
	s = reURLCreds.ReplaceAllString(s, "://<redacted>@")
	for _, re := range reTokens {
		s = re.ReplaceAllString(s, "<redacted>")
	}
	s = reLongKey.ReplaceAllStringFunc(s, func(m string) string {
		if !mixed(m) {
			return m // a long plain word or number is not a key
		}
		return "<redacted>"
	})
	return reSecretAssign.ReplaceAllString(s, "$1$2<redacted>$4")
}

// mixed says whether s mixes letters and digits, as generated keys do.
func mixed(s string) bool {
	return strings.ContainsAny(s, "0123456789") && strings.IndexFunc(s, func(r rune) bool {
		return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
	}) >= 0
}
