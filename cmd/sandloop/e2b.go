package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sandloop/sandloop/internal/e2b"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
)

// newE2B builds the E2B-compatible face. Each sandloop token has an API
// key (its bytes in hex after e2b_; the token itself is accepted too) whose
// sandboxes belong to the token's owner. Without tokens a random key is
// made for this run: the E2B face never serves without one.
// A sandbox may live as long as a session may (maxLife; if not positive,
// the package's default).
func newE2B(mgr *session.Manager, tokens []string, zy session.Zygote, maxLife time.Duration, log *slog.Logger) (*e2b.Handler, string, error) {
	keys := map[string]string{}
	first := ""
	for _, t := range tokens {
		k := e2b.KeyForToken(t)
		keys[k], keys[t] = server.OwnerOf(t), server.OwnerOf(t)
		if first == "" {
			first = k
		}
	}
	if first == "" {
		first = e2b.NewKey()
		keys[first] = ""
	}
	h, err := e2b.New(e2b.Options{Manager: mgr, Keys: keys, Zygote: zy, MaxTimeout: max(maxLife, 0), Logger: log})
	return h, first, err
}

// printE2B says what to export for E2B's SDKs.
func printE2B(w io.Writer, url, key string) {
	fmt.Fprintf(w, "E2B SDKs: export E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=%s\n", url, url, key)
}
