package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExecAllowThroughTheProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "from the host") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	// (Loopback is listed by address: it is refused otherwise. The proxy
	// variables leave 127.0.0.1 alone, so the code names the proxy.)
	code := `
import http.client, os
def get(url):
    c = http.client.HTTPConnection(os.environ["HTTP_PROXY"][len("http://"):])
    c.request("GET", url)
    r = c.getresponse()
    return r.status, r.reason, r.read().decode().strip()
print(get("http://` + ln.Addr().String() + `/"))
print(get("http://192.0.2.7/"))
`
	rc, out, errOut := sandloop(t, "", "exec", "--allow", ln.Addr().String(), "--stats", "-c", code)
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errOut)
	}
	if !strings.Contains(out, "(200, 'OK', 'from the host')") || !strings.Contains(out, "(403, 'sandloop: egress to 192.0.2.7:80 is not allowed; allowed: "+ln.Addr().String()) {
		t.Errorf("stdout: %q", out)
	}
	if !strings.Contains(errOut, "sandloop: network: 2 connections") || !strings.Contains(errOut, "refused GET 192.0.2.7:80") {
		t.Errorf("stderr: %q", errOut)
	}
	if rc, _, errOut := sandloop(t, "", "exec", "--allow", "pypi", "--network", "-c", "1"); rc != 2 || !strings.Contains(errOut, "--allow and --network exclude each other") {
		t.Errorf("--allow with --network: %d %q", rc, errOut)
	}
	if rc, _, errOut := sandloop(t, "", "exec", "--allow", "exa mple", "-c", "1"); rc != 2 || !strings.Contains(errOut, "not a host name") {
		t.Errorf("bad --allow: %d %q", rc, errOut)
	}
}

// --allow localhost:PORT reaches the host's port at host.sandloop.internal
// (with every client that honours the proxy variables), says so at the start,
// and leaves localhost inside the sandbox the sandbox's own.
func TestExecAllowHostLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "the host's service") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	code := `
import urllib.request, urllib.error
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return "HTTP %d" % e.code
    except OSError as e:
        return type(e).__name__ + ": " + str(getattr(e, "reason", e))
print("host:", get("http://host.sandloop.internal:` + port + `/"))
print("own:", get("http://localhost:` + port + `/"))
print("other:", get("http://host.sandloop.internal:1/"))
`
	rc, out, errOut := sandloop(t, "", "exec", "--allow", "localhost:"+port, "-c", code)
	if rc != 0 {
		t.Fatalf("exit %d: %s\n%s", rc, out, errOut)
	}
	for _, want := range []string{"host: the host's service\n", "own: URLError: [Errno 111] Connection refused", "other: HTTP 403"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "sandloop: note: --allow: inside the sandbox, localhost and 127.0.0.1 are the sandbox's own loopback") || !strings.Contains(errOut, "host.sandloop.internal:"+port) {
		t.Errorf("no note at the start: %q", errOut)
	}
}

func TestOpenWheelCache(t *testing.T) {
	data := t.TempDir()
	c, err := openWheelCache("", data, 1<<20, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	fi, err := os.Stat(filepath.Join(data, "wheel-cache"))
	if st.Dir != filepath.Join(data, "wheel-cache") || st.MaxBytes != 1<<20 || err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("default cache: %+v, %v %v", st, fi, err)
	}
	if c, err := openWheelCache("off", data, 1<<20, "", nil); c != nil || err != nil {
		t.Errorf("off: %v %v", c, err)
	}
	for _, bad := range []struct {
		size  int64
		index string
		want  string
	}{{0, "", "--wheel-cache-size must be positive"}, {1 << 20, "ftp://x/simple/", "must be an http(s) URL"}} {
		if _, err := openWheelCache("", data, bad.size, bad.index, nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("size %d index %q: %v, want %q", bad.size, bad.index, err, bad.want)
		}
	}
}
