package server

import "context"

type ownerKey struct{}

func withOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// owner is the identity of the caller: a hash of its token, or "" when the
// server runs without tokens.
func owner(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// OwnerOf is the owner of the sessions created with token, as the API
// records it (for other faces of the server that map their own
// credentials onto sandloop's tokens).
func OwnerOf(token string) string { return ownerOf(token) }
