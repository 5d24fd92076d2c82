package egress_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
)

// cacheWorld is a package index on loopback (pkgs.test) serving one
// distribution file, another allowed site (evil.test) serving different
// bytes under the same file name, and a cache shared by the gates it makes.
type cacheWorld struct {
	ca        *egresstest.CA
	cache     *egress.Cache
	file      []byte
	sum       string
	fileGets  atomic.Int32 // requests for the file at the index
	indexPort int
	evilPort  int
}

const demoWheel = "demo-1.0-py3-none-any.whl"

func newCacheWorld(t *testing.T, maxBytes int64) *cacheWorld {
	t.Helper()
	w := &cacheWorld{ca: egresstest.NewCA(t), file: make([]byte, 300<<10)}
	rand.Read(w.file)
	s := sha256.Sum256(w.file)
	w.sum = hex.EncodeToString(s[:])
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, demoWheel), w.file, 0o644); err != nil {
		t.Fatal(err)
	}
	index := egresstest.Index(dir)
	srv := w.ca.Server(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/files/") {
			w.fileGets.Add(1)
		}
		index.ServeHTTP(rw, r)
	}), "pkgs.test")
	evil := w.ca.Server(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, "not the wheel the index promised")
	}), "evil.test")
	w.indexPort, w.evilPort = egresstest.Port(srv), egresstest.Port(evil)
	var err error
	w.cache, err = egress.OpenCache(&egress.CacheOptions{Dir: t.TempDir(), MaxBytes: maxBytes, RootCAs: w.ca.Pool(),
		Index: fmt.Sprintf("https://pkgs.test:%d/simple/", w.indexPort)})

	if err != nil {
		t.Fatal(err)
	}
	return w
}

// gate starts a gate (a session's) sharing the world's cache.
func (w *cacheWorld) gate(t *testing.T, allow ...string) (*egress.Gate, string) {
	t.Helper()
	al, err := egress.ParseAllowlist(append(allow, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	g := egress.New(&egress.Options{Policy: egress.Policy{Allow: al}, Cache: w.cache,
		LookupIP: egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}, "evil.test": {"127.0.0.1"}})})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.Serve(ln)
	t.Cleanup(func() { g.Close() })
	return g, ln.Addr().String()
}

func (w *cacheWorld) index() string { return "pkgs.test:" + strconv.Itoa(w.indexPort) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var linkRE = regexp.MustCompile(`href="([^"]+)"`)

// fileLink reads the project's page from the gate's mirror and returns its
// one file link.
func fileLink(t *testing.T, proxy string) string {
	t.Helper()
	status, page := get(t, "http://"+proxy+egress.MirrorPath+"simple/demo/")
	links := linkRE.FindAllStringSubmatch(page, -1)
	if status != 200 || len(links) != 1 {
		t.Fatalf("the mirror's page: %d %s", status, page)
	}
	return links[0][1]
}

// entry waits for the gate's nth log entry (written when the request is
// done, possibly just after the client has its answer) and returns it.
func entry(t *testing.T, g *egress.Gate, n int) egress.Entry {
	t.Helper()
	l := waitLog(t, g, n)
	if len(l.Entries) < n {
		t.Fatalf("%d log entries, want %d: %+v", len(l.Entries), n, l.Entries)
	}
	return l.Entries[n-1]
}

func TestCacheServesTheSecondSessionWithoutTheIndex(t *testing.T) {
	w := newCacheWorld(t, 0)
	g1, p1 := w.gate(t, w.index())
	if env := g1.PipEnv(egress.Port); len(env) != 1 || env[0] != "PIP_INDEX_URL=http://127.0.0.1:3128"+egress.MirrorPath+"simple/" {
		t.Fatalf("PipEnv: %q", env)
	}
	link := fileLink(t, p1)
	want := fmt.Sprintf("%sfiles/%s/https/%s/files/%s#sha256=%s", egress.MirrorPath, w.sum, w.index(), demoWheel, w.sum)
	if link != want {
		t.Fatalf("link %q, want %q", link, want)
	}
	if e := entry(t, g1, 1); e.Cache != "index" || !e.Allowed || e.Host != "pkgs.test" || e.Status != 200 {
		t.Errorf("page entry: %+v", e)
	}
	status, body := get(t, "http://"+p1+strings.Split(link, "#")[0])
	if status != 200 || body != string(w.file) {
		t.Fatalf("first download: %d, %d bytes", status, len(body))
	}
	if e := entry(t, g1, 2); e.Cache != "miss" || !e.Allowed || e.BytesIn < int64(len(w.file)) {
		t.Errorf("first download's entry: %+v", e)
	}

	g2, p2 := w.gate(t, w.index())
	status, body = get(t, "http://"+p2+strings.Split(fileLink(t, p2), "#")[0])
	if status != 200 || body != string(w.file) {
		t.Fatalf("second download: %d, %d bytes", status, len(body))
	}
	if e := entry(t, g2, 2); e.Cache != "hit" || !e.Allowed || e.BytesIn < int64(len(w.file)) {
		t.Errorf("second download's entry: %+v", e)
	}
	if n := w.fileGets.Load(); n != 1 {
		t.Errorf("the index served the file %d times, want 1", n)
	}
	if st := w.cache.Stats(); st.Files != 1 || st.Bytes != int64(len(w.file)) || st.Hits != 1 || st.Misses != 1 {
		t.Errorf("stats: %+v", st)
	}

	// A session whose allowlist does not cover the file's host is not
	// served it from the cache either.
	g3, p3 := w.gate(t, "evil.test:"+strconv.Itoa(w.evilPort))
	if env := g3.PipEnv(egress.Port); env != nil {
		t.Errorf("PipEnv without the index allowed: %q", env)
	}
	status, body = get(t, "http://"+p3+strings.Split(link, "#")[0])
	if status != 403 || !strings.Contains(body, "sandloop: egress to pkgs.test:"+strconv.Itoa(w.indexPort)+" is not allowed") {
		t.Errorf("a session without the index: %d %q", status, body)
	}
}

func TestCacheCannotBePoisonedFromASandbox(t *testing.T) {
	w := newCacheWorld(t, 0)
	evil := "evil.test:" + strconv.Itoa(w.evilPort)
	g, p := w.gate(t, w.index(), evil)
	base := "http://" + p + egress.MirrorPath + "files/"
	// The sandbox names the real file's sum with a URL of a site it
	// controls: the host downloads it, the bytes do not match, nothing is kept.
	status, body := get(t, base+w.sum+"/https/"+evil+"/files/"+demoWheel)
	if status != 502 || !strings.Contains(body, "does not match the sha256 its index gave") {
		t.Errorf("a file that is not what its sum says: %d %q", status, body)
	}
	if e := entry(t, g, 1); e.Cache != "miss" || !strings.Contains(e.Reason, "does not match") {
		t.Errorf("entry: %+v", e)
	}
	// Writing is not a thing the cache does.
	req, _ := http.NewRequest(http.MethodPut, base+w.sum+"/https/"+w.index()+"/files/"+demoWheel, strings.NewReader("planted"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || !strings.Contains(string(b), "read-only") {
		t.Errorf("PUT: %d %q", resp.StatusCode, b)
	}
	// Nor does it keep what is not a package file.
	status, body = get(t, base+w.sum+"/https/"+evil+"/files/x.txt")
	if status != 404 || !strings.Contains(body, "only package files") {
		t.Errorf("not a package: %d %q", status, body)
	}
	if st := w.cache.Stats(); st.Files != 0 {
		t.Fatalf("the cache kept something: %+v", st)
	}
	// Another session gets the real file.
	_, p2 := w.gate(t, w.index())
	status, body = get(t, "http://"+p2+strings.Split(fileLink(t, p2), "#")[0])
	if status != 200 || body != string(w.file) {
		t.Errorf("after the attempt: %d, %d bytes", status, len(body))
	}
}

func TestCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{}
	var order []string
	for range 3 {
		b := make([]byte, 100<<10)
		rand.Read(b)
		s := sha256.Sum256(b)
		sum := hex.EncodeToString(s[:])
		files[sum] = b
		order = append(order, sum)
	}
	srv := http.NewServeMux()
	srv.HandleFunc("/f/", func(rw http.ResponseWriter, r *http.Request) {
		rw.Write(files[strings.TrimSuffix(filepath.Base(r.URL.Path), ".whl")])
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	up := ln.Addr().String()
	c, err := egress.OpenCache(&egress.CacheOptions{Dir: dir, MaxBytes: 250 << 10, Index: "http://" + up + "/simple/"})
	if err != nil {
		t.Fatal(err)
	}
	al, _ := egress.ParseAllowlist([]string{up})
	g := egress.New(&egress.Options{Policy: egress.Policy{Allow: al}, Cache: c})
	pl, _ := net.Listen("tcp", "127.0.0.1:0")
	g.Serve(pl)
	t.Cleanup(func() { g.Close() })
	n := 0
	fetch := func(sum string) egress.Entry {
		t.Helper()
		n++
		status, body := get(t, "http://"+pl.Addr().String()+egress.MirrorPath+"files/"+sum+"/http/"+up+"/f/"+sum+".whl")
		if status != 200 || body != string(files[sum]) {
			t.Fatalf("%s: %d %q", sum, status, body[:min(len(body), 200)])
		}
		return entry(t, g, n)
	}
	fetch(order[0])
	fetch(order[1])
	time.Sleep(10 * time.Millisecond)
	if e := fetch(order[0]); e.Cache != "hit" { // order[1] is now the least recently used
		t.Fatalf("entry: %+v", e)
	}
	time.Sleep(10 * time.Millisecond)
	fetch(order[2]) // 300 KiB > 250 KiB: one goes
	st := c.Stats()
	if st.Files != 2 || st.Evictions != 1 || st.Bytes > st.MaxBytes {
		t.Fatalf("stats: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, "files", order[1][:2], order[1])); !os.IsNotExist(err) {
		t.Errorf("the least recently used file is still there: %v", err)
	}
	// A cache opened again on the directory finds what is there.
	c2, err := egress.OpenCache(&egress.CacheOptions{Dir: dir, MaxBytes: 250 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if st2 := c2.Stats(); st2.Files != 2 || st2.Bytes != st.Bytes {
		t.Errorf("reopened: %+v", st2)
	}
}
