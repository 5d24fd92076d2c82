// Package portproxy carries HTTP and WebSocket traffic from outside to a
// server that a session's code started on the sandbox's own loopback (a
// Flask app, a dashboard), which nothing outside could otherwise reach.
//
// A port is reached three ways, all through the sandloop server: the
// native route /v1/sessions/{id}/ports/{port}/..., a host name of the form
// PORT-ID.localhost (browsers resolve *.localhost to the loopback
// themselves, RFC 6761, so an app's absolute paths work as on a dev
// machine), and E2B's E2b-Sandbox-Port header. The face in front checks who
// may pass (the session's token, a signed and expiring URL, or a session
// that opted into public traffic); this package knows nothing of tokens but
// its own signatures. It never passes sandloop's credentials on to the
// sandbox: Authorization is removed when it carried the server's token, and
// the signature's parameter and cookie always.
package portproxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Dialer is a session whose loopback ports can be connected to.
type Dialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// Names of what the proxy reads and removes.
const (
	// SigParam is the query parameter of a signed URL.
	SigParam = "sandloop_sig"
	// Cookie keeps a signed URL's grant for the requests that follow it
	// (an app's scripts, styles and calls), host-only.
	Cookie = "sandloop_port"
	// TokenHeader carries a session's port token (E2B's traffic token).
	TokenHeader = "X-Sandloop-Port-Token"
)

// SandboxPolicy is the policy the native route adds to an app's answers:
// an opaque origin of its own, with scripts, forms, popups and downloads.
const SandboxPolicy = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// Target is one port of one session.
type Target struct {
	ID   string
	Port int
}

// ParseHost recognises PORT-ID.localhost[:N] (and PORT-ID.DOMAIN for each
// of domains, an operator's wildcard name): the port and the session id.
func ParseHost(host string, domains []string) (Target, bool) {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	label, rest, ok := strings.Cut(h, ".")
	if !ok {
		return Target{}, false
	}
	if rest != "localhost" && !matchDomain(rest, domains) {
		return Target{}, false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || strings.Contains(id, "-") {
		return Target{}, false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || p != strconv.Itoa(port) {
		return Target{}, false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return Target{}, false
		}
	}
	return Target{ID: id, Port: port}, true
}

func matchDomain(d string, domains []string) bool {
	for _, x := range domains {
		x = strings.ToLower(strings.Trim(x, "."))
		if x != "" && d == x {
			return true
		}
	}
	return false
}

// HostName is the PORT-ID host name under base ("localhost:8080": the
// server's own address, or a preview domain), for URLs handed to users.
func HostName(t Target, base string) string {
	return strconv.Itoa(t.Port) + "-" + t.ID + "." + base
}

// Signer makes and checks signed URLs' grants: HMAC-SHA256 over the
// target and the expiry, with a key that lives as long as the server (a
// restart voids every URL handed out, as it ends every session).
type Signer struct{ key []byte }

// NewSigner returns a Signer with a fresh random key.
func NewSigner() *Signer {
	k := make([]byte, 32)
	rand.Read(k)
	return &Signer{key: k}
}

// Sign grants access to t until exp.
func (s *Signer) Sign(t Target, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return e + "." + base64.RawURLEncoding.EncodeToString(s.mac(t, e))
}

func (s *Signer) mac(t Target, exp string) []byte {
	m := hmac.New(sha256.New, s.key)
	fmt.Fprintf(m, "%s\x00%d\x00%s", t.ID, t.Port, exp)
	return m.Sum(nil)
}

// Verify reports whether grant is a live grant for t, and until when.
func (s *Signer) Verify(grant string, t Target, now time.Time) (time.Time, bool) {
	e, sig, ok := strings.Cut(grant, ".")
	if !ok {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(e, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	exp := time.Unix(sec, 0)
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(t, e)) || !now.Before(exp) {
		return time.Time{}, false
	}
	return exp, true
}

// Grant is how a request proved it may reach t: a signed URL's parameter
// (which becomes a cookie, with the parameter dropped by a redirect), or
// the cookie from an earlier one.
func (s *Signer) Grant(w http.ResponseWriter, r *http.Request, t Target, cookiePath string) (granted, redirected bool) {
	now := time.Now()
	if g := r.URL.Query().Get(SigParam); g != "" {
		exp, ok := s.Verify(g, t, now)
		if !ok {
			return false, false
		}
		http.SetCookie(w, &http.Cookie{Name: Cookie, Value: g, Path: cookiePath, Expires: exp,
			HttpOnly: true, SameSite: http.SameSiteLaxMode})
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			u := *r.URL
			q := u.Query()
			q.Del(SigParam)
			u.RawQuery = q.Encode()
			u.Scheme, u.Host = "", ""
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return true, true
		}
		return true, false
	}
	if c, err := r.Cookie(Cookie); err == nil {
		if _, ok := s.Verify(c.Value, t, now); ok {
			return true, false
		}
	}
	return false, false
}

// Options of one proxied request.
type Options struct {
	// Path is the path the app sees (the request's own for a host route;
	// what follows .../ports/PORT for the native route). If empty, "/".
	Path string
	// Prefix is what the native route cut from the path, told to the app
	// in X-Forwarded-Prefix.
	Prefix string
	// DropAuthorization removes the Authorization header (it carried
	// sandloop's token, not the app's).
	DropAuthorization bool
	// DropHeaders are more headers of the face's own credentials, removed.
	DropHeaders []string
	// Sandbox marks the app's answers with Content-Security-Policy:
	// sandbox (scripts allowed, same origin not), for a route on the
	// server's own origin: there an app's page would otherwise run in the
	// origin of the web UI and the API (the UI keeps its token in that
	// origin's storage). The host route (PORT-ID.localhost) is an origin of
	// its own and needs none.
	Sandbox bool
	// Host, if set, is the Host header the app sees, in place of the
	// name the client used.
	Host string
	// TLS speaks HTTPS to the app (it serves TLS on its port), not
	// checking its certificate: a self-signed one is what such an app
	// has.
	TLS bool
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// ErrNotListening is the answer when nothing listens on the port.
var ErrNotListening = errors.New("nothing is listening on that port in the sandbox")

// Serve proxies r to port t.Port of d. A port nothing listens on answers
// 502 with a message that says so.
func Serve(w http.ResponseWriter, r *http.Request, d Dialer, port int, o *Options) {
	var opts Options
	if o != nil {
		opts = *o
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			out := pr.Out
			out.URL.Scheme = "http"
			if opts.TLS {
				out.URL.Scheme = "https"
			}
			out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			out.Host = cmpStr(opts.Host, pr.In.Host) // by default the app sees the name the user typed
			out.URL.Path = cmpStr(opts.Path, "/")
			out.URL.RawPath = ""
			q := out.URL.Query()
			if q.Has(SigParam) {
				q.Del(SigParam)
				out.URL.RawQuery = q.Encode()
			}
			if opts.Prefix != "" {
				out.Header.Set("X-Forwarded-Prefix", opts.Prefix)
			}
			if opts.DropAuthorization {
				out.Header.Del("Authorization")
			}
			// sandloop's own headers (a port token, and from a cell's
			// gateway its secret and the caller's identity) never reach
			// the app: code in the sandbox could otherwise read the
			// secret that every host of the cell trusts.
			for k := range out.Header {
				if strings.HasPrefix(k, "X-Sandloop-") {
					out.Header.Del(k)
				}
			}
			for _, h := range opts.DropHeaders {
				out.Header.Del(h)
			}
			out.Header.Del("E2b-Traffic-Access-Token")
			dropCookie(out.Header, Cookie)
		},
		// One connection per request, never pooled: an idle pooled
		// connection would keep the session in use (see Managed.DialPort).
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialPort(ctx, port)
			},
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 0,
			// The app's own certificate, over a connection into its
			// sandbox: nothing to verify it against (Options.TLS).
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		},
		FlushInterval: -1, // stream as the app writes (server-sent events, long polls)
		ModifyResponse: func(resp *http.Response) error {
			if opts.Sandbox {
				resp.Header.Add("Content-Security-Policy", SandboxPolicy)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Debug("port proxy", "port", port, "err", err)
			msg := fmt.Sprintf("port %d: %v", port, err)
			if errors.Is(err, syscall.ECONNREFUSED) {
				msg = fmt.Sprintf("port %d: %v (start a server on 127.0.0.1:%d or 0.0.0.0:%d in the sandbox)", port, ErrNotListening, port, port)
			}
			http.Error(w, msg, http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// dropCookie removes the cookie name from the Cookie headers of h.
func dropCookie(h http.Header, name string) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var keep []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			p := strings.TrimSpace(part)
			if p == "" || strings.HasPrefix(p, name+"=") {
				continue
			}
			keep = append(keep, p)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// PathURL is the native route of t's port, from the server's base URL.
func PathURL(base *url.URL, t Target) string {
	u := *base
	u.Path = fmt.Sprintf("/v1/sessions/%s/ports/%d/", t.ID, t.Port)
	u.RawQuery = ""
	return u.String()
}
