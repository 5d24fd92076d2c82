package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// MirrorPath is where a gate with a Cache serves the sandbox pip's index
// (MirrorPath+"simple/") and the package files it links
// (MirrorPath+"files/SHA256/SCHEME/HOST/PATH"), as plain HTTP on its own
// listener. pip inside speaks to it without TLS over the jail's loopback;
// the gate fetches upstream over TLS itself, so it sees the files it caches.
const MirrorPath = "/.sandloop/pip/"

// PipEnv is the environment that points pip at the gate's mirror on the
// sandbox's loopback at port: nothing if the gate has no cache or its
// allowlist does not cover the cache's index.
func (g *Gate) PipEnv(port int) []string {
	if g.opts.Cache == nil || !g.allowsURLHost(g.opts.Cache.index) {
		return nil
	}
	return []string{"PIP_INDEX_URL=http://127.0.0.1:" + strconv.Itoa(port) + MirrorPath + "simple/"}
}

// allowsURLHost reports whether the allowlist covers u's host and port
// (by name: no resolving).
func (g *Gate) allowsURLHost(u *url.URL) bool {
	host, port := urlHostPort(u)
	if ad, err := netip.ParseAddr(host); err == nil {
		return g.allow.Load().allowsAddrTarget(ad.Unmap(), port)
	}
	return g.allow.Load().allowsName(host, port)
}

func urlHostPort(u *url.URL) (string, int) {
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 443
		if u.Scheme == "http" {
			port = 80
		}
	}
	return strings.ToLower(strings.TrimSuffix(u.Hostname(), ".")), port
}

// upstream is the client the mirror fetches with: every connection is
// checked against the session's policy and dials only the address checked.
func (g *Gate) upstream() *http.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.client == nil {
		tr := &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				host, portText, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				port, _ := strconv.Atoi(portText)
				host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
				addrs, _, r := g.check(ctx, host, port)
				if r != nil {
					return nil, r
				}
				c, err := g.dial(ctx, addrs, port)
				if err != nil {
					return nil, &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: could not connect to %s: %v", net.JoinHostPort(host, portText), dialReason(err))}
				}
				return &idleConn{Conn: c, idle: g.policy.IdleTimeout}, nil
			},
			TLSClientConfig:       &tls.Config{RootCAs: g.opts.Cache.roots},
			TLSHandshakeTimeout:   g.policy.DialTimeout,
			ResponseHeaderTimeout: g.policy.IdleTimeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       30 * time.Second,
		}
		g.client = &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			return nil
		}}
	}
	return g.client
}

// idleConn extends its read deadline on every read.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(p)
}

// maxIndexPage caps an index page the mirror reads.
const maxIndexPage = 32 << 20

// projectPath is what may follow MirrorPath+"simple/": a project's page.
var projectPath = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9._-]*/?)?$`)

// serveMirror answers a request for the mirror (MirrorPath); it reports
// whether the connection may carry another request.
func (g *Gate) serveMirror(c *countConn, req *http.Request) bool {
	start := time.Now()
	e := Entry{Time: start, Method: req.Method, Host: "127.0.0.1", Port: Port}
	defer g.finish(&e, c, start)
	refuse := func(r *refusal) bool {
		e.Reason = r.msg
		writeRefusal(c, r)
		return false
	}
	if g.opts.Cache == nil {
		return refuse(&refusal{http.StatusNotFound, "sandloop: this session has no package cache"})
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return refuse(&refusal{http.StatusMethodNotAllowed, "sandloop: the package cache is read-only: only GET and HEAD"})
	}
	if req.ContentLength != 0 || len(req.TransferEncoding) > 0 {
		return refuse(&refusal{http.StatusBadRequest, "sandloop: a request to the package cache has no body"})
	}
	rest := strings.TrimPrefix(req.URL.EscapedPath(), MirrorPath)
	var ok bool
	switch {
	case strings.HasPrefix(rest, "simple/"):
		ok = g.mirrorPage(c, req, &e, strings.TrimPrefix(rest, "simple/"))
	case strings.HasPrefix(rest, "files/"):
		ok = g.mirrorFile(c, req, &e, strings.TrimPrefix(rest, "files/"))
	default:
		return refuse(&refusal{http.StatusNotFound, "sandloop: the package cache serves " + MirrorPath + "simple/ and the files it links"})
	}
	return ok && !req.Close
}

// asRefusal turns a failed upstream fetch into words for the sandbox.
func asRefusal(err error, what string) *refusal {
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: fetching %s failed: %v", what, err)}
}

// fetch GETs u upstream for the mirror, noting the address in e.
func (g *Gate) fetch(req *http.Request, e *Entry, u *url.URL, accept string) (*http.Response, *refusal) {
	e.Host, e.Port = urlHostPort(u)
	if !g.allowsURLHost(u) { // (checked again on every connection, redirects too)
		_, _, r := g.check(g.ctx, e.Host, e.Port)
		return nil, r
	}
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) { e.Addr = ci.Conn.RemoteAddr().String() }}
	ctx := httptrace.WithClientTrace(g.ctx, trace)
	up, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, asRefusal(err, u.String())
	}
	if accept != "" {
		up.Header.Set("Accept", accept)
	}
	up.Header.Set("User-Agent", "sandloop-pip-cache")
	resp, err := g.upstream().Do(up)
	if err != nil {
		return nil, asRefusal(err, u.String())
	}
	e.Allowed = true
	e.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &refusal{resp.StatusCode, fmt.Sprintf("sandloop: the package index answered %s for %s", resp.Status, u)}
	}
	return resp, nil
}

// mirrorPage serves a project's index page (or the root's) from the
// upstream index, its file links pointing at the mirror.
func (g *Gate) mirrorPage(c *countConn, req *http.Request, e *Entry, project string) bool {
	e.Cache = "index"
	if !projectPath.MatchString(project) {
		e.Reason = "not a project page"
		writeRefusal(c, &refusal{http.StatusNotFound, "sandloop: not a project page of the package index"})
		return false
	}
	u := *g.opts.Cache.index
	u.Path += project
	u.RawPath = ""
	resp, r := g.fetch(req, e, &u, "application/vnd.pypi.simple.v1+html, text/html;q=0.9")
	if r != nil {
		e.Reason = r.msg
		e.Allowed = e.Allowed && r.status != http.StatusForbidden
		writeRefusal(c, r)
		return false
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	if !strings.Contains(ct, "html") {
		r := &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: the package index answered %q for %s, not an HTML page", ct, &u)}
		e.Reason = r.msg
		writeRefusal(c, r)
		return false
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxIndexPage+1))
	if err != nil || len(body) > maxIndexPage {
		r := &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: reading the package index's page %s failed (at most %d MiB)", &u, maxIndexPage>>20)}
		e.Reason = r.msg
		writeRefusal(c, r)
		return false
	}
	page := rewritePage(resp.Request.URL, body)
	writeHead(c, http.StatusOK, ct, int64(len(page)), req.Close)
	if req.Method == http.MethodGet {
		if _, err := c.Write(page); err != nil {
			return false
		}
	}
	return true
}

// mirrorFile serves a package file from the cache, fetching, verifying and
// storing it first if it is not there.
func (g *Gate) mirrorFile(c *countConn, req *http.Request, e *Entry, rest string) bool {
	fail := func(r *refusal) bool {
		e.Reason = r.msg
		writeRefusal(c, r)
		return false
	}
	parts := strings.SplitN(rest, "/", 4)
	if len(parts) < 4 || !validSum(parts[0]) || (parts[1] != "https" && parts[1] != "http") {
		return fail(&refusal{http.StatusNotFound, "sandloop: not a package file link of the cache (" + MirrorPath + "files/SHA256/SCHEME/HOST/PATH)"})
	}
	sum := parts[0]
	host, err := url.PathUnescape(parts[2]) // (pip quotes the ":" before a port)
	if err != nil {
		host = ""
	}
	u, err := url.Parse(parts[1] + "://" + host + "/" + parts[3])
	if err != nil || host == "" || u.Host != host || u.User != nil || !isPackageFile(path.Base(u.Path)) {
		return fail(&refusal{http.StatusNotFound, "sandloop: the package cache serves only package files (.whl, .tar.gz, .zip)"})
	}
	e.Host, e.Port = urlHostPort(u)
	f, n, hit := g.opts.Cache.get(sum)
	if hit {
		e.Cache = "hit"
		if !g.allowsURLHost(u) { // the file is served only where it may be fetched
			f.Close()
			_, _, r := g.check(g.ctx, e.Host, e.Port)
			if r == nil {
				r = &refusal{http.StatusForbidden, "sandloop: egress to " + e.Host + " is not allowed"}
			}
			return fail(r)
		}
		e.Allowed = true
	} else {
		e.Cache = "miss"
		budget := g.policy.MaxBytes - g.committed.Load()
		if budget <= 0 {
			c.capError.Store(true)
			return fail(&refusal{http.StatusForbidden, fmt.Sprintf("sandloop: the session's cap of %d bytes through the proxy was reached", g.policy.MaxBytes)})
		}
		resp, r := g.fetch(req, e, u, "")
		if r != nil {
			e.Allowed = e.Allowed && r.status != http.StatusForbidden
			return fail(r)
		}
		f, n, err = g.opts.Cache.put(sum, u.String(), resp.Body, budget)
		resp.Body.Close()
		var he *HashError
		switch {
		case errors.As(err, &he):
			return fail(&refusal{http.StatusBadGateway, "sandloop: " + he.Error()})
		case errors.Is(err, errTooLarge):
			c.capError.Store(true)
			return fail(&refusal{http.StatusForbidden, fmt.Sprintf("sandloop: %s is larger than what is left of the session's cap of %d bytes through the proxy", u, g.policy.MaxBytes)})
		case err != nil:
			return fail(&refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: downloading %s failed: %v", u, err)})
		}
	}
	defer f.Close()
	writeHead(c, http.StatusOK, "application/octet-stream", n, req.Close)
	if req.Method == http.MethodHead {
		return true
	}
	m, err := io.CopyBuffer(c, struct{ io.Reader }{f}, make([]byte, 256<<10))
	return err == nil && m == n
}

// writeHead writes a response's status line and headers.
func writeHead(w io.Writer, status int, contentType string, length int64, last bool) {
	conn := ""
	if last {
		conn = "Connection: close\r\n"
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sX-Sandloop-Egress: package-cache\r\n\r\n",
		status, http.StatusText(status), contentType, length, conn)
}

var (
	anchorRE   = regexp.MustCompile(`(?is)<a\s[^>]*>`)
	hrefRE     = regexp.MustCompile(`(?is)(\shref\s*=\s*)("[^"]*"|'[^']*')`)
	metadataRE = regexp.MustCompile(`(?is)\sdata-(?:dist-info|core)-metadata(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]*))?`)
)

// rewritePage points an index page's package links that carry a sha256 at
// the mirror (with the sum in the path, which the server sees, unlike the
// fragment) and makes every other link absolute, to the upstream host (pip
// fetches those through the proxy, uncached). Links to separate metadata
// files (PEP 658) are dropped: pip then reads the wheel itself, cached.
func rewritePage(base *url.URL, page []byte) []byte {
	return anchorRE.ReplaceAllFunc(page, func(a []byte) []byte {
		a = metadataRE.ReplaceAll(a, nil)
		return hrefRE.ReplaceAllFunc(a, func(h []byte) []byte {
			m := hrefRE.FindSubmatch(h)
			q := m[2][0]
			href := html.UnescapeString(string(m[2][1 : len(m[2])-1]))
			return []byte(string(m[1]) + string(q) + html.EscapeString(mirrorLink(base, href)) + string(q))
		})
	})
}

// mirrorLink is where the mirror's page points for href (on page base).
func mirrorLink(base *url.URL, href string) string {
	u, err := base.Parse(href)
	if err != nil {
		return href
	}
	sum, ok := strings.CutPrefix(u.Fragment, "sha256=")
	if ok && validSum(sum) && (u.Scheme == "https" || u.Scheme == "http") && u.User == nil && u.RawQuery == "" && isPackageFile(path.Base(u.Path)) {
		return MirrorPath + "files/" + sum + "/" + u.Scheme + "/" + u.Host + u.EscapedPath() + "#sha256=" + sum
	}
	return u.String()
}
