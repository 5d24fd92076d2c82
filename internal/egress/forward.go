package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// hopHeaders are meant for the proxy, not the server.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization", "Proxy-Authenticate", "Te", "Trailer", "Upgrade"}

// forward serves one plain HTTP request; it reports whether the client's
// connection may carry another.
func (g *Gate) forward(c *countConn, req *http.Request, h head) bool {
	start := time.Now()
	host, port := splitTarget(req)
	e := Entry{Time: start, Method: req.Method, Host: host, Port: port}
	defer g.finish(&e, c, start)
	refuse := func(r *refusal) bool {
		e.Reason = r.msg
		writeRefusal(c, r)
		return false
	}
	switch {
	case req.URL.Scheme == "https":
		return refuse(&refusal{http.StatusBadRequest, "sandloop: for https, the proxy needs CONNECT"})
	case req.URL.Scheme != "http" || req.URL.Host == "":
		return refuse(&refusal{http.StatusBadRequest, "sandloop: this is an HTTP proxy: requests must name an absolute http:// URL (set HTTP_PROXY, as the sandbox's environment does)"})
	}
	// One target per request: a Host header that names another host than
	// the URL (or several) would let a request through for one name and
	// have the server answer for another.
	if hs := h.hosts; len(hs) > 1 || len(hs) == 1 && !strings.EqualFold(strings.TrimSuffix(hs[0], ":80"), strings.TrimSuffix(req.URL.Host, ":80")) {
		return refuse(&refusal{http.StatusBadRequest, "sandloop: the Host header does not match the requested URL"})
	}
	if h.transferEnc && h.contentLength {
		return refuse(&refusal{http.StatusBadRequest, "sandloop: a request may not carry both Content-Length and Transfer-Encoding"})
	}
	ctx, cancel := context.WithCancel(g.ctx) // Close ends a lookup or dial under way
	defer cancel()
	addrs, al, r := g.check(ctx, host, port)
	if r != nil {
		return refuse(r)
	}
	up, err := g.dial(ctx, addrs, port)
	if err != nil {
		return refuse(&refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: could not connect to %s: %v", net.JoinHostPort(host, strconv.Itoa(port)), dialReason(err))})
	}
	defer up.Close()
	e.Addr = up.RemoteAddr().String()
	if r := g.opened(e, c, start, al); r != nil {
		return refuse(r)
	}
	e.Allowed = true
	out := req.Clone(ctx)
	out.RequestURI = ""
	out.Host = req.URL.Host
	out.Close = true // one request per upstream connection: checked per request
	for _, h := range req.Header.Values("Connection") {
		for _, name := range strings.Split(h, ",") {
			out.Header.Del(strings.TrimSpace(name))
		}
	}
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Del("Host")
	up.SetDeadline(time.Now().Add(g.policy.IdleTimeout))
	if err := out.Write(up); err != nil {
		return refuse(&refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: sending the request to %s failed: %v", host, err)})
	}
	resp, err := http.ReadResponse(bufio.NewReader(&idleReader{up, g.policy.IdleTimeout}), req)
	if err != nil {
		return refuse(&refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: no valid response from %s: %v", host, err)})
	}
	defer resp.Body.Close()
	e.Status = resp.StatusCode
	for _, h := range resp.Header.Values("Connection") {
		for _, name := range strings.Split(h, ",") {
			resp.Header.Del(strings.TrimSpace(name))
		}
	}
	for _, h := range hopHeaders {
		resp.Header.Del(h)
	}
	keep := !req.Close
	resp.Close = !keep
	if err := resp.Write(c); err != nil {
		if !c.capError.Load() {
			e.Reason = "cut: " + err.Error()
		}
		return false
	}
	return keep
}

// idleReader extends a connection's read deadline on every read.
type idleReader struct {
	c    net.Conn
	idle time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	r.c.SetReadDeadline(time.Now().Add(r.idle))
	return r.c.Read(p)
}
