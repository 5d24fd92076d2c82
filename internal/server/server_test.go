package server

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"

	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
	"gopkg.in/yaml.v3"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

const tokenA, tokenB = "token-aaaaaaaaaaaaaaaa", "token-bbbbbbbbbbbbbbbb"

type testServer struct {
	*httptest.Server
	mgr   *session.Manager
	srv   *Server
	token string
}

func newTestServer(t *testing.T, mo session.ManagerOptions, so Options) *testServer {
	t.Helper()
	mgr := session.NewManager(&mo)
	so.Manager = mgr
	srv, err := New(&so)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.Close()
		if err := mgr.Close(); err != nil {
			t.Errorf("manager close: %v", err)
		}
	})
	ts := &testServer{Server: hs, mgr: mgr, srv: srv}
	if len(so.Tokens) > 0 {
		ts.token = so.Tokens[0]
	}
	return ts
}

// do sends a request and decodes a JSON response into out (if not nil).
func (ts *testServer) do(t *testing.T, method, path, body string, out any, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if ts.token != "" {
		req.Header.Set("Authorization", "Bearer "+ts.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp
}

func (ts *testServer) create(t *testing.T, body string) string {
	t.Helper()
	var s sessionJSON
	resp := ts.do(t, "POST", "/v1/sessions", body, &s)
	if resp.StatusCode != 201 || s.ID == "" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	return s.ID
}

func (ts *testServer) exec(t *testing.T, id, code string) kernel.Result {
	t.Helper()
	var r kernel.Result
	body, _ := json.Marshal(map[string]string{"code": code})
	resp := ts.do(t, "POST", "/v1/sessions/"+id+"/execute", string(body), &r)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("execute: %d %s", resp.StatusCode, b)
	}
	return r
}

func errCode(t *testing.T, resp *http.Response) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("not a JSON error: %q", b)
	}
	return e.Error.Code
}

func TestSessionLifecycleAndState(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{PoolSize: 1}, Options{})
	id := ts.create(t, "")
	if r := ts.exec(t, id, "x = 20\nx + 22"); r.Status != "ok" || r.MainResult()["text/plain"] != "42" || r.ExecutionCount != 1 {
		t.Fatalf("first execute: %+v", r)
	}
	if r := ts.exec(t, id, "print(x); 1/0"); r.Status != "error" || r.Stdout != "20\n" || r.Error == nil || r.Error.Name != "ZeroDivisionError" {
		t.Fatalf("error is a result: %+v", r)
	}
	var list struct{ Sessions []sessionJSON }
	ts.do(t, "GET", "/v1/sessions", "", &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != id || list.Sessions[0].Status != "ready" {
		t.Errorf("list: %+v", list)
	}
	var got sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions/"+id+"/restart", "", &got); resp.StatusCode != 200 {
		t.Fatalf("restart: %d", resp.StatusCode)
	}
	if r := ts.exec(t, id, "'x' in globals()"); r.MainResult()["text/plain"] != "False" {
		t.Errorf("state after restart: %+v", r)
	}
	if resp := ts.do(t, "DELETE", "/v1/sessions/"+id, "", nil); resp.StatusCode != 204 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "GET", "/v1/sessions/"+id, "", nil); resp.StatusCode != 404 || errCode(t, resp) != "not_found" {
		t.Errorf("get after delete: %d", resp.StatusCode)
	}
}

// readStream reads NDJSON or SSE events until the end event.
func readStream(t *testing.T, r io.Reader, sse bool) []map[string]any {
	t.Helper()
	var events []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if sse {
			if !strings.HasPrefix(line, "data: ") {
				continue
			}
			line = strings.TrimPrefix(line, "data: ")
		}
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("bad event %q: %v", line, err)
		}
		events = append(events, e)
		if e["type"] == "end" {
			break
		}
	}
	return events
}

func TestStreamingNDJSONAndSSE(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Keepalive: 100 * time.Millisecond})
	id := ts.create(t, "")
	code := `import time, sys
print("one", flush=True)
time.sleep(0.5)
print("two", file=sys.stderr, flush=True)
7*6`
	for _, c := range []struct {
		accept, ctype string
		sse           bool
	}{{"application/x-ndjson", "application/x-ndjson", false}, {"text/event-stream", "text/event-stream", true}} {
		body, _ := json.Marshal(map[string]string{"code": code})
		req, _ := http.NewRequest("POST", ts.URL+"/v1/sessions/"+id+"/execute", bytes.NewReader(body))
		req.Header.Set("Accept", c.accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Content-Type") != c.ctype {
			t.Errorf("content type %q", resp.Header.Get("Content-Type"))
		}
		events := readStream(t, resp.Body, c.sse)
		resp.Body.Close()
		var types []string
		keepalives := 0
		for _, e := range events {
			if e["type"] == "keepalive" {
				if len(types) == 1 { // during the sleep after "one"
					keepalives++
				}
				continue
			}
			types = append(types, e["type"].(string))
		}
		if strings.Join(types, ",") != "stdout,stderr,result,end" || keepalives == 0 {
			t.Errorf("%s: event types %v with %d keepalives during the sleep", c.accept, types, keepalives)
		}
		if last := events[len(events)-1]; last["status"] != "ok" {
			t.Errorf("end event %v", last)
		}
	}
}

func TestClientDisconnectInterrupts(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Keepalive: 50 * time.Millisecond})
	id := ts.create(t, "")
	ts.exec(t, id, "kept = 'state'")
	ctx, cancel := context.WithCancel(context.Background())
	body, _ := json.Marshal(map[string]string{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"})
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/sessions/"+id+"/execute", bytes.NewReader(body))
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Keepalives (every 50 ms) may come first on a loaded machine.
	br := bufio.NewReader(resp.Body)
	line, _ := br.ReadString('\n')
	for strings.Contains(line, `"keepalive"`) {
		line, _ = br.ReadString('\n')
	}
	if !strings.Contains(line, "started") {
		cancel()
		t.Fatalf("first event %q", line)
	}
	cancel()
	resp.Body.Close()
	// The next execution gets its turn only once the sleep was interrupted.
	if r := ts.exec(t, id, "kept"); r.MainResult()["text/plain"] != "'state'" {
		t.Errorf("after disconnect: %+v", r)
	}
}

func TestFiles(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{MaxFileBytes: 1 << 20, MaxWorkspaceBytes: 3 << 20})
	id := ts.create(t, "")
	base := "/v1/sessions/" + id
	if resp := ts.do(t, "PUT", base+"/files/data/in.csv", "a,b\n1,2\n", nil); resp.StatusCode != 201 {
		t.Fatalf("put: %d", resp.StatusCode)
	}
	r := ts.exec(t, id, "import os\nprint(open('data/in.csv').read().count('\\n'))\nopen('out.txt','w').write('from python')\nos.symlink('/etc/passwd', 'escape')\nos.mkfifo('pipe')")
	if r.Status != "ok" || r.Stdout != "2\n" {
		t.Fatalf("python reading the upload: %+v", r)
	}
	resp := ts.do(t, "GET", base+"/files/out.txt", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "from python" {
		t.Errorf("download: %d %q", resp.StatusCode, b)
	}
	var listing struct {
		Files []struct{ Name, Type string }
	}
	ts.do(t, "GET", base+"/files?path=/", "", &listing)
	var names []string
	for _, f := range listing.Files {
		names = append(names, f.Name+":"+f.Type)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "data:dir,escape:symlink,out.txt:file,pipe:other" {
		t.Errorf("list: %v", names)
	}
	for path, want := range map[string]int{"/files/escape": 400, "/files/pipe": 400, "/files/nothing": 404, "/files/../etc/passwd": 400} {
		resp := ts.do(t, "GET", base+path, "", nil)
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
		if b, _ := io.ReadAll(resp.Body); bytes.Contains(b, []byte("root:x:0")) {
			t.Errorf("GET %s leaked /etc/passwd", path)
		}
	}
	// %2e%2e reaches the handler undecoded by the mux.
	if resp := ts.do(t, "GET", base+"/files/a/%2e%2e/%2e%2e/x", "", nil); resp.StatusCode != 400 {
		t.Errorf("encoded ..: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "PUT", base+"/files/big", strings.Repeat("x", 2<<20), nil); resp.StatusCode != 413 || errCode(t, resp) != "too_large" {
		t.Errorf("over the file cap: %d", resp.StatusCode)
	}
	resp = ts.do(t, "GET", base+"/archive?format=zip", "", nil)
	b, _ := io.ReadAll(resp.Body)
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("archive: %d %v", resp.StatusCode, err)
	}
	var zipped []string
	for _, f := range zr.File {
		zipped = append(zipped, f.Name)
	}
	sort.Strings(zipped)
	if strings.Join(zipped, ",") != "data/,data/in.csv,out.txt" {
		t.Errorf("zip entries %v", zipped)
	}
	if resp := ts.do(t, "GET", base+"/archive", "", nil); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/gzip" {
		t.Errorf("tar.gz: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// A path naming the workspace root is refused: it never wipes everything.
	for _, root := range []string{"/files/", "/files/.", "/files/%2e", "/files/./", "/files//"} {
		if resp := ts.do(t, "DELETE", base+root, "", nil); resp.StatusCode != 400 || errCode(t, resp) != "bad_path" {
			t.Errorf("DELETE %s: %d, want 400 bad_path", root, resp.StatusCode)
		}
	}
	if resp := ts.do(t, "GET", base+"/files/out.txt", "", nil); resp.StatusCode != 200 {
		t.Fatalf("a refused root DELETE removed files: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "DELETE", base+"/files/data", "", nil); resp.StatusCode != 204 {
		t.Errorf("delete dir: %d", resp.StatusCode)
	}
	if r := ts.exec(t, id, "import os; os.path.exists('data')"); r.MainResult()["text/plain"] != "False" {
		t.Errorf("deleted dir still there: %+v", r)
	}

	// The sandbox's /tmp (dir=/tmp) is the kernel's; /home/user is the
	// workspace; nothing else is served.
	if resp := ts.do(t, "PUT", base+"/files/in/t.txt?dir=/tmp", "to /tmp", nil); resp.StatusCode != 201 {
		t.Fatalf("put to /tmp: %d", resp.StatusCode)
	}
	r = ts.exec(t, id, "print(open('/tmp/in/t.txt').read()); open('/tmp/k.txt', 'w').write('kernel'); os.symlink('/etc/passwd', '/tmp/escape')")
	if r.Stdout != "to /tmp\n" {
		t.Errorf("the kernel reading /tmp: %+v", r)
	}
	resp = ts.do(t, "GET", base+"/files/k.txt?dir=/tmp", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "kernel" {
		t.Errorf("download from /tmp: %d %q", resp.StatusCode, b)
	}
	resp = ts.do(t, "GET", base+"/files/out.txt?dir=/home/user", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "from python" {
		t.Errorf("download from /home/user: %d %q", resp.StatusCode, b)
	}
	for path, want := range map[string]int{"/files/escape?dir=/tmp": 400, "/files/x?dir=/etc": 400, "/files/passwd?dir=/etc/": 400} {
		resp := ts.do(t, "GET", base+path, "", nil)
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
		if b, _ := io.ReadAll(resp.Body); bytes.Contains(b, []byte("root:x:0")) {
			t.Errorf("GET %s leaked /etc/passwd", path)
		}
	}
}

func TestAuthAndOwnership(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{tokenA, tokenB}})
	id := ts.create(t, "")
	ts.token = ""
	if resp := ts.do(t, "GET", "/v1/sessions", "", nil); resp.StatusCode != 401 || errCode(t, resp) != "unauthorized" {
		t.Errorf("no token: %d", resp.StatusCode)
	}
	ts.token = "wrong-token-xxxxxxxxxx"
	if resp := ts.do(t, "GET", "/v1/sessions", "", nil); resp.StatusCode != 401 {
		t.Errorf("wrong token: %d", resp.StatusCode)
	}
	ts.token = tokenB
	for _, p := range []string{"GET /v1/sessions/" + id, "POST /v1/sessions/" + id + "/execute", "GET /v1/sessions/" + id + "/files", "DELETE /v1/sessions/" + id} {
		m, path, _ := strings.Cut(p, " ")
		if resp := ts.do(t, m, path, `{"code":"1"}`, nil); resp.StatusCode != 404 {
			t.Errorf("other token %s: %d, want 404", p, resp.StatusCode)
		}
	}
	var list struct{ Sessions []sessionJSON }
	ts.do(t, "GET", "/v1/sessions", "", &list)
	if len(list.Sessions) != 0 {
		t.Errorf("other token sees %d sessions", len(list.Sessions))
	}
	ts.token = ""
	if resp := ts.do(t, "GET", "/healthz", "", nil); resp.StatusCode != 200 {
		t.Errorf("healthz needs no token: %d", resp.StatusCode)
	}
	ts.token = tokenA
	if resp := ts.do(t, "GET", "/v1/sessions/"+id, "", nil); resp.StatusCode != 200 {
		t.Errorf("owner: %d", resp.StatusCode)
	}
}

func TestBrowserDefences(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	cases := []struct {
		hdr  []string
		want int
	}{
		{[]string{"Host", "evil.example"}, 403},                                       // DNS rebinding
		{[]string{"Origin", "http://evil.example"}, 403},                              // CSRF
		{[]string{"Sec-Fetch-Site", "cross-site"}, 403},                               // CSRF
		{[]string{"Origin", "http://evil.example", "Authorization", "Bearer x"}, 200}, // scripted with a token: CORS protects it
		{[]string{"Host", "localhost:1234"}, 200},
	}
	for _, c := range cases {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/sessions", nil)
		for i := 0; i < len(c.hdr); i += 2 {
			if c.hdr[i] == "Host" {
				req.Host = c.hdr[i+1]
			} else {
				req.Header.Set(c.hdr[i], c.hdr[i+1])
			}
		}
		if c.hdr[0] == "Origin" && len(c.hdr) == 2 {
			req.Method = "POST"
			req.URL.Path = "/v1/sessions"
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%v: %d, want %d", c.hdr, resp.StatusCode, c.want)
		}
	}
	if ts.mgr.Stats().Sessions != 0 {
		t.Error("a cross-origin POST created a session")
	}
}

func TestBadInput(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{Max: jail.Limits{Memory: 1 << 30}}, Options{MaxBodyBytes: 64 << 10})
	id := ts.create(t, "")
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/sessions", `{"memory_mb": "lots"}`, 400, "bad_request"},
		{"POST", "/v1/sessions", `{"memory_mb": 4096}`, 400, "limit_too_high"},
		{"POST", "/v1/sessions", `{"cpus": -1}`, 400, "bad_request"},
		{"POST", "/v1/sessions", `{"colour": "red"}`, 400, "bad_request"},
		{"POST", "/v1/sessions", `{"network": true}`, 403, "network_not_allowed"},
		{"POST", "/v1/sessions", `{`, 400, "bad_request"},
		{"POST", "/v1/sessions/" + id + "/execute", `{}`, 400, "bad_request"},
		{"POST", "/v1/sessions/" + id + "/execute", `{"code": 12}`, 400, "bad_request"},
		{"POST", "/v1/sessions/" + id + "/execute", `not json`, 400, "bad_request"},
		{"POST", "/v1/sessions/" + id + "/execute", `{"code": "` + strings.Repeat("x", 70<<10) + `"}`, 413, "too_large"},
		{"POST", "/v1/sessions/nope/execute", `{"code": "1"}`, 404, "not_found"},
		{"GET", "/v1/sessions/" + id + "/archive?format=rar", "", 400, "bad_request"},
		{"GET", "/v1/sessions/" + id + "/files?path=../..", "", 400, "bad_path"},
	}
	for _, c := range cases {
		resp := ts.do(t, c.method, c.path, c.body, nil)
		if resp.StatusCode != c.status || errCode(t, resp) != c.code {
			resp.Body = io.NopCloser(bytes.NewReader(nil))
			t.Errorf("%s %s %.40q: %d, want %d %s", c.method, c.path, c.body, resp.StatusCode, c.status, c.code)
		}
	}
	// Still serving.
	if r := ts.exec(t, id, "1+1"); r.MainResult()["text/plain"] != "2" {
		t.Errorf("after bad input: %+v", r)
	}
}

func TestCapacityAndReaping(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{MaxSessions: 1, IdleTimeout: time.Hour}, Options{})
	id := ts.create(t, "")
	resp := ts.do(t, "POST", "/v1/sessions", "", nil)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || errCode(t, resp) != "too_many_sessions" {
		t.Errorf("over capacity: %d %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := ts.mgr.Reap(time.Now()); n != 0 {
		t.Errorf("reaped a fresh session")
	}
	if n := ts.mgr.Reap(time.Now().Add(2 * time.Hour)); n != 1 {
		t.Errorf("idle session not reaped: %d", n)
	}
	if resp := ts.do(t, "GET", "/v1/sessions/"+id, "", nil); resp.StatusCode != 404 {
		t.Errorf("reaped session still there: %d", resp.StatusCode)
	}
	ts.create(t, "") // the slot is free again
}

func TestMetricsAndHealth(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{PoolSize: 1}, Options{})
	id := ts.create(t, "")
	ts.exec(t, id, "1")
	ts.exec(t, id, "1/0")
	resp := ts.do(t, "GET", "/metrics", "", nil)
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`sandloop_executions_total{status="ok"} 1`, `sandloop_executions_total{status="error"} 1`,
		"sandloop_sessions 1", "sandloop_pool_ready", "sandloop_execution_seconds_bucket", "sandloop_oom_kills_total 0"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	var h map[string]any
	ts.do(t, "GET", "/healthz", "", &h)
	if h["status"] != "ok" || h["sessions"].(float64) != 1 || h["paused"].(float64) != 0 {
		t.Errorf("healthz %v", h)
	}
	// A paused session is held but takes no slot.
	list := ts.mgr.List("")
	if len(list) != 1 {
		t.Fatalf("sessions of the test's owner: %d", len(list))
	}
	if err := list[0].Pause(); err != nil {
		t.Fatal(err)
	}
	ts.do(t, "GET", "/healthz", "", &h)
	if h["sessions"].(float64) != 1 || h["paused"].(float64) != 1 {
		t.Errorf("healthz with a paused session: %v", h)
	}
	resp = ts.do(t, "GET", "/metrics", "", nil)
	b, _ = io.ReadAll(resp.Body)
	for _, want := range []string{"sandloop_sessions 1", "sandloop_sessions_paused 1", "sandloop_session_slots_used_ratio 0"} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics with a paused session lack %q", want)
		}
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for p, ops := range doc.Paths {
		for m := range ops {
			if m == "parameters" || m == "description" || m == "summary" {
				continue
			}
			if op, _ := ops[m].(map[string]any); op["x-gateway-only"] == true {
				continue // served by `sandloop gateway` (internal/gateway)
			}
			documented[strings.ToUpper(m)+" "+p] = true
		}
	}
	// /mcp is mounted by sandloop serve (cmd/sandloop), which answers its
	// methods itself.
	srv, err := New(&Options{Manager: session.NewManager(&session.ManagerOptions{}), Mounts: map[string]http.Handler{"/mcp": http.NotFoundHandler()}})
	if err != nil {
		t.Fatal(err)
	}
	for p := range srv.opts.Mounts {
		if doc.Paths[p] == nil {
			t.Errorf("the mount %s is not in openapi.yaml", p)
		}
		delete(doc.Paths, p)
		for d := range documented {
			if strings.HasSuffix(d, " "+p) {
				delete(documented, d)
			}
		}
	}
	routes := map[string]bool{}
	for _, r := range srv.Routes() {
		r = strings.ReplaceAll(r, "{path...}", "{path}")
		routes[r] = true
		if !documented[r] {
			t.Errorf("route %s is not in openapi.yaml", r)
		}
	}
	for d := range documented {
		if !routes[d] {
			t.Errorf("openapi.yaml documents %s, which is not served", d)
		}
	}
}

func TestGracefulShutdownLeavesNothing(t *testing.T) {
	mgr := session.NewManager(&session.ManagerOptions{PoolSize: 2})
	srv, _ := New(&Options{Manager: mgr})
	hs := httptest.NewServer(srv)
	ts := &testServer{Server: hs, mgr: mgr, srv: srv}
	var wss []string
	for i := 0; i < 3; i++ {
		id := ts.create(t, "")
		ts.exec(t, id, "import subprocess; subprocess.Popen(['sleep', '300'])")
		ms, _ := mgr.Get("", id)
		wss = append(wss, ms.Workspace())
	}
	hs.Close()
	if err := mgr.Close(); err != nil {
		t.Fatal(err)
	}
	// A jail killed by Close may take a moment to be gone on a loaded host.
	testutil.WaitFor(t, 15*time.Second, func() error {
		if pids := jail.RunningInits(); len(pids) != 0 {
			return fmt.Errorf("jails still running after shutdown: %v", pids)
		}
		return nil
	})
	for _, ws := range wss {
		if _, err := os.Stat(ws); err == nil {
			t.Errorf("workspace %s left behind", ws)
		}
	}
}

func newHTTPTest(h http.Handler) *httptest.Server { return httptest.NewServer(h) }

func TestDotDotAndUnknownRoutesGetJSON(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	id := ts.create(t, "")
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"PUT", "/v1/sessions/" + id + "/files/../x", 400, "bad_path"},
		{"GET", "/v1/sessions/" + id + "/files/a/../../etc/passwd", 400, "bad_path"},
		{"GET", "/v1/nothing", 404, "not_found"},
		{"PATCH", "/v1/sessions", 405, "method_not_allowed"},
	} {
		// A raw request: net/http's client would clean the path.
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", c.method, c.path)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != c.status || errCode(t, resp) != c.code {
			t.Errorf("%s %s: %d, want %d %s", c.method, c.path, resp.StatusCode, c.status, c.code)
		}
		conn.Close()
	}
}

// A workspace quota above the session's memory limit is refused, naming
// both (the workspace counts toward memory: filling it would end the
// session out of memory instead of failing with ENOSPC); a session that
// asks for less memory than the default quota gets half its memory.
func TestDiskOverMemory(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{Max: jail.Limits{Memory: 1 << 30, Disk: 2 << 30}}, Options{})
	for body, want := range map[string]string{
		`{"disk_mb": 1024}`:                  "disk_mb 1024 is more than memory_mb 512: the workspace is held in memory",
		`{"disk_mb": 300, "memory_mb": 256}`: "disk_mb 300 is more than memory_mb 256",
	} {
		resp := ts.do(t, "POST", "/v1/sessions", body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if resp.StatusCode != 400 || errCode(t, resp) != "disk_over_memory" || !strings.Contains(string(b), want) {
			t.Errorf("create %s: %d %s; want 400 disk_over_memory saying %q", body, resp.StatusCode, b, want)
		}
	}
	var s sessionJSON
	ts.do(t, "GET", "/v1/sessions/"+ts.create(t, `{"memory_mb": 64}`), "", &s)
	if s.DiskMB != 32 {
		t.Errorf("a session of 64 MiB memory got a workspace of %d MiB, want 32", s.DiskMB)
	}
}

// A session's workspace quota: asked for at create within the server's
// maxima, shown with its usage, and enforced on uploads (nothing stored).
func TestWorkspaceQuota(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("workspace quotas need root")
	}
	ts := newTestServer(t, session.ManagerOptions{Max: jail.Limits{Disk: 16 << 20, Files: 100}}, Options{})
	for body, code := range map[string]string{`{"disk_mb": 32}`: "limit_too_high", `{"max_files": 1000}`: "limit_too_high", `{"disk_mb": 0}`: "bad_request", `{"max_files": 2}`: "bad_request"} {
		if resp := ts.do(t, "POST", "/v1/sessions", body, nil); resp.StatusCode != 400 || errCode(t, resp) != code {
			t.Errorf("create %s: %d, want 400 %s", body, resp.StatusCode, code)
		}
	}
	id := ts.create(t, `{"disk_mb": 8, "max_files": 50}`)
	base := "/v1/sessions/" + id
	var s sessionJSON
	ts.do(t, "GET", base, "", &s)
	if s.DiskMB != 8 || s.MaxFiles != 50 || !s.QuotaEnforced || s.DiskUsedBytes == nil || *s.DiskUsedBytes != 0 || *s.FilesUsed != 0 {
		t.Fatalf("new session: %+v", s)
	}
	// The tmpfs refuses it before the server's own count does.
	if resp := ts.do(t, "PUT", base+"/files/in/big.bin", strings.Repeat("x", 9<<20), nil); resp.StatusCode != 507 || errCode(t, resp) != "workspace_full" {
		t.Errorf("upload over the disk quota: %d", resp.StatusCode)
	}
	r := ts.exec(t, id, "import errno\ntry:\n    for i in range(100): open(f'f{i}', 'w').close()\nexcept OSError as e: print(errno.errorcode[e.errno], i)")
	if r.Stdout != "ENOSPC 50\n" {
		t.Fatalf("files past max_files: %+v", r)
	}
	if resp := ts.do(t, "PUT", base+"/files/sub/one.txt", "x", nil); resp.StatusCode != 507 || errCode(t, resp) != "workspace_full" {
		t.Errorf("upload into a full workspace: %d", resp.StatusCode)
	}
	ts.do(t, "GET", base, "", &s)
	if *s.FilesUsed != 50 || *s.DiskUsedBytes != 0 {
		t.Errorf("usage: %d bytes, %d files; want 0 and 50 (nothing of the refused uploads)", *s.DiskUsedBytes, *s.FilesUsed)
	}
}
