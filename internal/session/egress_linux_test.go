package session

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/zygote"
)

// egressWorld is a package index and another HTTPS site, both on this
// machine under test names, with the CA that signed them.
type egressWorld struct {
	ca          *egresstest.CA
	indexPort   int
	otherPort   int
	lookup      egressLookup
	indexURL    string
	otherURL    string
	wheelModule string
}

type egressLookup = func(context.Context, string) ([]netip.Addr, error)

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	w := &egressWorld{ca: egresstest.NewCA(t), wheelModule: "sandloop_egress_demo"}
	wheels := t.TempDir()
	egresstest.BuildWheel(t, wheels, "sandloop-egress-demo", "1.0", "built by the test")
	index := w.ca.Server(t, egresstest.Index(wheels), "pkgs.test")
	other := w.ca.Server(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, "other site") }), "other.test")
	w.indexPort, w.otherPort = egresstest.Port(index), egresstest.Port(other)
	w.lookup = egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}, "rebind.test": {"10.0.0.5"}})
	w.indexURL = fmt.Sprintf("https://pkgs.test:%d/simple/", w.indexPort)
	w.otherURL = fmt.Sprintf("https://other.test:%d/", w.otherPort)
	return w
}

// policy allows the index (and loopback, where the test's servers are:
// refused unless named) plus extra.
func (w *egressWorld) policy(t *testing.T, extra ...string) *egress.Policy {
	al, err := egress.ParseAllowlist(append([]string{"pkgs.test:" + strconv.Itoa(w.indexPort), "rebind.test", "127.0.0.1"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return &egress.Policy{Allow: al}
}

// workspace holds the CA the sandbox's clients must trust.
func (w *egressWorld) workspace(t *testing.T) string {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "ca.pem"), w.ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return ws
}

var caEnv = map[string]string{"PIP_CERT": "/workspace/ca.pem", "SSL_CERT_FILE": "/workspace/ca.pem", "CURL_CA_BUNDLE": "/workspace/ca.pem"}

func (w *egressWorld) pipInstall(t *testing.T, s *Session) *kernel.Result {
	t.Helper()
	code := fmt.Sprintf(`
import subprocess, sys
r = subprocess.run([sys.executable, "-m", "pip", "install", "--index-url", %q, "sandloop-egress-demo"], capture_output=True, text=True)
print("pip exit", r.returncode)
print(r.stdout[-3000:], r.stderr[-3000:])
if r.returncode == 0:
    print(subprocess.run([sys.executable, "-c", "import sandloop_egress_demo as m, os; print('VALUE', m.VALUE, os.path.dirname(m.__file__))"], capture_output=True, text=True).stdout)
`, w.indexURL)
	res, err := s.Execute(context.Background(), kernel.Request{Code: code, Timeout: 120 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// checkAllowMode runs the whole story in one session in allow mode.
func (w *egressWorld) checkAllowMode(t *testing.T, s *Session) {
	t.Helper()
	res := w.pipInstall(t, s)
	if !strings.Contains(res.Stdout, "pip exit 0") || !strings.Contains(res.Stdout, "VALUE built by the test /workspace/.local/lib/python3") {
		t.Fatalf("pip install through the proxy:\n%s\n%s", res.Stdout, res.Stderr)
	}
	res = runCode(t, s, fmt.Sprintf(`
import socket, subprocess, urllib.request
def attempt(f):
    try:
        return "OK " + str(f())
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
print("other:", attempt(lambda: urllib.request.urlopen(%q, timeout=20).read()))
print("rebind:", attempt(lambda: urllib.request.urlopen("https://rebind.test/", timeout=20).read()))
print("metadata:", attempt(lambda: urllib.request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=20).read()))
print("tcp:", attempt(lambda: socket.create_connection(("192.0.2.1", 443), timeout=5)))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("udp:", attempt(lambda: u.connect(("192.0.2.1", 53))))
print("dns:", attempt(lambda: socket.getaddrinfo("pkgs.test", 443)))
print("host loopback:", attempt(lambda: socket.create_connection(("127.0.0.1", %d), timeout=5)))
c = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%%{http_code}", %q], capture_output=True, text=True)
print("curl other:", c.returncode, c.stdout, c.stderr.strip())
c = subprocess.run(["curl", "-sS", %q], capture_output=True, text=True)
print("curl index:", c.returncode, c.stdout.count("sandloop_egress_demo-1.0-"))
`, w.otherURL, w.indexPort, w.otherURL, w.indexURL+"sandloop-egress-demo/"))
	allowed := "allowed: pkgs.test:" + strconv.Itoa(w.indexPort) + ", rebind.test, 127.0.0.1"
	for _, want := range []string{
		"other: URLError: <urlopen error Tunnel connection failed: 403 sandloop: egress to other.test:" + strconv.Itoa(w.otherPort) + " is not allowed; " + allowed,
		"rebind: URLError: <urlopen error Tunnel connection failed: 403 sandloop: egress to rebind.test is refused: 10.0.0.5 is a private network",
		"metadata: HTTPError: HTTP Error 403: sandloop: egress to 169.254.169.254:80 is not allowed",
		"tcp: OSError: [Errno 101] Network is unreachable",
		"udp: OSError: [Errno 101] Network is unreachable",
		"dns: gaierror:",
		"host loopback: ConnectionRefusedError",
		"curl other: 56 000 curl: (56) CONNECT tunnel failed, response 403",
		"curl index: 0 2", // (the file name is the link and its text)
	} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("missing %q in:\n%s", want, res.Stdout)
		}
	}
	l := s.NetworkLog()
	if l == nil {
		t.Fatal("no network log")
	}
	var allowedN, refused int
	for _, e := range l.Entries {
		if e.Allowed {
			allowedN++
		} else {
			refused++
		}
	}
	if allowedN == 0 || refused < 4 || l.Bytes == 0 {
		t.Errorf("log: %d allowed, %d refused, %d bytes: %+v", allowedN, refused, l.Bytes, l.Entries)
	}
}

func TestEgressColdJail(t *testing.T) {
	w := newEgressWorld(t)
	s := newSession(t, Options{Workspace: w.workspace(t), Env: caEnv, Egress: w.policy(t), EgressLookup: w.lookup})
	w.checkAllowMode(t, s)
	// A restarted kernel is served by the same gate (one log, one cap).
	before := len(s.NetworkLog().Entries)
	if err := s.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := runCode(t, s, fmt.Sprintf("import urllib.request\nprint(len(urllib.request.urlopen(%q, timeout=20).read()) > 0)", w.indexURL))
	if strings.TrimSpace(res.Stdout) != "True" {
		t.Fatalf("after restart: %q %q", res.Stdout, res.Stderr)
	}
	// The proxy logs a connection when it ends, which can be just after
	// the code has read its answer: wait for it (bounded).
	for deadline := time.Now().Add(10 * time.Second); len(s.NetworkLog().Entries) <= before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after restart: no new log entry (%d entries)", len(s.NetworkLog().Entries))
		}
	}
}

func TestEgressZygoteFork(t *testing.T) {
	if err := zygote.Supported(); err != nil {
		t.Skipf("no zygote here: %v", err)
	}
	z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	w := newEgressWorld(t)
	s := newSession(t, Options{Workspace: w.workspace(t), Env: caEnv, Egress: w.policy(t), EgressLookup: w.lookup, Zygote: z})
	w.checkAllowMode(t, s)
}

func TestEgressPooledManager(t *testing.T) {
	w := newEgressWorld(t)
	m := NewManager(ManagerOptions{PoolSize: 1, EgressLookup: w.lookup})
	t.Cleanup(func() { m.Close() })
	deadline := time.Now().Add(60 * time.Second)
	for m.Stats().PoolReady == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// A pooled kernel has no proxy: an allow-mode session never takes one.
	ms, err := m.Create(context.Background(), CreateOptions{Egress: w.policy(t), Env: caEnv})
	if err != nil {
		t.Fatal(err)
	}
	if ms.FromPool {
		t.Error("an allow-mode session came from the pool")
	}
	os.WriteFile(filepath.Join(ms.Workspace(), "ca.pem"), w.ca.PEM, 0o644)
	w.checkAllowMode(t, ms.Session)
	// A default session takes the pooled kernel, which has no way out.
	plain, err := m.Create(context.Background(), CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !plain.FromPool {
		t.Error("a default session did not come from the pool")
	}
	if plain.NetworkLog() != nil {
		t.Error("a session without an allowlist has a network log")
	}
}

func TestPipFailsClearlyWithoutTheIndex(t *testing.T) {
	w := newEgressWorld(t)
	t.Run("none", func(t *testing.T) {
		env := map[string]string{"PIP_BREAK_SYSTEM_PACKAGES": "1"} // (allow mode sets it: see egress.Env)
		for k, v := range caEnv {
			env[k] = v
		}
		s := newSession(t, Options{Workspace: w.workspace(t), Env: env})
		res := w.pipInstall(t, s)
		if strings.Contains(res.Stdout, "pip exit 0") || !strings.Contains(res.Stdout, "Failed to establish a new connection") {
			t.Errorf("pip in none mode:\n%s", res.Stdout)
		}
	})
	t.Run("not on the list", func(t *testing.T) {
		al, _ := egress.ParseAllowlist([]string{"other.test"})
		s := newSession(t, Options{Workspace: w.workspace(t), Env: caEnv, Egress: &egress.Policy{Allow: al}, EgressLookup: w.lookup})
		res := w.pipInstall(t, s)
		if strings.Contains(res.Stdout, "pip exit 0") || !strings.Contains(res.Stdout, "sandloop: egress to pkgs.test:"+strconv.Itoa(w.indexPort)+" is not allowed; allowed: other.test") {
			t.Errorf("pip with the index not allowed:\n%s", res.Stdout)
		}
	})
}

func TestEgressSessionLeavesNothing(t *testing.T) {
	w := newEgressWorld(t)
	count := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	// Warm up what is made once per process (the init's cache, pools).
	s0 := newSession(t, Options{Egress: w.policy(t), EgressLookup: w.lookup})
	s0.Close()
	before := count()
	s := newSession(t, Options{Workspace: w.workspace(t), Env: caEnv, Egress: w.policy(t), EgressLookup: w.lookup})
	// A tunnel left open by code that never closes it.
	res := runCode(t, s, fmt.Sprintf(`
import socket
t = socket.create_connection(("127.0.0.1", %d))
t.sendall(b"CONNECT pkgs.test:%d HTTP/1.1\r\n\r\n")
print(t.recv(100).split(b"\r\n")[0].decode())
`, egress.Port, w.indexPort))
	if !strings.Contains(res.Stdout, "200") {
		t.Fatalf("tunnel: %q %q", res.Stdout, res.Stderr)
	}
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for count() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(); n > before {
		t.Errorf("%d descriptors open after the session closed, %d before", n, before)
	}
	_ = jail.DefaultPython
}
