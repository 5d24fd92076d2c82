package gateway

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/portproxy"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
)

// Ports and previews through a cell: a session's port is reached as on
// serve (docs/api.md, "Ports and previews"), by the native route
// /v1/sessions/{id}/ports/{port}/..., by the host name PORT-ID.localhost
// or PORT-ID.DOMAIN (Options.PortDomains), or by E2B's E2b-Sandbox-Id and
// E2b-Sandbox-Port headers. The gateway finds the session's host and
// forwards; the host decides who may pass (the owner, a signed URL it
// made, a public session), as it does alone. So the gateway names the
// owner (server.HeaderOwner) only when the request carried a client's
// token, and forwards the others anonymously rather than refusing them.

// portHost is the target of a request routed by its host name or E2B's
// headers rather than its path.
func (g *Gateway) portHost(r *http.Request) (portproxy.Target, bool) {
	if t, ok := portproxy.ParseHost(r.Host, g.opts.PortDomains); ok {
		return t, true
	}
	id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if id == "" || port == "" {
		return portproxy.Target{}, false
	}
	// A label as the host form has: the same checks of port and id.
	return portproxy.ParseHost(strings.ToLower(port+"-"+id)+".localhost", nil)
}

// servePortHost forwards a request for a port named by its host (or by
// E2B's headers) to the session's host, Host kept: the app sees the name
// the user typed.
func (g *Gateway) servePortHost(w http.ResponseWriter, r *http.Request, t portproxy.Target) {
	if p := r.Header.Get("E2b-Sandbox-Port"); p == "49983" || p == "49999" {
		// envd's and the code interpreter's: E2B's own API, not an app's.
		server.WriteError(w, http.StatusNotImplemented, "not_implemented", "a cell's gateway does not serve E2B's API (its sandboxes, envd, the code interpreter); use the sandloop API, or E2B's SDKs against one sandloop serve", 0)
		return
	}
	r = g.portCaller(r)
	tg, ok := g.resolvePort(w, r, t.ID)
	if !ok {
		return
	}
	tg.portHost = strconv.Itoa(t.Port) + "-" + t.ID
	g.forward(w, r, tg)
}

// servePortPath is the native route, /v1/sessions/{id}/ports/{port}/...
func (g *Gateway) servePortPath(w http.ResponseWriter, r *http.Request) {
	r = g.portCaller(r)
	if tg, ok := g.resolvePort(w, r, r.PathValue("id")); ok {
		g.forward(w, r, tg)
	}
}

// portCaller names the caller when the request carries one of the
// clients' tokens (Authorization: Bearer); a request without one goes on
// anonymously (the host may still let it pass).
func (g *Gateway) portCaller(r *http.Request) *http.Request {
	if len(g.tokens) == 0 {
		return r.WithContext(context.WithValue(r.Context(), ownerKey{}, ""))
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return r
	}
	for _, t := range g.tokens {
		if subtle.ConstantTimeCompare([]byte(tok), t) == 1 {
			ctx := context.WithValue(r.Context(), ownerKey{}, server.OwnerOf(tok))
			return r.WithContext(context.WithValue(ctx, portAuthKey{}, true))
		}
	}
	return r
}

// portAuthKey marks a port request whose Authorization header was our
// token (removed on the way); any other Authorization is the app's own.
type portAuthKey struct{}

// resolvePort finds the host of session id for port traffic: whoever
// asks (the host checks access), but only sessions, never runs or MCP.
func (g *Gateway) resolvePort(w http.ResponseWriter, r *http.Request, id string) (target, bool) {
	tg, ok := g.resolveFor(w, r, id, store.KindSession, false)
	tg.port = true
	return tg, ok
}

// scrubPortHeaders removes what only a gateway may tell a host about
// ports (a client's own copy would route its request to another port).
func scrubPortHeaders(h http.Header) {
	for _, k := range []string{server.HeaderPortHost, server.HeaderPortDomain, server.HeaderForwardedHost, server.HeaderForwardedProto} {
		h.Del(k)
	}
}
