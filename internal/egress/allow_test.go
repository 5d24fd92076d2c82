package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// echoServer accepts connections on loopback and echoes them; it returns
// the port.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// tunnelTo opens a CONNECT tunnel through proxy to target, or returns the
// refusal's status line.
func tunnelTo(t *testing.T, proxy, target string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	status, _ := br.ReadString('\n')
	for line, _ := br.ReadString('\n'); line != "\r\n" && line != ""; line, _ = br.ReadString('\n') {
	}
	if !strings.Contains(status, " 200 ") {
		c.Close()
		return nil, nil, strings.TrimSpace(status)
	}
	return c, br, ""
}

// echoes reports whether a tunnel still carries bytes both ways.
func echoes(c net.Conn, br *bufio.Reader) bool {
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return false
	}
	got, err := br.ReadString('\n')
	return err == nil && got == "ping\n"
}

func parse(t *testing.T, entries ...string) *egress.Allowlist {
	t.Helper()
	al, err := egress.ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return al
}

// SetAllow changes what a gate lets through while it serves: new
// connections are judged by the new list, connections under way to what
// it no longer allows are cut (and logged so), the others go on.
func TestSetAllowLive(t *testing.T) {
	port := echoServer(t)
	p := strconv.Itoa(port)
	a, b := "a.invalid:"+p, "b.invalid:"+p
	names := map[string][]string{"a.invalid": {"127.0.0.1"}, "b.invalid": {"127.0.0.1"}}
	// 127.0.0.1 (an address entry) makes loopback dialable for the names.
	g, proxy := startGate(t, []string{a, "127.0.0.1"}, names, nil)

	if _, _, refused := tunnelTo(t, proxy, b); !strings.Contains(refused, "403 sandloop: egress to "+b+" is not allowed; allowed: "+a+", 127.0.0.1") {
		t.Fatalf("b before the update: %q", refused)
	}
	ca, cabr, refused := tunnelTo(t, proxy, a)
	if refused != "" || !echoes(ca, cabr) {
		t.Fatalf("a: %q", refused)
	}

	g.SetAllow(parse(t, a, b, "127.0.0.1"))
	cb, cbbr, refused := tunnelTo(t, proxy, b)
	if refused != "" || !echoes(cb, cbbr) {
		t.Fatalf("b after it was allowed: %q", refused)
	}
	if !echoes(ca, cabr) {
		t.Fatal("the tunnel to a, still allowed, was disturbed by the update")
	}

	g.SetAllow(parse(t, b, "127.0.0.1"))
	if echoes(ca, cabr) {
		t.Fatal("the tunnel to a still carries bytes after a left the list")
	}
	if !echoes(cb, cbbr) {
		t.Fatal("the tunnel to b, still allowed, was cut")
	}
	if _, _, refused := tunnelTo(t, proxy, a); !strings.Contains(refused, "403 sandloop: egress to "+a+" is not allowed; allowed: "+b+", 127.0.0.1") {
		t.Fatalf("a after it left the list: %q", refused)
	}
	// Plain HTTP is judged per request by the list in force.
	if got := raw(t, proxy, "GET http://"+a+"/ HTTP/1.1\r\nHost: "+a+"\r\n\r\n"); !strings.Contains(got, "403 sandloop: egress to "+a+" is not allowed") {
		t.Errorf("plain GET to a: %q", got)
	}

	// Without the address entry, loopback is no longer dialable: the
	// tunnel to b (by a name that resolves there) is cut too.
	g.SetAllow(parse(t, b))
	if echoes(cb, cbbr) {
		t.Fatal("the tunnel to b, dialled at a loopback address the list no longer covers, still carries bytes")
	}
	var l egress.Log
	testutil.WaitFor(t, 10*time.Second, func() error {
		l = g.Log()
		cuts := map[string]string{}
		for _, e := range l.Entries {
			if strings.HasPrefix(e.Reason, "cut: ") && e.Allowed && !e.Open {
				cuts[e.Host] = e.Reason
			}
		}
		if cuts["a.invalid"] != "cut: the session's allowlist no longer allows "+a ||
			cuts["b.invalid"] != "cut: 127.0.0.1 is loopback (this host), which the session's allowlist no longer covers" {
			return fmt.Errorf("cuts logged: %q", cuts)
		}
		return nil
	})
	if strings.Join(l.Allow, ",") != b || strings.Join(g.Allowlist().Entries(), ",") != b {
		t.Errorf("the log's allowlist %v, Allowlist %v, want [%s]", l.Allow, g.Allowlist().Entries(), b)
	}
}

// An HTTPS site under a test name: refused, allowed after an update,
// refused again after the next.
func TestSetAllowHTTPS(t *testing.T) {
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }), "site.invalid")
	site := "site.invalid:" + strconv.Itoa(egresstest.Port(srv))
	g, proxy := startGate(t, []string{"127.0.0.1"}, map[string][]string{"site.invalid": {"127.0.0.1"}}, nil)
	get := func() string {
		resp, err := client(ca, proxy).Get("https://" + site + "/")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for i, c := range []struct {
		allow []string
		want  string
	}{
		{nil, "egress to " + site + " is not allowed"},
		{[]string{site, "127.0.0.1"}, "hello"},
		{[]string{"127.0.0.1"}, "egress to " + site + " is not allowed"},
		{[]string{}, "allowed: nothing"},
	} {
		if c.allow != nil {
			g.SetAllow(parse(t, c.allow...))
		}
		if got := get(); !strings.Contains(got, c.want) {
			t.Errorf("step %d (allow %v): %q, want %q", i, c.allow, got, c.want)
		}
	}
	g.SetAllow(nil) // nil allows nothing
	if got := get(); !strings.Contains(got, "allowed: nothing") {
		t.Errorf("nil allowlist: %q", got)
	}
}
