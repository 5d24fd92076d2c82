package e2b

import (
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/sandloop/sandloop/internal/portproxy"
)

// Ports: E2B routes every port but envd's (49983) and the code
// interpreter's (49999) to that port inside the sandbox, by the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers on a loopback Host (this
// file), or by the host name PORT-ID.DOMAIN that the SDK's getHost(port)
// builds from the domain in create's answer (served by internal/server,
// which admits *.localhost names; see domainOf).

// Dispatch returns the handler of requests that E2B routes to a sandbox's
// own port by their headers (whatever their path), nil for the others:
// for server.Options.Dispatch.
func (h *Handler) Dispatch(r *http.Request) http.Handler {
	port := r.Header.Get("E2b-Sandbox-Port")
	if r.Header.Get("E2b-Sandbox-Id") == "" || port == "" || port == portEnvd || port == portInterpreter {
		return nil
	}
	return h
}

// servePort proxies r to port of sb's session.
func (h *Handler) servePort(w http.ResponseWriter, r *http.Request, sb *sandbox, port string) {
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		writeControlError(w, http.StatusBadRequest, fmt.Sprintf("E2b-Sandbox-Port %q: must be a port number", port))
		return
	}
	if !sb.ms.PortAccess.Public && !sb.trafficTokenOK(r) {
		writeControlError(w, http.StatusForbidden, fmt.Sprintf(
			"port %d of sandbox %s needs its traffic token in e2b-traffic-access-token (it was created with allowPublicTraffic: false)", p, sb.id))
		return
	}
	sb.ms.Touch()
	host, useTLS := sb.ms.PortAccess.Reach(p)
	portproxy.Serve(w, r, sb.ms, p, &portproxy.Options{Path: r.URL.Path, DropHeaders: []string{"X-Access-Token"}, Host: host, TLS: useTLS, Logger: h.log})
}

// domainOf is the domain create and connect answer: the server's own
// loopback address as "localhost:PORT", which makes the SDK's getHost(port)
// "PORT-ID.localhost:PORT". Browsers resolve *.localhost to the loopback
// themselves; Node's and Python's resolvers do not, so such clients dial
// the server with that Host header. A server reached under another name
// answers no domain (the SDK then uses E2B_DOMAIN).
func domainOf(r *http.Request) string {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		return ""
	}
	if host == "localhost" {
		return "localhost:" + port
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return "localhost:" + port
	}
	return ""
}
