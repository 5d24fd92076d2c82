package server

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/portproxy"
	"github.com/sandloop/sandloop/internal/session"
)

// Ports and previews: a server the session's code started is reached
// through this server only (internal/portproxy), by the native route
// /v1/sessions/{id}/ports/{port}/..., or by the host name
// PORT-ID.localhost:N that browsers resolve to the loopback themselves. Who
// may pass: the session's owner (its token as a bearer), a signed,
// expiring URL the owner asked for, a session's port token (E2B's traffic
// token), or anyone for a session created with public_ports.

// DefaultPortURLLifetime and MaxPortURLLifetime bound a signed URL.
const (
	DefaultPortURLLifetime = time.Hour
	MaxPortURLLifetime     = 7 * 24 * time.Hour
)

// portJSON is one listening port of a session.
type portJSON struct {
	Port int `json:"port"`
	// URL is the port's host route (needs the token as a bearer, or a
	// signed URL for a browser); PathURL its native route.
	URL     string `json:"url"`
	PathURL string `json:"path_url"`
}

// portURLRequest asks for a signed URL of a port.
type portURLRequest struct {
	Port       int      `json:"port"`
	ExpiresInS *float64 `json:"expires_in_s"`
}

// portURLJSON is a signed URL of a port.
type portURLJSON struct {
	URL       string    `json:"url"`
	PathURL   string    `json:"path_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// baseHost is what PORT-ID. is put in front of: the first port domain if
// the operator gave one, else localhost with the port the client used.
// Behind a gateway, the gateway's name and domain (the host's own are
// not the user's to reach).
func (s *Server) baseHost(r *http.Request) string {
	if d := r.Header.Get(HeaderPortDomain); d != "" && s.fromGateway(r) {
		return d
	}
	if len(s.opts.PortDomains) > 0 {
		return s.opts.PortDomains[0]
	}
	if _, port, err := net.SplitHostPort(s.baseURL(r).Host); err == nil {
		return "localhost:" + port
	}
	return "localhost"
}

func (s *Server) baseURL(r *http.Request) *url.URL {
	if h := r.Header.Get(HeaderForwardedHost); h != "" && s.fromGateway(r) {
		scheme := "http"
		if r.Header.Get(HeaderForwardedProto) == "https" {
			scheme = "https"
		}
		return &url.URL{Scheme: scheme, Host: h}
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return &url.URL{Scheme: scheme, Host: r.Host}
}

func (s *Server) hostURL(r *http.Request, t portproxy.Target) *url.URL {
	u := s.baseURL(r)
	u.Host = portproxy.HostName(t, s.baseHost(r))
	u.Path = "/"
	return u
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	ports, err := ms.Ports()
	if err != nil {
		writeError(w, err)
		return
	}
	out := struct {
		Ports []portJSON `json:"ports"`
	}{Ports: []portJSON{}}
	for _, p := range ports {
		t := portproxy.Target{ID: ms.ID(), Port: p}
		out.Ports = append(out.Ports, portJSON{Port: p, URL: s.hostURL(r, t).String(), PathURL: portproxy.PathURL(s.baseURL(r), t)})
	}
	WriteJSON(w, http.StatusOK, out)
}

// portOf reads the {port} path value.
func portOf(r *http.Request) (int, error) {
	p, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || p < 1 || p > 65535 {
		return 0, badRequest("port %q: must be a number 1-65535", r.PathValue("port"))
	}
	return p, nil
}

func (s *Server) portURL(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req portURLRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	port := req.Port
	if port < 1 || port > 65535 {
		writeError(w, badRequest("port: must be 1-65535 (the port the app listens on inside the sandbox)"))
		return
	}
	life := DefaultPortURLLifetime
	if req.ExpiresInS != nil {
		if err := positive("expires_in_s", *req.ExpiresInS, MaxPortURLLifetime.Seconds()); err != nil {
			writeError(w, err)
			return
		}
		life = time.Duration(*req.ExpiresInS * float64(time.Second))
	}
	t := portproxy.Target{ID: ms.ID(), Port: port}
	exp := time.Now().Add(life).Truncate(time.Second)
	grant := url.Values{portproxy.SigParam: {s.signer.Sign(t, exp)}}.Encode()
	host := s.hostURL(r, t)
	host.RawQuery = grant
	WriteJSON(w, http.StatusCreated, portURLJSON{URL: host.String(), PathURL: portproxy.PathURL(s.baseURL(r), t) + "?" + grant, ExpiresAt: exp.UTC()})
}

// bearerOwner is the owner of the request's bearer token, if it carries
// one of the server's tokens.
func (s *Server) bearerOwner(r *http.Request) (string, bool) {
	if s.opts.GatewaySecret != "" {
		// The gateway names the owner only of a request whose token it
		// checked; port traffic without one (a signed URL, a public
		// session) comes without the header.
		if _, named := r.Header[HeaderOwner]; named && s.fromGateway(r) {
			return r.Header.Get(HeaderOwner), true
		}
		return "", false
	}
	if len(s.tokens) == 0 {
		return "", true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", false
	}
	for _, t := range s.tokens {
		if subtle.ConstantTimeCompare([]byte(tok), t) == 1 {
			return OwnerOf(tok), true
		}
	}
	return "", false
}

// portAccess decides whether r may reach t of ms, and whether the
// Authorization header carried our token (so it is not passed on). It
// writes the answer when the request stops here (refused, or redirected
// to drop a signed URL's parameter).
func (s *Server) portAccess(w http.ResponseWriter, r *http.Request, ms *session.Managed, t portproxy.Target, cookiePath string) (pass, dropAuth bool) {
	if owner, ok := s.bearerOwner(r); ok && owner == ms.Owner {
		return true, r.Header.Get("Authorization") != ""
	}
	granted, redirected := s.signer.Grant(w, r, t, cookiePath)
	if redirected {
		return false, false
	}
	if granted || ms.PortAccess.Public {
		return true, false
	}
	if tok := ms.PortAccess.Token; tok != "" {
		for _, h := range []string{portproxy.TokenHeader, "E2b-Traffic-Access-Token"} {
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(h)), []byte(tok)) == 1 {
				return true, false
			}
		}
	}
	writeError(w, &apiError{http.StatusForbidden, "port_forbidden", fmt.Sprintf(
		"port %d of session %s needs the session's token (Authorization: Bearer), a signed URL (POST /v1/sessions/%s/previews {\"port\": %d}) or a session created with public_ports",
		t.Port, t.ID, t.ID, t.Port), 0})
	return false, false
}

// proxyPort is the native route: /v1/sessions/{id}/ports/{port}/{path...}.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) {
	port, err := portOf(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ms, err := s.opts.Manager.Lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	t := portproxy.Target{ID: ms.ID(), Port: port}
	prefix := fmt.Sprintf("/v1/sessions/%s/ports/%d", t.ID, t.Port)
	pass, dropAuth := s.portAccess(w, r, ms, t, prefix+"/")
	if !pass {
		return
	}
	ms.Touch()
	// On the API's own origin: the app's pages run sandboxed (an opaque
	// origin), never with access to the web UI's storage and its token.
	host, useTLS := ms.PortAccess.Reach(port)
	portproxy.Serve(w, r, ms, port, &portproxy.Options{Path: "/" + r.PathValue("path"), Prefix: prefix, DropAuthorization: dropAuth, Sandbox: true, Host: host, TLS: useTLS, Logger: s.log})
}

// serveHostPort is the host route: PORT-ID.localhost, before the API's
// own checks (its paths are the app's, not the API's).
func (s *Server) serveHostPort(w http.ResponseWriter, r *http.Request, t portproxy.Target) {
	ms, err := s.opts.Manager.Lookup(t.ID)
	if err != nil {
		writeError(w, &apiError{http.StatusNotFound, "not_found", fmt.Sprintf("no session %s on this server (the host name is PORT-SESSIONID.localhost)", t.ID), 0})
		return
	}
	pass, dropAuth := s.portAccess(w, r, ms, t, "/")
	if !pass {
		return
	}
	ms.Touch()
	host, useTLS := ms.PortAccess.Reach(t.Port)
	portproxy.Serve(w, r, ms, t.Port, &portproxy.Options{Path: r.URL.Path, DropAuthorization: dropAuth, Host: host, TLS: useTLS, Logger: s.log})
}

// PreviewURL signs a preview URL of port of session id until exp, under
// base ("localhost:8080": PORT-ID.localhost:8080; or a port domain), for
// the previews of agent runs (runs.Options.PreviewURL).
func (s *Server) PreviewURL(base, id string, port int, exp time.Time) string {
	t := portproxy.Target{ID: id, Port: port}
	if len(s.opts.PortDomains) > 0 {
		base = s.opts.PortDomains[0]
	}
	u := url.URL{Scheme: "http", Host: portproxy.HostName(t, base), Path: "/",
		RawQuery: url.Values{portproxy.SigParam: {s.signer.Sign(t, exp)}}.Encode()}
	return u.String()
}

// renamePreviews rewrites the preview URLs in a run's report (or in its
// run_finished event, under "report") to the name the client used: a run
// names its previews when it ends, under the host's own address, and a
// client behind a gateway (or under another allowed name) reaches them
// under its own. The signature covers the session, port and expiry, not
// the name, so it stays valid. JSON without previews is returned as it is.
func (s *Server) renamePreviews(r *http.Request, raw []byte, underReport bool) []byte {
	if !bytes.Contains(raw, []byte(`"previews"`)) {
		return raw
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return raw
	}
	rep := top
	if underReport {
		if json.Unmarshal(top["report"], &rep) != nil {
			return raw
		}
	}
	var previews []map[string]any
	if json.Unmarshal(rep["previews"], &previews) != nil {
		return raw
	}
	base := s.baseURL(r)
	for _, p := range previews {
		u, err := url.Parse(fmt.Sprint(p["url"]))
		if err != nil {
			continue
		}
		t, ok := portproxy.ParseHost(u.Host, s.opts.PortDomains)
		if !ok {
			continue
		}
		u.Scheme, u.Host = base.Scheme, portproxy.HostName(t, s.baseHost(r))
		p["url"] = u.String()
	}
	b, err := json.Marshal(previews)
	if err != nil {
		return raw
	}
	rep["previews"] = b
	if underReport {
		if top["report"], err = json.Marshal(rep); err != nil {
			return raw
		}
	} else {
		top = rep
	}
	out, err := json.Marshal(top)
	if err != nil {
		return raw
	}
	return out
}
