package session

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/zygote"
	"golang.org/x/sys/unix"
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
	wheel       string       // the wheel's path on the host
	fileGets    atomic.Int32 // requests for files at the index
}

type egressLookup = func(context.Context, string) ([]netip.Addr, error)

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	w := &egressWorld{ca: egresstest.NewCA(t), wheelModule: "sandloop_egress_demo"}
	wheels := t.TempDir()
	w.wheel = egresstest.BuildWheel(t, wheels, "sandloop-egress-demo", "1.0", "built by the test")
	ix := egresstest.Index(wheels)
	index := w.ca.Server(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/files/") {
			w.fileGets.Add(1)
		}
		ix.ServeHTTP(rw, r)
	}), "pkgs.test")
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
	return w.pipInstallFrom(t, s, w.indexURL)
}

// pipInstallFrom installs the test's package from index ("": pip's
// default, which PIP_INDEX_URL sets).
func (w *egressWorld) pipInstallFrom(t *testing.T, s *Session, index string) *kernel.Result {
	t.Helper()
	args := `"sandloop-egress-demo"`
	if index != "" {
		args = fmt.Sprintf("%q, %q", "--index-url", index) + ", " + args
	}
	code := fmt.Sprintf(`
import subprocess, sys
r = subprocess.run([sys.executable, "-m", "pip", "install", %s], capture_output=True, text=True)
print("pip exit", r.returncode)
print(r.stdout[-3000:], r.stderr[-3000:])
if r.returncode == 0:
    print(subprocess.run([sys.executable, "-c", "import sandloop_egress_demo as m, os; print('VALUE', m.VALUE, os.path.dirname(m.__file__))"], capture_output=True, text=True).stdout)
`, args)
	res, err := s.Execute(context.Background(), kernel.Request{Code: code, Timeout: pipTimeout(t, s)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// pipTimeout bounds one pip install in s: two minutes, or more where pip
// starts slowly (an emulated machine is 10-50 times slower than this one):
// 60 times pip's own start (`pip --version`, ~0.5 s here), measured in s.
func pipTimeout(t *testing.T, s *Session) time.Duration {
	t.Helper()
	start := time.Now()
	res, err := s.Execute(context.Background(), kernel.Request{Code: "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', '--version'], capture_output=True)", Timeout: 10 * time.Minute}, nil)
	if err != nil || res.Status != kernel.StatusOK {
		t.Fatalf("pip --version: %v %+v", err, res)
	}
	return max(2*time.Minute, 60*time.Since(start))
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
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := len(s.NetworkLog().Entries); n <= before {
			return fmt.Errorf("after restart: no new log entry (%d entries)", n)
		}
		return nil
	})
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
	// A pooled kernel forked from the zygote, its listener on standby,
	// armed as an allow-mode session takes it.
	ws := w.workspace(t)
	p := newSession(t, Options{Workspace: ws, Zygote: z, EgressStandby: true})
	if err := p.ArmEgress(context.Background(), w.policy(t), w.lookup, nil); err != nil {
		t.Fatal(err)
	}
	runCode(t, p, fmt.Sprintf("import os\nos.environ.update(%s)", pyDict(caEnv)))
	w.checkAllowMode(t, p)
}

// pyDict writes m as a Python dict literal.
func pyDict(m map[string]string) string {
	out := "{"
	for k, v := range m {
		out += fmt.Sprintf("%q: %q, ", k, v)
	}
	return out + "}"
}

func TestEgressPooledManager(t *testing.T) {
	w := newEgressWorld(t)
	m := NewManager(&ManagerOptions{PoolSize: 1, EgressLookup: w.lookup, RefillDelay: time.Millisecond})
	t.Cleanup(func() { m.Close() })
	waitPool := func() {
		t.Helper()
		testutil.WaitFor(t, 60*time.Second, poolReady(m))
	}
	// A pooled kernel holds the proxy's listener on standby: an
	// allow-mode session takes one and arms it.
	waitPool()
	ms, err := m.Create(context.Background(), CreateOptions{Egress: w.policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !ms.FromPool {
		t.Error("an allow-mode session did not come from the pool")
	}
	os.WriteFile(filepath.Join(ms.Workspace(), "ca.pem"), w.ca.PEM, 0o644)
	runCode(t, ms.Session, fmt.Sprintf("import os\nos.environ.update(%s)", pyDict(caEnv)))
	w.checkAllowMode(t, ms.Session)
	// Its restarted kernel is served by the same gate.
	if err := ms.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := runCode(t, ms.Session, "import os, urllib.request\ntry:\n    urllib.request.urlopen('http://example.invalid/', timeout=20)\nexcept Exception as e:\n    print(os.environ.get('HTTP_PROXY'), e)")
	if !strings.Contains(res.Stdout, "http://127.0.0.1:3128 HTTP Error 403: sandloop: egress to example.invalid is not allowed; allowed: pkgs.test") {
		t.Errorf("after a restart: %q %q", res.Stdout, res.Stderr)
	}
	// A default session takes the next pooled kernel, whose listener is
	// closed: nothing answers on the proxy's port, which the code may use.
	// It stops listening even while another descriptor of it is open, as
	// in a child this process forks at that moment (the pool starts the
	// next kernel at once: a copy of every descriptor until it executes):
	// the test holds one of each pooled kernel's listener.
	waitPool()
	var copies []int
	m.mu.Lock()
	for _, s := range m.pool {
		s.mu.Lock()
		if ln, ok := s.standby.(syscall.Conn); ok {
			rc, err := ln.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			rc.Control(func(fd uintptr) {
				// Close-on-exec, as every descriptor of the server: a
				// copy without it would outlive the exec of the next
				// jail's init and be held there for its whole life.
				if c, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
					copies = append(copies, c)
				}
			})
		}
		s.mu.Unlock()
	}
	m.mu.Unlock()
	if len(copies) == 0 {
		t.Fatal("no pooled kernel holds a listener on standby")
	}
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
	res = runCode(t, plain.Session, fmt.Sprintf(`
import os, socket
print("proxy vars:", [k for k in os.environ if "proxy" in k.lower()])
try:
    socket.create_connection(("127.0.0.1", %d), timeout=5)
    print("connected")
except Exception as e:
    print(type(e).__name__)
`, egress.Port))
	if want := "proxy vars: []\nConnectionRefusedError\n"; res.Stdout != want {
		t.Errorf("a none-mode pooled session: %q %q, want %q", res.Stdout, res.Stderr, want)
	}
	// Its port is free for the code once no descriptor of the old socket
	// is left: the test's copies closed, and a child being forked (above)
	// past its exec, within milliseconds.
	for _, c := range copies {
		syscall.Close(c)
	}
	res = runCode(t, plain.Session, fmt.Sprintf(`
import time
for _ in range(500):
    try:
        s = socket.socket(); s.bind(("127.0.0.1", %d)); s.listen(); print("bound"); break
    except OSError:
        s.close(); time.sleep(0.01)`, egress.Port))
	if res.Stdout != "bound\n" {
		t.Errorf("a none-mode pooled session binding the proxy's port: %q %q %+v", res.Stdout, res.Stderr, res.Error)
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
		// The tunnels' splice(2) pipes wait in the runtime's pool until a
		// collection empties it (their finalizers close them).
		runtime.GC()
		runtime.GC()
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
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := count(); n > before {
			ents, _ := os.ReadDir("/proc/self/fd")
			var l []string
			for _, e := range ents {
				d, _ := os.Readlink("/proc/self/fd/" + e.Name())
				l = append(l, e.Name()+"="+d)
			}
			return fmt.Errorf("%d descriptors open after the session closed, %d before: %v", n, before, l)
		}
		return nil
	})
}

// poolReady says whether m has a pooled kernel ready, for WaitFor.
func poolReady(m *Manager) func() error {
	return func() error {
		if m.Stats().PoolReady == 0 {
			return errors.New("no pooled kernel is ready")
		}
		return nil
	}
}

// cacheEntries returns a session's log entries for package files.
func cacheEntries(s *Session) []egress.Entry {
	var out []egress.Entry
	for _, e := range s.NetworkLog().Entries {
		if e.Cache == "hit" || e.Cache == "miss" {
			out = append(out, e)
		}
	}
	return out
}

// waitCacheEntries waits (bounded) for n package file entries in s's log.
func waitCacheEntries(t *testing.T, s *Session, n int) []egress.Entry {
	t.Helper()
	var got []egress.Entry
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got = cacheEntries(s); len(got) < n {
			return fmt.Errorf("%d package file entries, want %d: %+v", len(got), n, got)
		}
		return nil
	})
	return got
}

func TestWheelCacheServesTheSecondSession(t *testing.T) {
	w := newEgressWorld(t)
	cache, err := egress.OpenCache(&egress.CacheOptions{Dir: t.TempDir(), Index: w.indexURL, RootCAs: w.ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(w.wheel)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	wheelSum := hex.EncodeToString(sum[:])

	// The first session may also reach another site, which it uses to try
	// to plant its own bytes under the wheel's sum, and it tries to write.
	// (No CA in the sandbox: pip speaks plain HTTP to the host's cache.)
	s1 := newSession(t, Options{Egress: w.policy(t, "other.test:"+strconv.Itoa(w.otherPort)), EgressLookup: w.lookup, EgressCache: cache})
	res := runCode(t, s1, fmt.Sprintf(`
import os, urllib.request, urllib.error
base = os.environ["PIP_INDEX_URL"].replace("/simple/", "/files/")
def attempt(req):
    try:
        return "OK %%d" %% urllib.request.urlopen(req, timeout=60).status
    except urllib.error.HTTPError as e:
        return "%%d %%s" %% (e.code, e.read().decode().strip())
print("plant:", attempt(base + %q + "/https/other.test:%d/files/sandloop_egress_demo-1.0-py3-none-any.whl"))
print("put:", attempt(urllib.request.Request(base + %q + "/https/pkgs.test:%d/files/sandloop_egress_demo-1.0-py3-none-any.whl", data=b"planted", method="PUT")))
`, wheelSum, w.otherPort, wheelSum, w.indexPort))
	for _, want := range []string{
		"plant: 502 sandloop: the file at https://other.test:" + strconv.Itoa(w.otherPort) + "/files/sandloop_egress_demo-1.0-py3-none-any.whl does not match the sha256 its index gave",
		"put: 405 sandloop: the package cache is read-only",
	} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("missing %q in:\n%s\n%s", want, res.Stdout, res.Stderr)
		}
	}
	if st := cache.Stats(); st.Files != 0 {
		t.Fatalf("the sandbox's attempts left files in the cache: %+v", st)
	}

	for i, s := range []*Session{s1, newSession(t, Options{Egress: w.policy(t), EgressLookup: w.lookup, EgressCache: cache})} {
		before := len(cacheEntries(s))
		res := w.pipInstallFrom(t, s, "")
		if !strings.Contains(res.Stdout, "pip exit 0") || !strings.Contains(res.Stdout, "VALUE built by the test") {
			t.Fatalf("session %d: pip install from the cache:\n%s\n%s\n%+v", i+1, res.Stdout, res.Stderr, s.NetworkLog().Entries)
		}
		got := waitCacheEntries(t, s, before+1)[before:]
		want := []string{"miss", "hit"}[i]
		if len(got) != 1 || got[0].Cache != want || !got[0].Allowed || got[0].Host != "pkgs.test" || got[0].BytesIn < int64(len(b)) {
			t.Errorf("session %d: package file entries %+v, want one %q", i+1, got, want)
		}
	}
	if n := w.fileGets.Load(); n != 1 {
		t.Errorf("the index served the wheel %d times, want 1", n)
	}
	if st := cache.Stats(); st.Files != 1 || st.Hits != 1 {
		t.Errorf("cache: %+v", st)
	}
}

// BenchmarkWheelCache measures pip installing the same package in two new
// sessions sharing the host's package cache: the first fetches the wheel
// from the index (and stores it), the second is served from the cache. The
// index is on loopback and sends at most -wheel-cache-upstream MiB/s (a
// remote index is never as fast as loopback; default 4, a modest link; 0:
// unthrottled), and the wheel is about 6 MiB. It reports both medians and the ratio, same run.
func BenchmarkWheelCache(b *testing.B) {
	ca := egresstest.NewCA(b)
	wheels := b.TempDir()
	whl := egresstest.BuildWheel(b, wheels, "sandloop-cache-bench", "1.0", randomText(8<<20))
	ix := egresstest.Index(wheels)
	rate := *wheelCacheUpstream << 20
	srv := ca.Server(b, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if rate > 0 && strings.HasPrefix(r.URL.Path, "/files/") {
			rw = &throttled{ResponseWriter: rw, rate: rate, start: time.Now()}
		}
		ix.ServeHTTP(rw, r)
	}), "pkgs.test")
	port := egresstest.Port(srv)
	lookup := egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}})
	al, err := egress.ParseAllowlist([]string{"pkgs.test:" + strconv.Itoa(port), "127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(whl)
	install := func(cache *egress.Cache) time.Duration {
		s, err := New(context.Background(), &Options{Egress: &egress.Policy{Allow: al}, EgressLookup: lookup, EgressCache: cache})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		start := time.Now()
		res, err := s.Execute(context.Background(), kernel.Request{Code: `import subprocess, sys
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-compile", "sandloop-cache-bench"], capture_output=True, text=True)
print("pip exit", r.returncode, r.stderr[-2000:])`, Timeout: 300 * time.Second}, nil)
		d := time.Since(start)
		if err != nil || !strings.Contains(res.Stdout, "pip exit 0") {
			b.Fatalf("pip install: %v %s %s", err, res.Stdout, res.Stderr)
		}
		return d
	}
	var first, second []time.Duration
	b.ResetTimer()
	for range b.N {
		cache, err := egress.OpenCache(&egress.CacheOptions{Dir: b.TempDir(), Index: fmt.Sprintf("https://pkgs.test:%d/simple/", port), RootCAs: ca.Pool()})
		if err != nil {
			b.Fatal(err)
		}
		first = append(first, install(cache))
		second = append(second, install(cache))
		if st := cache.Stats(); st.Hits != 1 || st.Misses != 1 {
			b.Fatalf("cache: %+v", st)
		}
	}
	b.StopTimer()
	f, s := median(first), median(second)
	b.ReportMetric(float64(f.Milliseconds()), "first-ms")
	b.ReportMetric(float64(s.Milliseconds()), "cached-ms")
	b.ReportMetric(f.Seconds()/s.Seconds(), "first/cached")
	b.Logf("pip install of a %.1f MiB wheel in a new session, median of %d, index at %d MiB/s (0: loopback, unthrottled): first %s, from the cache %s (%.2fx faster)",
		float64(fi.Size())/(1<<20), b.N, *wheelCacheUpstream, f.Round(time.Millisecond), s.Round(time.Millisecond), f.Seconds()/s.Seconds())
}

var wheelCacheUpstream = flag.Int64("wheel-cache-upstream", 4, "BenchmarkWheelCache: the index's speed in MiB/s (0: unthrottled loopback)")

// randomText is n bytes of incompressible text.
func randomText(n int) string {
	b := make([]byte, n/4*3)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// throttled sends at most rate bytes a second.
type throttled struct {
	http.ResponseWriter
	rate  int64
	start time.Time
	sent  int64
}

func (t *throttled) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		m, err := t.ResponseWriter.Write(p[:k])
		n += m
		t.sent += int64(m)
		if err != nil {
			return n, err
		}
		p = p[k:]
		if ahead := time.Duration(float64(t.sent)/float64(t.rate)*float64(time.Second)) - time.Since(t.start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	return n, nil
}

// BenchmarkCreateAllow measures creating a session and running its first
// cell (1+1) through a Manager with a warm pool of one: in none mode (a
// pooled kernel), in allow mode (a pooled kernel, its proxy armed as it is
// handed out), and in allow mode as it was before pooled kernels held a
// listener: a kernel started for it, cold or (as root) forked from a
// zygote, as serve does by default. Same run; medians and ratios.
func BenchmarkCreateAllow(b *testing.B) {
	al, err := egress.ParseAllowlist([]string{"pkgs.test"})
	if err != nil {
		b.Fatal(err)
	}
	pol := &egress.Policy{Allow: al}
	var z Zygote
	if os.Getuid() == 0 {
		zy, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { zy.Close() })
		z = zy
	}
	m := NewManager(&ManagerOptions{PoolSize: 1, Zygote: z}) // (the refill waits 250ms: it does not compete with the first cell)
	b.Cleanup(func() { m.Close() })
	unpooled := NewManager(&ManagerOptions{Zygote: z})
	b.Cleanup(func() { unpooled.Close() })
	ctx := context.Background()
	measure := func(m *Manager, opts CreateOptions, pooled bool) time.Duration {
		if pooled {
			testutil.WaitFor(b, 60*time.Second, poolReady(m))
		}
		start := time.Now()
		ms, err := m.Create(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		res, err := ms.Execute(ctx, kernel.Request{Code: "1+1"}, nil)
		d := time.Since(start)
		if err != nil || res.MainResult()["text/plain"] != "2" || ms.FromPool != pooled {
			b.Fatalf("1+1: %+v %v (from the pool: %v)", res, err, ms.FromPool)
		}
		m.Delete("", ms.ID())
		return d
	}
	var none, allow, before []time.Duration
	b.ResetTimer()
	for range b.N {
		none = append(none, measure(m, CreateOptions{}, true))
		allow = append(allow, measure(m, CreateOptions{Egress: pol}, true))
		before = append(before, measure(unpooled, CreateOptions{Egress: pol}, false))
	}
	b.StopTimer()
	n, a, c := median(none), median(allow), median(before)
	how := "cold"
	if z != nil {
		how = "forked from the zygote"
	}
	b.ReportMetric(float64(n.Microseconds())/1e3, "none-pooled-ms")
	b.ReportMetric(float64(a.Microseconds())/1e3, "allow-pooled-ms")
	b.ReportMetric(float64(c.Microseconds())/1e3, "allow-unpooled-ms")
	b.ReportMetric(a.Seconds()/n.Seconds(), "allow/none")
	b.ReportMetric(c.Seconds()/a.Seconds(), "unpooled/pooled")
	b.Logf("create + first 1+1, median of %d: none mode from the pool %s; allow mode from the pool (armed) %s (%.2fx none); allow mode %s as before %s (%.1fx the pooled)",
		b.N, n.Round(time.Microsecond), a.Round(time.Microsecond), a.Seconds()/n.Seconds(), how, c.Round(time.Microsecond), c.Seconds()/a.Seconds())
}
