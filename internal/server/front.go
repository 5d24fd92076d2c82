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
		if allow := allowedMethods(f.Mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, &apiError{http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s takes %s, not %s (see /openapi.yaml)", r.URL.Path, strings.Join(allow, ", "), r.Method), 0})
			return false
		}
		writeError(w, &apiError{http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s (see /openapi.yaml)", r.Method, r.URL.Path), 0})
		return false
	}
	return true
}

// allowedMethods lists the methods mux routes r's path for, for a 405's Allow.
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var out []string
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && !redirects(pattern, r.URL.Path) {
			out = append(out, m)
		}
	}
	return out
}

// redirects reports whether the mux matched path to pattern only by
// redirecting it to path + "/" (".../files" to ".../files/{path...}"),
// which is not a method the path itself takes.
func redirects(pattern, path string) bool {
	p := pattern
	if _, after, ok := strings.Cut(pattern, " "); ok {
		p = after
	}
	return (strings.HasSuffix(p, "/") || strings.HasSuffix(p, "...}")) && !strings.HasSuffix(path, "/") &&
		strings.Count(p, "/") > strings.Count(path, "/")
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

// Owner checks the request's token (Authorization: Bearer, or ?token= on
// the routes of QueryTokenRoutes) and returns its owner (OwnerOf); with no
// tokens configured everyone is the owner "". If no token matches, it
// writes 401 and returns false.
func (ts Tokens) Owner(w http.ResponseWriter, r *http.Request) (string, bool) {
	if len(ts) == 0 {
		return "", true
	}
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if tok == r.Header.Get("Authorization") {
		tok = r.URL.Query().Get("token")
		if tok != "" && !takesQueryToken(r) {
			writeError(w, errQueryToken)
			return "", false
		}
	}
	for _, t := range ts {
		if subtle.ConstantTimeCompare([]byte(tok), t) == 1 {
			return OwnerOf(tok), true
		}
	}
	writeError(w, errUnauthorized)
	return "", false
}

// QueryTokenRoutes are the routes that take the token as ?token=: downloads
// (a plain link, curl -O), the run event stream (EventSource cannot send
// headers) and the terminal's WebSocket (nor can a browser's WebSocket).
// Nowhere else, as a token in a URL ends up in logs, browser history and
// Referer headers.
var QueryTokenRoutes = []string{
	"GET /v1/sessions/{id}/files/{path...}",
	"GET /v1/sessions/{id}/archive",
	"GET /v1/runs/{id}/events",
	"GET /v1/runs/{id}/artifacts",
	"GET /v1/sessions/{id}/terminal",
}

var queryTokenMux = func() *http.ServeMux {
	m := http.NewServeMux()
	for _, p := range QueryTokenRoutes {
		m.Handle(p, http.NotFoundHandler())
	}
	return m
}()

func takesQueryToken(r *http.Request) bool {
	_, pattern := queryTokenMux.Handler(r)
	return pattern != "" && !redirects(pattern, r.URL.Path)
}
