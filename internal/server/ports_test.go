package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/portproxy"
	"github.com/sandloop/sandloop/internal/session"
)

// appCode starts, in the kernel, an HTTP server on 127.0.0.1:PORT that
// answers with what it was sent (path and headers), and that switches a
// request with "Upgrade: echo" to a raw echo of upper-cased bytes (as a
// WebSocket is switched).
const appCode = `
import threading, http.server, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade") == "echo":
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "echo")
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.connection.recv(1024)
                if not b:
                    break
                self.connection.sendall(b.upper())
            self.close_connection = True
            return
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "headers": dict(self.headers),
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", %d), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
"started"
`

type echoed struct {
	Method, Path, Body string
	Headers            map[string]string
}

func TestPortsReachAnAppInTheSandbox(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{tokenA, tokenB}})
	ts.token = tokenA
	id := ts.create(t, "")
	if r := ts.exec(t, id, fmt.Sprintf(appCode, 8000)); r.Status != "ok" {
		t.Fatalf("start the app: %+v", r)
	}
	_, serverPort, _ := net.SplitHostPort(strings.TrimPrefix(ts.URL, "http://"))

	// The list names the port and both of its routes.
	var list struct {
		Ports []portJSON `json:"ports"`
	}
	if resp := ts.do(t, "GET", "/v1/sessions/"+id+"/ports", "", &list); resp.StatusCode != 200 {
		t.Fatalf("list ports: %d", resp.StatusCode)
	}
	wantHost := fmt.Sprintf("http://8000-%s.localhost:%s/", id, serverPort)
	if len(list.Ports) != 1 || list.Ports[0].Port != 8000 || list.Ports[0].URL != wantHost ||
		!strings.HasSuffix(list.Ports[0].PathURL, "/v1/sessions/"+id+"/ports/8000/") {
		t.Fatalf("ports: %+v (want %s)", list.Ports, wantHost)
	}

	// The native route, with the owner's token: the app sees its own path,
	// the prefix in X-Forwarded-Prefix, and never sandloop's token.
	var got echoed
	resp := ts.do(t, "POST", "/v1/sessions/"+id+"/ports/8000/api/x?q=1", "payload", &got)
	if resp.StatusCode != 200 || got.Method != "POST" || got.Path != "/api/x?q=1" || got.Body != "payload" {
		t.Fatalf("native route: %d %+v", resp.StatusCode, got)
	}
	if _, leaked := got.Headers["Authorization"]; leaked {
		t.Errorf("the app was sent sandloop's token: %v", got.Headers)
	}
	if got.Headers["X-Forwarded-Prefix"] != "/v1/sessions/"+id+"/ports/8000" {
		t.Errorf("X-Forwarded-Prefix: %v", got.Headers)
	}
	// On the API's origin the app's pages are sandboxed (an opaque origin:
	// no reach into the web UI's storage, where its token is).
	if csp := resp.Header.Values("Content-Security-Policy"); !slices.Contains(csp, portproxy.SandboxPolicy) {
		t.Errorf("native route's Content-Security-Policy %q, want %q", csp, portproxy.SandboxPolicy)
	}

	// Another owner's token, or none: refused, saying how to get in.
	for _, tok := range []string{tokenB, ""} {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/sessions/"+id+"/ports/8000/", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp := mustDo(t, http.DefaultClient, req)
		if resp.StatusCode != 403 || errCode(t, resp) != "port_forbidden" {
			t.Errorf("token %q: %d, want 403 port_forbidden", tok, resp.StatusCode)
		}
	}

	// The host route: PORT-ID.localhost, with the app's own paths.
	hostReq := func(client *http.Client, rawURL string, bearer string) (*http.Response, echoed) {
		t.Helper()
		u, _ := url.Parse(rawURL)
		req, _ := http.NewRequest("GET", ts.URL+u.RequestURI(), nil)
		req.Host = u.Host
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp := mustDo(t, client, req)
		var e echoed
		if resp.StatusCode == 200 {
			json.NewDecoder(resp.Body).Decode(&e)
		}
		return resp, e
	}
	if resp, e := hostReq(http.DefaultClient, wantHost+"static/app.js", tokenA); resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") != "" || e.Path != "/static/app.js" {
		t.Fatalf("host route with the token: %d %+v", resp.StatusCode, e)
	}
	if resp, _ := hostReq(http.DefaultClient, wantHost, ""); resp.StatusCode != 403 {
		t.Errorf("host route without a token: %d, want 403", resp.StatusCode)
	}

	// A signed URL: a browser's first visit sets a cookie and drops the
	// parameter; later requests need nothing else; the app sees neither.
	var signed portURLJSON
	if resp := ts.do(t, "POST", "/v1/sessions/"+id+"/previews", `{"port": 8000, "expires_in_s": 60}`, &signed); resp.StatusCode != 201 {
		t.Fatalf("signed url: %d", resp.StatusCode)
	}
	if !strings.HasPrefix(signed.URL, wantHost+"?sandloop_sig=") || time.Until(signed.ExpiresAt) > time.Minute+time.Second {
		t.Fatalf("signed url: %+v", signed)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		// Follow to the same server under the preview's host name.
		req.Host = via[0].Host
		req.URL.Host = strings.TrimPrefix(ts.URL, "http://")
		return nil
	}}
	// The jar keys cookies by the URL's host: use one that says the
	// preview's name, dialled at the test server.
	browser.Transport = &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, strings.TrimPrefix(ts.URL, "http://"))
	}}
	get := func(raw string) (*http.Response, echoed) {
		t.Helper()
		req, _ := http.NewRequest("GET", raw, nil)
		resp := mustDo(t, browser, req)
		var e echoed
		if resp.StatusCode == 200 {
			json.NewDecoder(resp.Body).Decode(&e)
		}
		return resp, e
	}
	if resp, e := get(signed.URL); resp.StatusCode != 200 || e.Path != "/" {
		t.Fatalf("signed url visit: %d %+v", resp.StatusCode, e)
	}
	resp2, e := get(wantHost + "next")
	if resp2.StatusCode != 200 || e.Path != "/next" {
		t.Fatalf("after the signed visit: %d %+v", resp2.StatusCode, e)
	}
	if strings.Contains(e.Headers["Cookie"], "sandloop_port") || strings.Contains(e.Path, "sandloop_sig") {
		t.Errorf("the app saw the grant: %+v", e)
	}
	// A grant is for one port of one session, and cannot be forged.
	tampered := strings.Replace(signed.URL, "8000-", "8001-", 1)
	if resp, _ := hostReq(http.DefaultClient, tampered, ""); resp.StatusCode != 403 {
		t.Errorf("a grant moved to another port: %d, want 403", resp.StatusCode)
	}
	forged := signed.URL[:len(signed.URL)-3] + "AAA"
	if resp, _ := hostReq(http.DefaultClient, forged, ""); resp.StatusCode != 403 {
		t.Errorf("a forged grant: %d, want 403", resp.StatusCode)
	}

	// Nothing listening: 502 that says so.
	resp = ts.do(t, "GET", "/v1/sessions/"+id+"/ports/8001/", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 502 || !strings.Contains(string(b), "nothing is listening") {
		t.Errorf("closed port: %d %s", resp.StatusCode, b)
	}

	// An upgraded connection (as a WebSocket's) passes both ways.
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: 8000-%s.localhost:%s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", id, serverPort, tokenA)
	br := bufio.NewReader(c)
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", up, err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "hello through the proxy")
	buf := make([]byte, len("hello through the proxy"))
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "HELLO THROUGH THE PROXY" {
		t.Fatalf("echo over the upgraded connection: %q %v", buf, err)
	}
}

func TestPublicPortsNeedNoToken(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{tokenA}})
	var s sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions", `{"public_ports": true}`, &s); resp.StatusCode != 201 || !s.PublicPorts {
		t.Fatalf("create: %d %+v", resp.StatusCode, s)
	}
	if r := ts.exec(t, s.ID, fmt.Sprintf(appCode, 5000)); r.Status != "ok" {
		t.Fatalf("start the app: %+v", r)
	}
	req, _ := http.NewRequest("GET", ts.URL+"/hi", nil)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(ts.URL, "http://"))
	req.Host = "5000-" + s.ID + ".localhost:" + port
	resp := mustDo(t, http.DefaultClient, req)
	var e echoed
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != 200 || e.Path != "/hi" {
		t.Fatalf("public port: %d %+v", resp.StatusCode, e)
	}
	// An unknown session under the same form of name: 404, not the API's paths.
	req, _ = http.NewRequest("GET", ts.URL+"/v1/sessions", nil)
	req.Host = "5000-0123456789abcdef.localhost:" + port
	if resp := mustDo(t, http.DefaultClient, req); resp.StatusCode != 404 {
		t.Errorf("unknown session's port: %d, want 404", resp.StatusCode)
	}
}

func mustDo(t *testing.T, c *http.Client, req *http.Request) *http.Response {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestCellHostPortsNeedTheSecret: a cell's host serves only its gateways.
// A session's ports (its host name, the native route, a signed URL, a
// public session's) and every other route are refused without the
// gateway's secret; only the probes stay open.
func TestCellHostPortsNeedTheSecret(t *testing.T) {
	const secret = "cell-secret-0123456789abcdef0123456789"
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the page") })
	ts := newTestServer(t, session.ManagerOptions{}, Options{GatewaySecret: secret, PublicMounts: map[string]http.Handler{"GET /ui/": ui}})
	gw := []string{HeaderGatewaySecret, secret, HeaderOwner, "owner-1"}
	var s sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions", `{"public_ports": true}`, &s, gw...); resp.StatusCode != 201 {
		t.Fatalf("create through the gateway: %d", resp.StatusCode)
	}
	private := ""
	{
		var p sessionJSON
		if resp := ts.do(t, "POST", "/v1/sessions", `{}`, &p, gw...); resp.StatusCode != 201 {
			t.Fatalf("create: %d", resp.StatusCode)
		}
		private = p.ID
	}
	for i, id := range []string{s.ID, private} {
		var r kernel.Result
		body, _ := json.Marshal(map[string]string{"code": fmt.Sprintf(appCode, 5000+i)})
		if resp := ts.do(t, "POST", "/v1/sessions/"+id+"/execute", string(body), &r, gw...); resp.StatusCode != 200 || r.Status != "ok" {
			t.Fatalf("start the app: %d %+v", resp.StatusCode, r)
		}
	}
	var signed portURLJSON
	if resp := ts.do(t, "POST", "/v1/sessions/"+private+"/previews", `{"port": 5001}`, &signed, gw...); resp.StatusCode != 201 {
		t.Fatalf("signed url: %d", resp.StatusCode)
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(ts.URL, "http://"))
	send := func(host, path string, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		if host != "" {
			req.Host = host
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		return mustDo(t, client, req).StatusCode
	}
	publicHost := fmt.Sprintf("5000-%s.localhost:%s", s.ID, port)
	su, _ := url.Parse(signed.URL)
	sp, _ := url.Parse(signed.PathURL)
	for _, c := range []struct {
		name, host, path string
		hdr              []string
	}{
		{"a public session's host name", publicHost, "/", nil},
		{"a public session's host name, probe path", publicHost, "/healthz", nil},
		{"a public session's native route", "", "/v1/sessions/" + s.ID + "/ports/5000/", nil},
		{"a signed URL's host name", su.Host, su.RequestURI(), nil},
		{"a signed URL's native route", "", sp.RequestURI(), nil},
		{"a wrong secret", publicHost, "/", []string{HeaderGatewaySecret, "not-the-secret"}},
		{"the port header without the secret", "", "/", []string{HeaderPortHost, "5000-" + s.ID}},
		{"the web UI", "", "/ui/", nil},
		{"the API description", "", "/openapi.yaml", nil},
		{"E2B's headers", "", "/", []string{"E2b-Sandbox-Id", s.ID, "E2b-Sandbox-Port", "5000"}},
	} {
		if got := send(c.host, c.path, c.hdr...); got != http.StatusUnauthorized {
			t.Errorf("%s without the gateway's secret: %d, want 401", c.name, got)
		}
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if got := send("", p); got != 200 {
			t.Errorf("probe %s: %d, want 200", p, got)
		}
	}
	// Through the gateway (the secret, the port named by HeaderPortHost):
	// a public session's port needs no owner, a signed URL passes, and a
	// private port without either is refused.
	sec := []string{HeaderGatewaySecret, secret}
	if got := send(publicHost, "/", append(sec, HeaderPortHost, "5000-"+s.ID)...); got != 200 {
		t.Errorf("a public port through the gateway: %d, want 200", got)
	}
	if got := send(su.Host, su.RequestURI(), append(sec, HeaderPortHost, "5001-"+private)...); got != http.StatusSeeOther {
		t.Errorf("a signed URL through the gateway: %d, want 303 (the grant becomes a cookie)", got)
	}
	if got := send("", "/", append(sec, HeaderPortHost, "5001-"+private)...); got != 403 {
		t.Errorf("a private port through the gateway without owner or grant: %d, want 403", got)
	}
	if got := send("", "/", append(sec, HeaderPortHost, "5001-"+private, HeaderOwner, "owner-2")...); got != 403 {
		t.Errorf("a private port, another owner: %d, want 403", got)
	}
	if got := send("", "/", append(sec, HeaderPortHost, "5001-"+private, HeaderOwner, "owner-1")...); got != 200 {
		t.Errorf("a private port, its owner: %d, want 200", got)
	}
}
