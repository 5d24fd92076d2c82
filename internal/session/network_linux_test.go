package session

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// A running kernel's egress changes with the session's allowlist: an
// HTTPS site under a .invalid name on this machine is refused, allowed
// after an update, refused again after the next; a socket the kernel holds
// open to it is cut when it leaves the list.
func TestSetAllowlistReachesTheRunningKernel(t *testing.T) {
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the site") }), "site.invalid")
	port := egresstest.Port(srv)
	site := "site.invalid:" + strconv.Itoa(port)
	// A raw TCP echo on loopback, under another name, for a socket held open.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 64)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					c.Write(b[:n])
				}
			}()
		}
	}()
	echoTarget := "echo.invalid:" + strconv.Itoa(echo.Addr().(*net.TCPAddr).Port)
	lookup := egresstest.Resolver(map[string][]string{"site.invalid": {"127.0.0.1"}, "echo.invalid": {"127.0.0.1"}})
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "ca.pem"), ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	// Loopback, where the test's servers are, is dialable only with an
	// address entry; the names are what the updates add and remove.
	start, err := egress.ParseAllowlist([]string{"127.0.0.1", echoTarget})
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, Options{Workspace: ws, Env: map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem"},
		Egress: &egress.Policy{Allow: start}, EgressLookup: lookup})
	fetch := func() string {
		t.Helper()
		res := runCode(t, s, fmt.Sprintf(`
import urllib.request
try:
    print(urllib.request.urlopen("https://%s/", timeout=20).read().decode())
except Exception as e:
    print(type(e).__name__, e)`, site))
		return strings.TrimSpace(res.Stdout + res.Stderr)
	}
	set := func(entries ...string) {
		t.Helper()
		al, err := egress.ParseAllowlist(entries)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetAllowlist(al); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(s.Allowlist().Entries(), ","); got != strings.Join(entries, ",") {
			t.Fatalf("Allowlist %s, want %v", got, entries)
		}
	}
	if got := fetch(); !strings.Contains(got, "Tunnel connection failed: 403 sandloop: egress to "+site+" is not allowed") {
		t.Fatalf("before the update: %q", got)
	}
	// A tunnel to the echo server the kernel keeps open across updates.
	runCode(t, s, fmt.Sprintf(`
import socket
held = socket.create_connection(("127.0.0.1", %d))
held.settimeout(20)
held.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n")
ans = b""
while b"\r\n\r\n" not in ans:
    ans += held.recv(1)
assert b" 200 " in ans, ans
def ping():
    try:
        held.sendall(b"ping")
        return held.recv(4).decode() or "closed"
    except OSError as e:
        return type(e).__name__`, egress.Port, echoTarget, echoTarget))
	ping := func() string {
		t.Helper()
		return strings.TrimSpace(runCode(t, s, "print(ping())").Stdout)
	}
	if got := ping(); got != "ping" {
		t.Fatalf("held tunnel: %q", got)
	}
	set("127.0.0.1", echoTarget, site)
	if got := fetch(); got != "hello from the site" {
		t.Fatalf("after allowing the site: %q", got)
	}
	if got := ping(); got != "ping" {
		t.Fatalf("held tunnel, still allowed, after an update: %q", got)
	}
	set("127.0.0.1")
	if got := fetch(); !strings.Contains(got, "403 sandloop: egress to "+site+" is not allowed; allowed: 127.0.0.1") {
		t.Fatalf("after removing the site: %q", got)
	}
	if got := ping(); got == "ping" {
		t.Fatalf("held tunnel to a target taken off the list: %q", got)
	}
	// (The entry is logged as the tunnel ends, just after the code sees it.)
	testutil.WaitFor(t, 10*time.Second, func() error {
		for _, e := range s.NetworkLog().Entries {
			if e.Host == "echo.invalid" && e.Reason == "cut: the session's allowlist no longer allows "+echoTarget {
				return nil
			}
		}
		return fmt.Errorf("no cut logged: %+v", s.NetworkLog().Entries)
	})

	// A session without a proxy has no allowlist to change.
	plain := newSession(t, Options{Workspace: t.TempDir()})
	if err := plain.SetAllowlist(start); !errors.Is(err, ErrNoEgress) || plain.Allowlist() != nil {
		t.Errorf("a session without a proxy: %v, %v", err, plain.Allowlist())
	}
}
