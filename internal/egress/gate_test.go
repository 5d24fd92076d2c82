package egress_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// startGate serves a gate on a host loopback listener (in a session it
// serves a listener on the jail's loopback instead).
func startGate(t *testing.T, allow []string, names map[string][]string, tweak func(*egress.Policy)) (*egress.Gate, string) {
	t.Helper()
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		t.Fatal(err)
	}
	p := egress.Policy{Allow: al}
	if tweak != nil {
		tweak(&p)
	}
	g := egress.New(&egress.Options{Policy: p, LookupIP: egresstest.Resolver(names)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.Serve(ln)
	t.Cleanup(func() { g.Close() })
	return g, ln.Addr().String()
}

// waitLog waits until the gate has logged n complete entries (a tunnel's
// is complete when it ends, just after its client sees the end; until
// then it is listed as Open).
func waitLog(t *testing.T, g *egress.Gate, n int) egress.Log {
	t.Helper()
	var l egress.Log
	testutil.WaitFor(t, 10*time.Second, func() error {
		l = g.Log()
		complete := 0
		for _, e := range l.Entries {
			if !e.Open {
				complete++
			}
		}
		if complete < n {
			return fmt.Errorf("%d complete log entries, want %d: %+v", complete, n, l.Entries)
		}
		return nil
	})
	return l
}

// A connection under way is in the log (open, with its bytes so far), not
// only once it has ended: a sandbox holding a tunnel open is seen.
func TestOpenConnectionIsLogged(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := echo.Addr().(*net.TCPAddr).Port
	g, proxy := startGate(t, []string{"echo.test:" + strconv.Itoa(port), "127.0.0.1"}, map[string][]string{"echo.test": {"127.0.0.1"}}, nil)
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test:%d\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, " 200 ") {
		t.Fatalf("CONNECT: %q", line)
	}
	for line, _ := br.ReadString('\n'); line != "\r\n"; line, _ = br.ReadString('\n') {
		if line == "" {
			t.Fatal("no end of the CONNECT answer")
		}
	}
	io.WriteString(c, "ping\n")
	if got, _ := br.ReadString('\n'); got != "ping\n" {
		t.Fatalf("echo: %q", got)
	}
	l := g.Log()
	if len(l.Entries) != 1 || !l.Entries[0].Open || !l.Entries[0].Allowed || l.Entries[0].Host != "echo.test" || l.Entries[0].BytesIn < 5 || l.Active != 1 {
		t.Fatalf("while the tunnel is open: %+v", l)
	}
	c.Close()
	l = waitLog(t, g, 1)
	if len(l.Entries) != 1 || l.Entries[0].Open || !l.Entries[0].Allowed || l.Entries[0].BytesIn < 5 {
		t.Fatalf("after the tunnel ended: %+v", l.Entries)
	}
}

func client(ca *egresstest.CA, proxy string) *http.Client {
	u, _ := url.Parse("http://" + proxy)
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, DisableKeepAlives: true,
	}}
}

// connect sends a CONNECT and returns the status line.
func connect(t *testing.T, proxy, target string) string {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// raw sends bytes and returns the whole answer.
func raw(t *testing.T, proxy, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestHTTPSThroughTheGate(t *testing.T) {
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+r.Host) }), "pkgs.test")
	port := egresstest.Port(srv)
	// Loopback is refused unless an address entry covers it: the test
	// server lives there.
	g, proxy := startGate(t, []string{"pkgs.test:" + strconv.Itoa(port), "127.0.0.1"}, map[string][]string{"pkgs.test": {"127.0.0.1"}}, nil)
	resp, err := client(ca, proxy).Get(fmt.Sprintf("https://pkgs.test:%d/x", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("hello from pkgs.test:%d", port); string(body) != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	l := waitLog(t, g, 1)
	if len(l.Entries) != 1 || !l.Entries[0].Allowed || l.Entries[0].Method != "CONNECT" || l.Entries[0].Host != "pkgs.test" || l.Entries[0].BytesIn == 0 || l.Entries[0].BytesOut == 0 {
		t.Fatalf("log: %+v", l.Entries)
	}
	if l.Bytes != l.Entries[0].BytesIn+l.Entries[0].BytesOut {
		t.Errorf("total %d != the entry's %d+%d", l.Bytes, l.Entries[0].BytesIn, l.Entries[0].BytesOut)
	}
}

// Bytes the gate could not deliver, because the sandbox's side reset the
// connection, are not counted: the total stays the sum of the entries, and
// the session's cap is not charged for them.
func TestResetConnectionCountsWhatWasSent(t *testing.T) {
	src, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	go func() {
		c, err := src.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Small writes, paced: the gate's read-and-write path (a full
		// buffer would take its bulk path).
		chunk := bytes.Repeat([]byte("x"), 4000)
		for i := 0; i < 20000; i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	port := src.Addr().(*net.TCPAddr).Port
	g, proxy := startGate(t, []string{"src.test:" + strconv.Itoa(port), "127.0.0.1"}, map[string][]string{"src.test": {"127.0.0.1"}}, nil)
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT src.test:%d HTTP/1.1\r\nHost: src.test:%d\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, " 200 ") {
		t.Fatalf("CONNECT: %q", line)
	}
	// Read no more: once the buffers between are full, the gate's write
	// to the sandbox's side blocks with bytes taken from the cap.
	last, since := int64(-1), time.Now()
	testutil.WaitFor(t, 20*time.Second, func() error {
		l := g.Log()
		if len(l.Entries) != 1 || !l.Entries[0].Open {
			return fmt.Errorf("log: %+v", l.Entries)
		}
		if in := l.Entries[0].BytesIn; in != last {
			last, since = in, time.Now()
		}
		if time.Since(since) < 300*time.Millisecond {
			return fmt.Errorf("still sending: %d bytes", last)
		}
		return nil
	})
	c.(*net.TCPConn).SetLinger(0) // a reset, not a close
	c.Close()
	l := waitLog(t, g, 1)
	if l.Entries[0].BytesIn == 0 {
		t.Fatalf("log: %+v", l.Entries)
	}
	if l.Bytes != l.Entries[0].BytesIn+l.Entries[0].BytesOut {
		t.Errorf("total %d != the entry's %d+%d", l.Bytes, l.Entries[0].BytesIn, l.Entries[0].BytesOut)
	}
}

func TestRefusals(t *testing.T) {
	names := map[string][]string{
		"loop.test": {"127.0.0.1"}, "ten.test": {"10.0.0.5"}, "meta.test": {"169.254.169.254"}, "v6loop.test": {"::1"},
		"ula.test": {"fd00::5"}, "cgnat.test": {"100.64.1.1"}, "mapped.test": {"::ffff:127.0.0.1"}, "nat64.test": {"64:ff9b::a00:5"},
		"mixed.test": {"10.1.1.1", "192.168.0.1"},
	}
	allow := []string{"pypi", "*.test"}
	_, proxy := startGate(t, allow, names, nil)
	for _, c := range []struct{ target, want string }{
		{"example.com:443", "403 sandloop: egress to example.com is not allowed; allowed: pypi.org, files.pythonhosted.org, *.test"},
		{"pypi.org:22", "egress to pypi.org:22 is not allowed"},
		{"loop.test:443", "403 sandloop: egress to loop.test is refused: 127.0.0.1 is loopback (this host)"},
		{"ten.test:443", "10.0.0.5 is a private network"},
		{"meta.test:443", "169.254.169.254 is the cloud metadata endpoint"},
		{"v6loop.test:443", "::1 is loopback"},
		{"ula.test:443", "fd00::5 is a private network"},
		{"cgnat.test:443", "carrier-grade NAT"},
		{"mapped.test:443", "127.0.0.1 is loopback"},
		{"nat64.test:443", "64:ff9b::a00:5 is a private network"},
		{"mixed.test:443", "10.1.1.1 is a private network"},
		{"nowhere.test:443", "502 sandloop: nowhere.test could not be resolved"},
		{"127.0.0.1:3128", "egress to 127.0.0.1:3128 is not allowed"}, // the proxy's own port
		{"169.254.169.254:80", "egress to 169.254.169.254:80 is not allowed"},
		{"[::1]:443", "egress to [::1]:443 is not allowed"},
	} {
		if got := connect(t, proxy, c.target); !strings.Contains(got, c.want) {
			t.Errorf("CONNECT %s: %q, want %q", c.target, got, c.want)
		}
	}
	// Plain HTTP is held to the same list.
	if got := raw(t, proxy, "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n"); !strings.Contains(got, "403 sandloop: egress to example.com is not allowed") {
		t.Errorf("plain GET: %q", got)
	}
}

func TestSandloopsOwnServiceIsRefusedEvenWithLoopbackAllowed(t *testing.T) {
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	ap := netip.MustParseAddrPort(api.Addr().String())
	_, proxy := startGate(t, []string{"127.0.0.0/8", "api.test:*"}, map[string][]string{"api.test": {"127.0.0.1"}}, func(p *egress.Policy) {
		p.Deny = []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port())}
	})
	for _, target := range []string{api.Addr().String(), "api.test:" + strconv.Itoa(int(ap.Port()))} {
		if got := connect(t, proxy, target); !strings.Contains(got, "sandloop's own service") {
			t.Errorf("CONNECT %s: %q", target, got)
		}
	}
}

func TestHeaderSmuggling(t *testing.T) {
	hits := make(chan string, 10)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits <- r.Host + r.URL.Path; io.WriteString(w, "ok") })}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go up.Serve(ln)
	defer up.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_, proxy := startGate(t, []string{"web.test:" + port, "127.0.0.1"}, map[string][]string{"web.test": {"127.0.0.1"}, "evil.test": {"127.0.0.1"}}, nil)
	target := "http://web.test:" + port
	// Allowed, to show the setup works.
	if got := raw(t, proxy, "GET "+target+"/a HTTP/1.1\r\nHost: web.test:"+port+"\r\nConnection: close\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("allowed request: %q", got)
	}
	if h := <-hits; h != "web.test:"+port+"/a" {
		t.Fatalf("upstream saw %q", h)
	}
	for _, c := range []struct{ name, req, want string }{
		{"another Host header", "GET " + target + "/b HTTP/1.1\r\nHost: evil.test:" + port + "\r\n\r\n", "400 sandloop: the Host header does not match"},
		{"two Host headers", "GET " + target + "/b HTTP/1.1\r\nHost: web.test:" + port + "\r\nHost: evil.test\r\n\r\n", "400"},
		{"both lengths", "POST " + target + "/b HTTP/1.1\r\nHost: web.test:" + port + "\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n\r\n", "400"},
		{"origin form", "GET /b HTTP/1.1\r\nHost: web.test:" + port + "\r\n\r\n", "400 sandloop: this is an HTTP proxy"},
		{"https without CONNECT", "GET https://web.test:" + port + "/b HTTP/1.1\r\nHost: web.test:" + port + "\r\n\r\n", "400 sandloop: for https, the proxy needs CONNECT"},
		{"a second request for another host on the same connection", "GET " + target + "/c HTTP/1.1\r\nHost: web.test:" + port + "\r\n\r\nGET http://evil.test:" + port + "/d HTTP/1.1\r\nHost: evil.test:" + port + "\r\n\r\n", "403 sandloop: egress to evil.test:" + port + " is not allowed"},
	} {
		if got := raw(t, proxy, c.req); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	close(hits)
	for h := range hits {
		if h != "web.test:"+port+"/c" {
			t.Errorf("a smuggled request reached the server: %q", h)
		}
	}
}

func TestByteCapCutsADownload(t *testing.T) {
	ca := egresstest.NewCA(t)
	big := bytes.Repeat([]byte("x"), 8<<20)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(big) }), "big.test")
	port := egresstest.Port(srv)
	g, proxy := startGate(t, []string{"big.test:" + strconv.Itoa(port), "127.0.0.1"}, map[string][]string{"big.test": {"127.0.0.1"}}, func(p *egress.Policy) { p.MaxBytes = 1 << 20 })
	resp, err := client(ca, proxy).Get(fmt.Sprintf("https://big.test:%d/", port))
	var n int64
	if err == nil {
		n, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatalf("the download of %d bytes went through a 1 MiB cap (%d read)", len(big), n)
	}
	l := g.Log()
	if l.Bytes > 1<<20+(256<<10) {
		t.Errorf("%d bytes went through a cap of %d", l.Bytes, 1<<20)
	}
	l = waitLog(t, g, 1)
	if len(l.Entries) != 1 || !strings.Contains(l.Entries[0].Reason, "cap of 1048576 bytes") {
		t.Fatalf("log: %+v", l.Entries)
	}
	// The cap is the session's: later connections are cut at once.
	if _, err := client(ca, proxy).Get(fmt.Sprintf("https://big.test:%d/", port)); err == nil {
		t.Error("a connection after the cap went through")
	}
}

func TestConnectionCap(t *testing.T) {
	hold, _ := net.Listen("tcp", "127.0.0.1:0")
	defer hold.Close()
	go func() {
		for {
			c, err := hold.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	port := strconv.Itoa(hold.Addr().(*net.TCPAddr).Port)
	_, proxy := startGate(t, []string{"hold.test:" + port, "127.0.0.1"}, map[string][]string{"hold.test": {"127.0.0.1"}}, func(p *egress.Policy) { p.MaxConns = 1 })
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT hold.test:%s HTTP/1.1\r\n\r\n", port)
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.Contains(line, "200") {
		t.Fatalf("first tunnel: %q", line)
	}
	if got := connect(t, proxy, "hold.test:"+port); !strings.Contains(got, "503 sandloop: too many connections through the proxy (at most 1 at once)") {
		t.Fatalf("second tunnel: %q", got)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), "pkgs.test")
	port := egresstest.Port(srv)
	before := runtime.NumGoroutine()
	al, _ := egress.ParseAllowlist([]string{"pkgs.test:" + strconv.Itoa(port), "127.0.0.1"})
	g := egress.New(&egress.Options{Policy: egress.Policy{Allow: al}, LookupIP: egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}})})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	g.Serve(ln)
	// One tunnel left open by its client, one finished.
	open, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	fmt.Fprintf(open, "CONNECT pkgs.test:%d HTTP/1.1\r\n\r\n", port)
	bufio.NewReader(open).ReadString('\n')
	if _, err := client(ca, ln.Addr().String()).Get(fmt.Sprintf("https://pkgs.test:%d/", port)); err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the listener still accepts after Close")
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before+2 { // (the client's idle transport may linger)
			buf := make([]byte, 1<<16)
			return fmt.Errorf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		return nil
	})
}

// Close ends a connection still being set up rather than waiting out
// its lookup's timeout (DialTimeout, an hour here).
func TestCloseEndsALookup(t *testing.T) {
	for _, req := range []string{
		"CONNECT hang.invalid:443 HTTP/1.1\r\nHost: hang.invalid:443\r\n\r\n",
		"GET http://hang.invalid/ HTTP/1.1\r\nHost: hang.invalid\r\n\r\n",
	} {
		t.Run(strings.Fields(req)[0], func(t *testing.T) {
			asked := make(chan struct{}, 1)
			hang := func(ctx context.Context, host string) ([]netip.Addr, error) {
				asked <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			}
			closeWhileBusy(t, []string{"hang.invalid"}, hang, req, asked)
		})
	}
}

// closeWhileBusy sends req through a gate allowing allow, waits until
// lookup has been asked (it sends on asked), and checks that Close then
// returns although the gate's DialTimeout is an hour.
func closeWhileBusy(t *testing.T, allow []string, lookup func(context.Context, string) ([]netip.Addr, error), req string, asked <-chan struct{}) {
	t.Helper()
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		t.Fatal(err)
	}
	g := egress.New(&egress.Options{Policy: egress.Policy{Allow: al, DialTimeout: time.Hour}, LookupIP: lookup})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.Serve(ln)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		g.Close()
		t.Fatal("the gate never looked the name up")
	}
	closed := make(chan struct{})
	go func() {
		g.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits for a connection being set up")
	}
}

func TestParseAllowlist(t *testing.T) {
	t.Parallel()
	if _, err := egress.ParseAllowlist([]string{"*.example.org", "a.example.org:8443", "10.0.0.0/8", "[fd00::1]:80", "1.2.3.4", "pypi", "x.org:*"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "exa mple.org", "example.org:0", "example.org:http", "*.*.org", "10.0.0.0/99", "ex*ample.org"} {
		if _, err := egress.ParseAllowlist([]string{bad}); err == nil {
			t.Errorf("%q was accepted", bad)
		} else if !strings.Contains(err.Error(), "preset") {
			t.Errorf("%q: the error does not say what to write: %v", bad, err)
		}
	}
	if _, err := egress.ParseMode("internet"); err == nil {
		t.Error("mode internet accepted")
	}
}

func TestWildcards(t *testing.T) {
	t.Parallel()
	names := map[string][]string{}
	_, proxy := startGate(t, []string{"*.example.org", "exact.test:8443"}, names, nil)
	for _, c := range []struct {
		target  string
		allowed bool
	}{
		{"a.example.org:443", true}, {"a.b.example.org:80", true}, {"example.org:443", false}, {"badexample.org:443", false},
		{"a.example.org:8080", false}, {"exact.test:8443", true}, {"exact.test:443", false}, {"EXACT.test.:8443", true},
	} {
		got := connect(t, proxy, c.target)
		// Allowed names get as far as the resolver (which knows none).
		if allowed := strings.Contains(got, "could not be resolved"); allowed != c.allowed {
			t.Errorf("%s: %q (allowed: %v)", c.target, got, c.allowed)
		}
	}
}

// TestByteCapIsExact downloads past the cap through several tunnels at
// once: together they deliver exactly the cap (their CONNECT requests and
// answers included), not a step more.
func TestByteCapIsExact(t *testing.T) {
	blob := bytes.Repeat([]byte("y"), 1<<20)
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for range 64 {
					if _, err := c.Write(blob); err != nil {
						return
					}
				}
			}()
		}
	}()
	target := up.Addr().String()
	const limit = 10<<20 + 12345
	g, proxy := startGate(t, []string{target}, nil, func(p *egress.Policy) { p.MaxBytes = limit })
	const tunnels = 3
	got := make(chan int64, tunnels)
	for range tunnels {
		go func() {
			c, err := net.Dial("tcp", proxy)
			if err != nil {
				got <- -1
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			req := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			io.WriteString(c, req)
			n, _ := io.Copy(io.Discard, c) // the answer's head and the payload, until the cut
			got <- int64(len(req)) + n
		}()
	}
	var sum int64
	for range tunnels {
		n := <-got
		if n < 0 {
			t.Fatal("dial failed")
		}
		sum += n
	}
	// Every tunnel is logged, also one whose request came once the cap was
	// used up (under load the last may; its request was not read).
	l := waitLog(t, g, tunnels)
	if l.Bytes != limit {
		t.Errorf("the log counts %d bytes, the cap is %d", l.Bytes, limit)
	}
	var logged int64
	for _, e := range l.Entries {
		logged += e.BytesOut + e.BytesIn
		if !strings.Contains(e.Reason, "cap of") {
			t.Errorf("entry not cut by the cap: %+v", e)
		}
	}
	if logged != limit {
		t.Errorf("the tunnels moved %d bytes through a cap of %d (%+d)", logged, limit, logged-limit)
	}
	// What the clients sent and received is at most that: a request the
	// gate did not read is all that may differ.
	if sum < limit || sum > limit+int64(tunnels)*64 {
		t.Errorf("the clients saw %d bytes through a cap of %d (%+d)", sum, limit, sum-limit)
	}
}

// A listed localhost:PORT (or 127.0.0.1:PORT) is the host's loopback, reached
// through the proxy at host.sandloop.internal (localhost inside the sandbox is
// the sandbox's own); other ports stay refused, and a server's clients may
// list it only where the server allows the address.
func TestHostLoopbackByName(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := strconv.Itoa(echo.Addr().(*net.TCPAddr).Port)
	_, proxy := startGate(t, []string{"localhost:" + port}, nil, nil)
	for _, target := range []string{egress.HostName + ":" + port, "localhost:" + port} {
		if got := connect(t, proxy, target); !strings.Contains(got, " 200 ") {
			t.Errorf("CONNECT %s: %q", target, got)
		}
	}
	if got := connect(t, proxy, egress.HostName+":1"); !strings.Contains(got, "403 sandloop: egress to "+egress.HostName+":1 (the host's loopback) is not allowed; allowed: localhost:"+port) {
		t.Errorf("another port: %q", got)
	}
	// Without a loopback entry the name reaches nothing.
	_, other := startGate(t, []string{"pypi"}, nil, nil)
	if got := connect(t, other, egress.HostName+":"+port); !strings.Contains(got, "403 ") {
		t.Errorf("no loopback entry: %q", got)
	}

	al, err := egress.ParseAllowlist([]string{"pypi", "localhost:" + port, "127.0.0.1:9000"})
	if err != nil {
		t.Fatal(err)
	}
	note := al.HostNote()
	if !strings.Contains(note, egress.HostName+":"+port+", "+egress.HostName+":9000") || !strings.Contains(note, "sandbox's own loopback") {
		t.Errorf("HostNote: %q", note)
	}
	if n := egress.HostNote([]string{"pypi", "example.org:8000"}); n != "" {
		t.Errorf("HostNote without loopback entries: %q", n)
	}
	if err := al.Within(nil); err == nil || !strings.Contains(err.Error(), "localhost:"+port) {
		t.Errorf("a server without maxima let a client list its loopback: %v", err)
	}
}
