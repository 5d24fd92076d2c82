package server

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// The checks every face of the API (serve, a cell's gateway) makes before
// it routes a request, in one place so the faces cannot drift apart.

// Front admits requests to a mux: the browser defences (the Host header
// against DNS rebinding, cross-site requests without a token against
// CSRF), then "." and ".." path segments and unknown routes, each refused
// with the API's JSON error (the mux would answer those with a redirect or
// a plain-text 404).
type Front struct {
	// Mux holds the routes; a request matching none gets 404 not_found.
	Mux *http.ServeMux
	// AllowedHosts are extra Host header values accepted ("*": any).
	AllowedHosts []string
	// NoBrowserChecks skips the browser defences: for a cell's host, which
	// is reached under whatever name the gateway dials and only with the
	// gateway's secret, which a rebinding page cannot have (the gateway
	// made both checks already).
	NoBrowserChecks bool
}

// Admit reports whether r may be routed; if not, it wrote the error.
func (f *Front) Admit(w http.ResponseWriter, r *http.Request) bool {
	if !f.NoBrowserChecks && !hostAllowed(r.Host, f.AllowedHosts) {
		writeError(w, &apiError{http.StatusForbidden, "bad_host", fmt.Sprintf("Host %q is not this server's (add it with --allowed-host)", r.Host), 0})
		return false
	}
	if !f.NoBrowserChecks && crossSiteWithoutToken(r) {
		writeError(w, &apiError{http.StatusForbidden, "cross_origin", "cross-origin requests must carry Authorization: Bearer <token>", 0})
		return false
	}
	for _, seg := range strings.Split(r.URL.Path, "/") {
		if seg == ".." || seg == "." {
			writeError(w, &apiError{http.StatusBadRequest, "bad_path", fmt.Sprintf("path %q: %q segments are not allowed", r.URL.Path, seg), 0})
			return false
		}
	}
	if _, pattern := f.Mux.Handler(r); pattern == "" {
		writeError(w, &apiError{http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s (see /openapi.yaml)", r.Method, r.URL.Path), 0})
		return false
	}
	return true
}

// hostAllowed refuses Host headers that are not the server's own (allowed
// adds names), so a web page on a rebinding domain cannot reach a loopback server.
func hostAllowed(host string, allowed []string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	switch h {
	case "localhost", "127.0.0.1", "::1", "":
		return true
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range allowed {
		if a == "*" || strings.EqualFold(a, h) || strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

// crossSiteWithoutToken is a browser request from another origin that
// does not carry a bearer token (a CSRF attempt: browsers add
// Authorization only when the page's script sets it, which needs a CORS
// preflight we never grant).
func crossSiteWithoutToken(r *http.Request) bool {
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		return false
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" && r.Method == http.MethodGet {
		return false
	}
	u, err := url.Parse(origin)
	return err != nil || u.Host != r.Host
}

// Tokens are the accepted bearer tokens of serve or a gateway.
type Tokens [][]byte

// NewTokens keeps the non-empty tokens of list.
func NewTokens(list []string) Tokens {
	var ts Tokens
	for _, t := range list {
		if t != "" {
			ts = append(ts, []byte(t))
		}
	}
	return ts
}

// Owner checks the request's token (Authorization: Bearer, or ?token= for
// EventSource and downloads from the web UI) and returns its owner
// (OwnerOf); with no tokens configured everyone is the owner "". If no
// token matches, it writes 401 and returns false.
func (ts Tokens) Owner(w http.ResponseWriter, r *http.Request) (string, bool) {
	if len(ts) == 0 {
		return "", true
	}
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if tok == r.Header.Get("Authorization") {
		tok = r.URL.Query().Get("token")
	}
	for _, t := range ts {
		if subtle.ConstantTimeCompare([]byte(tok), t) == 1 {
			return OwnerOf(tok), true
		}
	}
	writeError(w, errUnauthorized)
	return "", false
}
