package e2b

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

const keyA, keyB = "e2b_aaaa", "e2b_bbbb"

type testServer struct {
	*httptest.Server
	h   *Handler
	mgr *session.Manager
}

func newTestServer(t *testing.T, opts Options) *testServer {
	t.Helper()
	return newTestServerWith(t, opts, session.ManagerOptions{PoolSize: 0})
}

func newTestServerWith(t *testing.T, opts Options, mo session.ManagerOptions) *testServer {
	t.Helper()
	mgr := session.NewManager(&mo)
	opts.Manager = mgr
	if opts.Keys == nil {
		opts.Keys = map[string]string{keyA: "owner-a", keyB: "owner-b"}
	}
	h, err := New(&opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.Close()
		h.Close()
		if err := mgr.Close(); err != nil {
			t.Errorf("manager close: %v", err)
		}
	})
	return &testServer{Server: hs, h: h, mgr: mgr}
}

// call sends a request with headers given as name, value pairs and
// returns the response and its body.
func (ts *testServer) call(t *testing.T, method, path string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
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
	return resp, b
}

func (ts *testServer) control(t *testing.T, method, path, body, key string) (*http.Response, []byte) {
	t.Helper()
	return ts.call(t, method, path, strings.NewReader(body), "X-API-KEY", key, "Content-Type", "application/json")
}

func (ts *testServer) create(t *testing.T, key, body string) created {
	t.Helper()
	resp, b := ts.control(t, "POST", "/v2/sandboxes", body, key)
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	var c created
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// envd calls the data plane of sandbox c on the envd port.
func (ts *testServer) envd(t *testing.T, c created, method, path string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	hdr = append([]string{"E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portEnvd, "X-Access-Token", c.EnvdAccessToken}, hdr...)
	return ts.call(t, method, path, body, hdr...)
}

// rpc makes a unary Connect call with the JSON codec.
func (ts *testServer) rpc(t *testing.T, c created, method string, msg any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(msg)
	resp, body := ts.envd(t, c, "POST", "/"+method, bytes.NewReader(b), "Content-Type", "application/json", "Connect-Protocol-Version", "1")
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: Content-Type %q, body %s", method, ct, body)
	}
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", method, body, err)
	}
	return resp.StatusCode, out
}

// stream makes a server-streaming Connect call and returns its messages and
// the end-stream message.
func (ts *testServer) stream(t *testing.T, c created, method string, msg any, hdr ...string) ([]map[string]any, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(msg)
	env := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(env[1:], uint32(len(b)))
	env = append(env, b...)
	hdr = append([]string{"Content-Type", "application/connect+json", "Connect-Protocol-Version", "1"}, hdr...)
	resp, body := ts.envd(t, c, "POST", "/"+method, bytes.NewReader(env), hdr...)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("%s: %d %q %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var msgs []map[string]any
	for len(body) >= 5 {
		flag, n := body[0], binary.BigEndian.Uint32(body[1:5])
		var m map[string]any
		if err := json.Unmarshal(body[5:5+n], &m); err != nil {
			t.Fatalf("%s: message %q: %v", method, body[5:5+n], err)
		}
		body = body[5+n:]
		if flag&2 != 0 {
			if len(body) != 0 {
				t.Errorf("%s: %d bytes after the end-stream message", method, len(body))
			}
			return msgs, m
		}
		msgs = append(msgs, m)
	}
	t.Fatalf("%s: no end-stream message", method)
	return nil, nil
}

func TestControlPlane(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	for _, key := range []string{"", "e2b_wrong"} {
		resp, b := ts.control(t, "POST", "/v2/sandboxes", `{"templateID":"base"}`, key)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e); resp.StatusCode != 401 || e.Code != 401 || e.Message == "" {
			t.Errorf("key %q: %d %s, want 401 with a JSON code", key, resp.StatusCode, b)
		}
	}
	a := ts.create(t, keyA, `{"templateID":"code-interpreter-v1","metadata":{"k y":"v&1","other":"x"},"timeout":120}`)
	if a.TemplateID != "code-interpreter-v1" || a.SandboxID == "" || a.EnvdVersion != EnvdVersion || a.ClientID == "" || a.EnvdAccessToken == "" || a.TrafficAccessToken == "" {
		t.Errorf("create answered %+v", a)
	}
	// 2.45 and Python create at /sandboxes.
	resp, b := ts.control(t, "POST", "/sandboxes", `{"templateID":"base","metadata":{"k y":"other"}}`, keyA)
	if resp.StatusCode != 201 {
		t.Fatalf("POST /sandboxes: %d %s", resp.StatusCode, b)
	}
	var a2 created
	json.Unmarshal(b, &a2)

	var info map[string]any
	resp, b = ts.control(t, "GET", "/sandboxes/"+a.SandboxID, "", keyA)
	json.Unmarshal(b, &info)
	for _, k := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion", "metadata"} {
		if _, ok := info[k]; !ok {
			t.Errorf("getInfo lacks %q: %s", k, b)
		}
	}
	end, _ := time.Parse(time.RFC3339, info["endAt"].(string))
	if d := time.Until(end); resp.StatusCode != 200 || info["state"] != "running" || d < 100*time.Second || d > 121*time.Second {
		t.Errorf("getInfo: %d %s (endAt in %s)", resp.StatusCode, b, d)
	}

	// Another key sees nothing of A's.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + a.SandboxID, ""},
		{"DELETE", "/sandboxes/" + a.SandboxID, ""},
		{"POST", "/sandboxes/" + a.SandboxID + "/timeout", `{"timeout":5}`},
		{"POST", "/v2/sandboxes/" + a.SandboxID + "/connect", `{}`},
		{"POST", "/sandboxes/nosuch/connect", `{}`},
	} {
		resp, b := ts.control(t, c.method, c.path, c.body, keyB)
		var e struct{ Code int }
		if json.Unmarshal(b, &e); resp.StatusCode != 404 || e.Code != 404 {
			t.Errorf("key B %s %s: %d %s, want 404 with code 404", c.method, c.path, resp.StatusCode, b)
		}
	}
	resp, b = ts.control(t, "GET", "/v2/sandboxes", "", keyB)
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("key B list: %d %s", resp.StatusCode, b)
	}

	// Metadata filter, encoded as the SDK does: each key and value
	// percent-encoded, joined, then query-encoded again.
	filter := url.Values{url.QueryEscape("k y"): {url.QueryEscape("v&1")}}.Encode()
	resp, b = ts.control(t, "GET", "/v2/sandboxes?metadata="+url.QueryEscape(filter), "", keyA)
	var list []infoJSON
	if json.Unmarshal(b, &list); resp.StatusCode != 200 || len(list) != 1 || list[0].SandboxID != a.SandboxID {
		t.Errorf("list by metadata: %d %s", resp.StatusCode, b)
	}
	// Paging.
	resp, b = ts.control(t, "GET", "/v2/sandboxes?limit=1", "", keyA)
	next := resp.Header.Get("X-Next-Token")
	if json.Unmarshal(b, &list); len(list) != 1 || next == "" {
		t.Fatalf("page 1: %s, next %q", b, next)
	}
	first := list[0].SandboxID
	resp, b = ts.control(t, "GET", "/v2/sandboxes?limit=1&nextToken="+next, "", keyA)
	if json.Unmarshal(b, &list); len(list) != 1 || list[0].SandboxID == first || resp.Header.Get("X-Next-Token") != "" {
		t.Errorf("page 2: %s, next %q", b, resp.Header.Get("X-Next-Token"))
	}
	resp, b = ts.control(t, "GET", "/v2/sandboxes?state=paused", "", keyA)
	if strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("paused list: %s", b)
	}

	// Connect answers with envdVersion and never shortens the life.
	resp, b = ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/connect", `{"timeout":10}`, keyA)
	var cn created
	if json.Unmarshal(b, &cn); resp.StatusCode != 200 || cn.EnvdVersion != EnvdVersion || cn.EnvdAccessToken != a.EnvdAccessToken {
		t.Errorf("connect: %d %s", resp.StatusCode, b)
	}
	if d := time.Until(ts.h.lookup(a.SandboxID).deadline()); d < 100*time.Second {
		t.Errorf("connect shortened the life to %s", d)
	}
	// setTimeout may shorten it.
	resp, b = ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/timeout", `{"timeout":30}`, keyA)
	if d := time.Until(ts.h.lookup(a.SandboxID).deadline()); resp.StatusCode != 204 || d > 31*time.Second {
		t.Errorf("setTimeout: %d %s, life %s", resp.StatusCode, b, d)
	}
	for _, body := range []string{`{}`, `{"timeout":-1}`, `{"timeout":"x"}`} {
		if resp, b := ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/timeout", body, keyA); resp.StatusCode != 400 {
			t.Errorf("setTimeout %s: %d %s", body, resp.StatusCode, b)
		}
	}
	if resp, b := ts.control(t, "POST", "/v2/sandboxes", `{"envVars":{"A=B":"x"}}`, keyA); resp.StatusCode != 400 || !strings.Contains(string(b), "A=B") {
		t.Errorf("bad envVars: %d %s", resp.StatusCode, b)
	}

	if resp, b := ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", "", keyA); resp.StatusCode != 501 || !strings.Contains(string(b), "keeps no snapshots") {
		t.Errorf("snapshot: %d %s", resp.StatusCode, b)
	}
	// The sandbox is a sandloop session of the same owner.
	if _, err := ts.mgr.Get("owner-a", a.SandboxID); err != nil {
		t.Errorf("no session behind the sandbox: %v", err)
	}
	resp, _ = ts.control(t, "DELETE", "/sandboxes/"+a.SandboxID, "", keyA)
	if resp.StatusCode != 204 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	if _, err := ts.mgr.Get("owner-a", a.SandboxID); err == nil {
		t.Error("the session outlived its sandbox")
	}
	resp, b = ts.control(t, "DELETE", "/sandboxes/"+a.SandboxID, "", keyA)
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"code":404`) {
		t.Errorf("second delete: %d %s", resp.StatusCode, b)
	}
	// The data plane of a gone sandbox answers 502 (the SDKs' "not running").
	resp, _ = ts.envd(t, a, "GET", "/health", nil)
	if resp.StatusCode != 502 {
		t.Errorf("health of a killed sandbox: %d, want 502", resp.StatusCode)
	}
	resp, _ = ts.envd(t, a2, "GET", "/health", nil)
	if resp.StatusCode != 204 {
		t.Errorf("health: %d, want 204", resp.StatusCode)
	}
	for _, hdr := range [][]string{{"X-Access-Token", "wrong"}, {"E2b-Sandbox-Port", portInterpreter, "X-Access-Token", ""}} {
		if resp, _ := ts.envd(t, a2, "GET", "/health", nil, hdr...); resp.StatusCode != 401 {
			t.Errorf("health with %v: %d, want 401", hdr, resp.StatusCode)
		}
	}
}

func TestReaper(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{ReapInterval: 50 * time.Millisecond})
	c := ts.create(t, keyA, `{"timeout":60}`)
	ws := ts.h.lookup(c.SandboxID).ms.Workspace()
	// Half a second from now, its workspace known (the reaper may not
	// take it before).
	if resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":0.5}`, keyA); resp.StatusCode != 204 {
		t.Fatalf("set timeout: %d %s", resp.StatusCode, b)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, err := ts.mgr.Get("owner-a", c.SandboxID)
		_, serr := os.Stat(ws) // the session's Close removes the workspace last
		if err == nil || ts.h.lookup(c.SandboxID) != nil || !os.IsNotExist(serr) {
			return errors.New("the sandbox, its session or its workspace outlived its timeout")
		}
		// The session's history says why it went (once its close has
		// ended: the workspace goes a moment before the close is noted).
		evs, err := ts.mgr.SessionEvents("owner-a", c.SandboxID)
		if err != nil {
			return err
		}
		if all, ended, _ := evs.Since(0); !ended || !strings.Contains(all[len(all)-1].Reason, "E2B timeout") {
			return fmt.Errorf("the closed sandbox's last event: %+v", all)
		}
		return nil
	})
}

func TestFilesREST(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{MaxFileBytes: 1 << 20})
	c := ts.create(t, keyA, `{}`)
	ws := ts.h.lookup(c.SandboxID).ms.Workspace()

	// Raw, gzip-encoded, relative path.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()
	resp, b := ts.envd(t, c, "POST", "/files?path=dir/a.txt", &gz, "Content-Type", "application/octet-stream", "Content-Encoding", "gzip")
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `[{"path":"/home/user/dir/a.txt","name":"a.txt","type":"file"}]` {
		t.Errorf("octet-stream upload: %d %s", resp.StatusCode, b)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "dir/a.txt")); string(got) != "zipped" {
		t.Errorf("on disk: %q", got)
	}
	// Multipart: two files named by their parts, one absolute.
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for name, data := range map[string]string{"/workspace/m1.txt": "one", "m2/x.txt": "two"} {
		fw, _ := mw.CreateFormFile("file", name)
		fw.Write([]byte(data))
	}
	mw.Close()
	resp, b = ts.envd(t, c, "POST", "/files", &mp, "Content-Type", mw.FormDataContentType())
	var up []uploaded
	if json.Unmarshal(b, &up); resp.StatusCode != 200 || len(up) != 2 {
		t.Errorf("multipart upload: %d %s", resp.StatusCode, b)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "m2/x.txt")); string(got) != "two" {
		t.Errorf("multipart on disk: %q", got)
	}
	// Download.
	resp, b = ts.envd(t, c, "GET", "/files?path=/workspace/m1.txt&username=user", nil)
	if resp.StatusCode != 200 || string(b) != "one" || resp.Header.Get("Content-Length") != "3" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("download: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	for _, c2 := range []struct {
		method, path string
		body         string
		status       int
	}{
		{"GET", "/files?path=missing.txt", "", 404},
		{"GET", "/files?path=dir", "", 400},
		{"GET", "/files?path=/etc/passwd", "", 403},
		{"GET", "/files?path=../x", "", 400},
		{"POST", "/files?path=/etc/x", "data", 403},
		{"POST", "/files", "data", 400},
		{"POST", "/files?path=big", strings.Repeat("x", 1<<20+1), 413},
	} {
		resp, b := ts.envd(t, c, c2.method, c2.path, strings.NewReader(c2.body), "Content-Type", "application/octet-stream")
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e); resp.StatusCode != c2.status || e.Code != c2.status || e.Message == "" {
			t.Errorf("%s %s: %d %s, want %d with a JSON error", c2.method, c2.path, resp.StatusCode, b, c2.status)
		}
	}
	// A signed URL (downloadUrl()) needs no header: its signature names the sandbox.
	sign := func(p, op, exp string) string {
		raw := p + ":" + op + "::" + c.EnvdAccessToken
		if exp != "" {
			raw += ":" + exp
		}
		sum := sha256.Sum256([]byte(raw))
		q := url.Values{"path": {p}, "signature": {"v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")}}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		return "/files?" + q.Encode()
	}
	future, past := fmt.Sprint(time.Now().Unix()+60), fmt.Sprint(time.Now().Unix()-1)
	for _, c2 := range []struct {
		method, path string
		status       int
	}{
		{"GET", sign("m1.txt", "read", ""), 200},
		{"GET", sign("m1.txt", "read", future), 200},
		{"GET", sign("m1.txt", "read", past), 401},
		{"GET", sign("m1.txt", "write", ""), 401},
		{"GET", strings.Replace(sign("m1.txt", "read", ""), "m1.txt", "m2%2Fx.txt", 1), 401},
		{"POST", sign("signed.txt", "write", ""), 200},
	} {
		resp, b := ts.call(t, c2.method, c2.path, strings.NewReader("up"), "Content-Type", "application/octet-stream")
		if resp.StatusCode != c2.status {
			t.Errorf("signed %s %s: %d %s, want %d", c2.method, c2.path, resp.StatusCode, b, c2.status)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "signed.txt")); string(got) != "up" {
		t.Errorf("signed upload: %q", got)
	}
	// Another sandbox's files are not reachable through this one.
	other := ts.create(t, keyA, `{}`)
	if resp, _ := ts.envd(t, other, "GET", "/files?path=m1.txt", nil); resp.StatusCode != 404 {
		t.Errorf("other sandbox read: %d", resp.StatusCode)
	}
	// Nor with its id and this one's token.
	other.EnvdAccessToken = c.EnvdAccessToken
	if resp, _ := ts.envd(t, other, "GET", "/files?path=m1.txt", nil); resp.StatusCode != 401 {
		t.Errorf("other sandbox with a foreign token: %d", resp.StatusCode)
	}
}

func TestFilesystemRPC(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	ws := ts.h.lookup(c.SandboxID).ms.Workspace()
	os.MkdirAll(filepath.Join(ws, "a/b/c"), 0o755)
	os.WriteFile(filepath.Join(ws, "a/f.txt"), []byte("12345"), 0o644)

	st, m := ts.rpc(t, c, "filesystem.Filesystem/Stat", map[string]any{"path": "a/f.txt"})
	e, _ := m["entry"].(map[string]any)
	if st != 200 || e["name"] != "f.txt" || e["type"] != "FILE_TYPE_FILE" || e["path"] != "/home/user/a/f.txt" || e["size"] != "5" || e["permissions"] != "-rw-r--r--" {
		t.Errorf("Stat: %d %v", st, m)
	}
	if _, err := time.Parse(time.RFC3339Nano, e["modifiedTime"].(string)); err != nil || !strings.HasSuffix(e["modifiedTime"].(string), "Z") {
		t.Errorf("modifiedTime %v: %v", e["modifiedTime"], err)
	}
	for _, c2 := range []struct {
		method string
		msg    map[string]any
		code   string
	}{
		{"Stat", map[string]any{"path": "nope"}, "not_found"},
		{"Stat", map[string]any{"path": "/etc"}, "permission_denied"},
		{"MakeDir", map[string]any{"path": "a/b"}, "already_exists"},
		{"ListDir", map[string]any{"path": "a/f.txt"}, "invalid_argument"},
		{"Move", map[string]any{"source": "nope", "destination": "x"}, "not_found"},
		{"Remove", map[string]any{"path": "/workspace"}, "invalid_argument"},
		{"Stat", map[string]any{"path": 5}, "invalid_argument"},
	} {
		st, m := ts.rpc(t, c, "filesystem.Filesystem/"+c2.method, c2.msg)
		if st < 400 || m["code"] != c2.code || m["message"] == "" {
			t.Errorf("%s %v: %d %v, want code %q", c2.method, c2.msg, st, m, c2.code)
		}
	}
	depthNames := func(depth int) []string {
		_, m := ts.rpc(t, c, "filesystem.Filesystem/ListDir", map[string]any{"path": "/workspace/a", "depth": depth})
		var out []string
		for _, e := range m["entries"].([]any) {
			out = append(out, e.(map[string]any)["path"].(string)+":"+e.(map[string]any)["type"].(string))
		}
		return out
	}
	if got := strings.Join(depthNames(1), ","); got != "/home/user/a/b:FILE_TYPE_DIRECTORY,/home/user/a/f.txt:FILE_TYPE_FILE" {
		t.Errorf("ListDir depth 1: %s", got)
	}
	if got := strings.Join(depthNames(3), ","); got != "/home/user/a/b:FILE_TYPE_DIRECTORY,/home/user/a/b/c:FILE_TYPE_DIRECTORY,/home/user/a/f.txt:FILE_TYPE_FILE" {
		t.Errorf("ListDir depth 3: %s", got)
	}
	if st, m := ts.rpc(t, c, "filesystem.Filesystem/MakeDir", map[string]any{"path": "new/dir"}); st != 200 || m["entry"].(map[string]any)["type"] != "FILE_TYPE_DIRECTORY" {
		t.Errorf("MakeDir: %d %v", st, m)
	}
	if st, m := ts.rpc(t, c, "filesystem.Filesystem/Move", map[string]any{"source": "a/f.txt", "destination": "/workspace/new/g.txt"}); st != 200 || m["entry"].(map[string]any)["path"] != "/home/user/new/g.txt" {
		t.Errorf("Move: %d %v", st, m)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "new/g.txt")); string(b) != "12345" {
		t.Errorf("moved file: %q", b)
	}
	if st, _ := ts.rpc(t, c, "filesystem.Filesystem/Remove", map[string]any{"path": "a"}); st != 200 {
		t.Errorf("Remove: %d", st)
	}
	if _, err := os.Stat(filepath.Join(ws, "a")); !os.IsNotExist(err) {
		t.Errorf("removed dir still there: %v", err)
	}
}

// events decodes a process stream's messages.
func events(t *testing.T, msgs []map[string]any) (pid float64, stdout, stderr string, end map[string]any) {
	t.Helper()
	for _, m := range msgs {
		ev := m["event"].(map[string]any)
		switch {
		case ev["start"] != nil:
			pid = ev["start"].(map[string]any)["pid"].(float64)
		case ev["data"] != nil:
			d := ev["data"].(map[string]any)
			for k, dst := range map[string]*string{"stdout": &stdout, "stderr": &stderr} {
				if s, ok := d[k].(string); ok {
					b, err := base64.StdEncoding.DecodeString(s)
					if err != nil {
						t.Fatalf("data %q: %v", s, err)
					}
					*dst += string(b)
				}
			}
		case ev["end"] != nil:
			end = ev["end"].(map[string]any)
		}
	}
	return
}

func bash(cmd string, extra map[string]any) map[string]any {
	p := map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", cmd}, "envs": map[string]string{"PER": "cmd"}}
	for k, v := range extra {
		p[k] = v
	}
	return map[string]any{"process": p}
}

func TestProcessRPC(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{MaxProcesses: 1})
	c := ts.create(t, keyA, `{"envVars":{"SBX":"box"}}`)

	msgs, last := ts.stream(t, c, "process.Process/Start", bash(`echo "$SBX $PER $(pwd)"; echo oops >&2; exit 7`, nil))
	pid, out, errOut, end := events(t, msgs)
	if len(last) != 0 || pid == 0 || out != "box cmd /home/user\n" || errOut != "oops\n" || end["exitCode"] != 7.0 || end["exited"] != true || end["status"] != "exit status 7" {
		t.Errorf("Start: pid %v stdout %q stderr %q end %v end-stream %v", pid, out, errOut, end, last)
	}
	if _, ok := msgs[0]["event"].(map[string]any)["start"]; !ok {
		t.Errorf("first event is not start: %v", msgs[0])
	}
	// The SDKs' `user` (a Basic user name): E2B's "user" is the sandbox's
	// own; a command asked to run as root runs as it too, and the first
	// such command says so on its stderr, before its own output.
	basic := func(name string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":")) }
	for i, u := range []struct{ user, notice string }{
		{"user", ""},
		{"root", `[sandloop] this sandbox has one user and no root: commands asked to run as "root" run as that user (sandbox, uid 1000)` + "\n"},
		{"root", ""},
	} {
		msgs, _ := ts.stream(t, c, "process.Process/Start", bash("id -u; echo e >&2", nil), "Authorization", basic(u.user))
		if _, out, errOut, end := events(t, msgs); out != "1000\n" || errOut != u.notice+"e\n" || end["exitCode"] != nil && end["exitCode"] != 0.0 {
			t.Errorf("command %d as %q: stdout %q, stderr %q (want %q), end %v", i, u.user, out, errOut, u.notice+"e\n", end)
		}
	}
	os.MkdirAll(filepath.Join(ts.h.lookup(c.SandboxID).ms.Workspace(), "sub"), 0o777)
	msgs, _ = ts.stream(t, c, "process.Process/Start", bash("pwd", map[string]any{"cwd": "/workspace/sub"}))
	if _, out, _, _ := events(t, msgs); out != "/workspace/sub\n" {
		t.Errorf("cwd: %q", out)
	}
	// Connect-Timeout-Ms bounds the process: it is killed.
	start := time.Now()
	msgs, last = ts.stream(t, c, "process.Process/Start", bash("sleep 30", nil), "Connect-Timeout-Ms", "500")
	if e, _ := last["error"].(map[string]any); e["code"] != "deadline_exceeded" || time.Since(start) > 10*time.Second {
		t.Errorf("timeout: end-stream %v after %s", last, time.Since(start))
	}
	// A background process outlives its stream; List, SendInput, CloseStdin, SendSignal.
	done := make(chan []map[string]any, 1)
	go func() {
		msgs, _ := ts.stream(t, c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "cat"}, "stdin": true})
		done <- msgs
	}()
	var bg map[string]any
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, m := ts.rpc(t, c, "process.Process/List", map[string]any{})
		for _, p := range m["processes"].([]any) {
			bg = p.(map[string]any)
		}
		if bg == nil {
			return errors.New("List shows no process")
		}
		return nil
	})
	if bg["config"].(map[string]any)["cmd"] != "cat" {
		t.Fatalf("List: %v", bg)
	}
	sel := map[string]any{"pid": bg["pid"]}
	_, last = ts.stream(t, c, "process.Process/Start", bash("true", nil))
	if e, _ := last["error"].(map[string]any); e["code"] != "resource_exhausted" {
		t.Errorf("a command over the cap: %v", last)
	}
	if st, m := ts.rpc(t, c, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("hi\n"))}}); st != 200 {
		t.Errorf("SendInput: %d %v", st, m)
	}
	if st, m := ts.rpc(t, c, "process.Process/CloseStdin", map[string]any{"process": sel}); st != 200 {
		t.Errorf("CloseStdin: %d %v", st, m)
	}
	if _, out, _, end := events(t, <-done); out != "hi\n" || end["exitCode"] != 0.0 {
		t.Errorf("cat: %q %v", out, end)
	}
	go func() {
		msgs, _ := ts.stream(t, c, "process.Process/Start", bash("sleep 60", nil))
		done <- msgs
	}()
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, m := ts.rpc(t, c, "process.Process/List", map[string]any{})
		if ps := m["processes"].([]any); len(ps) != 1 {
			return fmt.Errorf("List shows %d processes, want 1", len(ps))
		}
		sel["pid"] = m["processes"].([]any)[0].(map[string]any)["pid"]
		return nil
	})
	// Connect attaches another stream to the running process.
	attached := make(chan []map[string]any, 1)
	go func() {
		msgs, _ := ts.stream(t, c, "process.Process/Connect", map[string]any{"process": sel})
		attached <- msgs
	}()
	testutil.WaitFor(t, 10*time.Second, func() error {
		sb := ts.h.lookup(c.SandboxID)
		sb.mu.Lock()
		p := sb.procs[uint32(sel["pid"].(float64))]
		sb.mu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.subs) != 2 {
			return fmt.Errorf("%d streams attached to the process, want 2 (Start's and Connect's)", len(p.subs))
		}
		return nil
	})
	if st, m := ts.rpc(t, c, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGKILL"}); st != 200 {
		t.Errorf("SendSignal: %d %v", st, m)
	}
	if _, _, _, end := events(t, <-done); end["exitCode"] != -1.0 || end["exited"] == true {
		t.Errorf("killed: %v", end)
	}
	if pid, _, _, end := events(t, <-attached); pid != sel["pid"] || end["exitCode"] != -1.0 {
		t.Errorf("Connect: pid %v end %v", pid, end)
	}
	for _, method := range []string{"SendSignal", "SendInput", "CloseStdin"} {
		st, m := ts.rpc(t, c, "process.Process/"+method, map[string]any{"process": map[string]any{"pid": 99999}, "signal": "SIGNAL_SIGKILL", "input": map[string]any{"stdin": ""}})
		if st != 404 || m["code"] != "not_found" {
			t.Errorf("%s of an unknown pid: %d %v", method, st, m)
		}
	}
	for _, pty := range []map[string]any{{}, {"size": map[string]any{"cols": 0, "rows": 24}}, {"size": map[string]any{"cols": 80, "rows": 5000}}} {
		msgs, last = ts.stream(t, c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "sh"}, "pty": pty})
		if e, _ := last["error"].(map[string]any); len(msgs) != 0 || e["code"] != "invalid_argument" {
			t.Errorf("PTY %v: %v %v", pty, msgs, last)
		}
	}
}

// ndjson reads /execute's lines.
func ndjson(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if m["type"] != "keepalive" {
			out = append(out, m)
		}
	}
	return out
}

func TestInterpreter(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{MaxContexts: 1})
	c := ts.create(t, keyA, `{"envVars":{"SBX":"box"}}`)
	interp := func(method, path, body string) (*http.Response, []byte) {
		return ts.call(t, method, path, strings.NewReader(body), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
			"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	}
	resp, b := interp("POST", "/execute", `{"code":"import os\nprint(os.environ['SBX'], os.environ['CELL'])\nx = 2\nx * 21","env_vars":{"CELL":"c"}}`)
	lines := ndjson(t, b)
	types := []string{}
	for _, l := range lines {
		types = append(types, l["type"].(string))
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" || strings.Join(types, ",") != "stdout,result,number_of_executions,end_of_execution" {
		t.Fatalf("execute: %d %s", resp.StatusCode, b)
	}
	if lines[0]["text"] != "box c\n" || lines[0]["timestamp"] == nil || lines[1]["text"] != "42" || lines[1]["is_main_result"] != true || lines[2]["execution_count"] != 1.0 {
		t.Errorf("execute lines: %s", b)
	}
	_, b = interp("POST", "/execute", `{"code":"import os; os.environ.get('CELL', 'gone'), x","language":"python"}`)
	if lines := ndjson(t, b); lines[0]["text"] != "('gone', 2)" || lines[1]["execution_count"] != 2.0 {
		t.Errorf("second cell: %s", b)
	}
	_, b = interp("POST", "/execute", `{"code":"1/0"}`)
	if lines := ndjson(t, b); lines[0]["type"] != "error" || lines[0]["name"] != "ZeroDivisionError" || !strings.Contains(lines[0]["traceback"].(string), "1/0") || lines[1]["execution_count"] != 3.0 {
		t.Errorf("error cell: %s", b)
	}
	_, b = interp("POST", "/execute", `{"code":"import matplotlib.pyplot as plt\nplt.plot([1,2])\nplt.show()"}`)
	if lines := ndjson(t, b); lines[0]["type"] != "result" || !strings.HasPrefix(lines[0]["png"].(string), "iVBOR") {
		t.Errorf("plot: %.300s", b)
	}
	for _, c2 := range []struct {
		body   string
		status int
	}{
		{`{"code":"1","context_id":"nope"}`, 404},
		{`{"code":"1","context_id":"default","language":"python"}`, 400},
		{`{"code":"1","language":"r"}`, 400},
		{`{}`, 400},
	} {
		if resp, b := interp("POST", "/execute", c2.body); resp.StatusCode != c2.status {
			t.Errorf("execute %s: %d %s, want %d", c2.body, resp.StatusCode, b, c2.status)
		}
	}
	// A client that goes away interrupts the cell; the state stays. It
	// goes once the cell says y is set (however slow the machine).
	abort, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(abort, "POST", ts.URL+"/execute", strings.NewReader(`{"code":"import time\ny = 1\nprint('set', flush=True)\ntime.sleep(30)\ny = 2"}`))
	req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", portInterpreter)
	req.Header.Set("E2B-Traffic-Access-Token", c.TrafficAccessToken)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), `"set\n"`) {
		}
		cancel()
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Error("the sleeping cell finished")
		}
	}
	cancel()
	start := time.Now()
	_, b = interp("POST", "/execute", `{"code":"y"}`)
	if lines := ndjson(t, b); lines[0]["text"] != "1" || time.Since(start) > 10*time.Second {
		t.Errorf("after abort: %s in %s", b, time.Since(start))
	}

	// Contexts: own kernels on the same workspace.
	resp, b = interp("POST", "/contexts", `{"language":"python","cwd":"/workspace/w"}`)
	var ctx contextJSON
	if json.Unmarshal(b, &ctx); resp.StatusCode != 200 || ctx.ID == "" || ctx.Cwd != "/workspace/w" || ctx.Language != "python" {
		t.Fatalf("create context: %d %s", resp.StatusCode, b)
	}
	if resp, b := interp("POST", "/contexts", `{}`); resp.StatusCode != 429 || !strings.Contains(string(b), "at most 1") {
		t.Errorf("context over the cap: %d %s", resp.StatusCode, b)
	}
	_, b = interp("POST", "/execute", `{"code":"import os\nopen('f.txt','w').write('x')\nz = 3\nos.getcwd()","context_id":"`+ctx.ID+`"}`)
	if lines := ndjson(t, b); lines[0]["text"] != "'/workspace/w'" {
		t.Errorf("context cwd: %s", b)
	}
	_, b = interp("POST", "/execute", `{"code":"open('w/f.txt').read(), 'z' in globals()"}`)
	if lines := ndjson(t, b); lines[0]["text"] != "('x', False)" {
		t.Errorf("default context sees the file, not the variable: %s", b)
	}
	_, b = interp("GET", "/contexts", "")
	if !strings.Contains(string(b), ctx.ID) || !strings.Contains(string(b), defaultContextID) {
		t.Errorf("list contexts: %s", b)
	}
	if resp, _ := interp("POST", "/contexts/"+ctx.ID+"/restart", ""); resp.StatusCode/100 != 2 {
		t.Errorf("restart: %d", resp.StatusCode)
	}
	_, b = interp("POST", "/execute", `{"code":"import os; 'z' in globals(), os.getcwd()","context_id":"`+ctx.ID+`"}`)
	if lines := ndjson(t, b); lines[0]["text"] != "(False, '/workspace/w')" {
		t.Errorf("after restart: %s", b)
	}
	if resp, _ := interp("DELETE", "/contexts/"+ctx.ID, ""); resp.StatusCode/100 != 2 {
		t.Errorf("delete context: %d", resp.StatusCode)
	}
	if resp, _ := interp("DELETE", "/contexts/"+ctx.ID, ""); resp.StatusCode != 404 {
		t.Errorf("delete again: %d", resp.StatusCode)
	}
	if resp, _ := interp("POST", "/contexts", `{"language":"javascript"}`); resp.StatusCode != 400 {
		t.Errorf("javascript context: %d", resp.StatusCode)
	}
}

// getMetrics: samples kept as the sandbox runs and one taken when asked,
// with E2B's fields; the CPU a cell burns shows, the window is honoured.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	type sample struct {
		Timestamp     string  `json:"timestamp"`
		TimestampUnix int64   `json:"timestampUnix"`
		CPUCount      int     `json:"cpuCount"`
		CPUUsedPct    float64 `json:"cpuUsedPct"`
		MemUsed       int64   `json:"memUsed"`
		MemTotal      int64   `json:"memTotal"`
		MemCache      int64   `json:"memCache"`
		DiskUsed      int64   `json:"diskUsed"`
		DiskTotal     int64   `json:"diskTotal"`
	}
	get := func(query string) []sample {
		t.Helper()
		resp, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID+"/metrics"+query, "", keyA)
		if resp.StatusCode == 501 && strings.Contains(string(b), "rlimits") {
			t.Skipf("no cgroups here: %s", b)
		}
		var out []sample
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("metrics%s: %d %s", query, resp.StatusCode, b)
		}
		return out
	}
	first := get("")
	if len(first) == 0 {
		t.Fatal("no sample, though one is taken when asked")
	}
	var info map[string]any
	_, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID, "", keyA)
	json.Unmarshal(b, &info)
	m := first[len(first)-1]
	if _, err := time.Parse(time.RFC3339, m.Timestamp); err != nil || m.TimestampUnix == 0 {
		t.Errorf("timestamp %q (%d): %v", m.Timestamp, m.TimestampUnix, err)
	}
	if float64(m.CPUCount) != info["cpuCount"] || float64(m.MemTotal>>20) != info["memoryMB"] || float64(m.DiskTotal>>20) != info["diskSizeMB"] || m.MemUsed <= 0 {
		t.Errorf("sample %+v does not match getInfo %s", m, b)
	}
	// A cell that burns a second of CPU, then writes 3 MiB to the workspace.
	code := `{"code":"import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nopen('blob', 'wb').write(b'x' * (3 << 20))"}`
	resp, out := ts.call(t, "POST", "/execute", strings.NewReader(code), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
		"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	if resp.StatusCode != 200 || strings.Contains(string(out), `"error"`) {
		t.Fatalf("execute: %d %s", resp.StatusCode, out)
	}
	// A sample a second (the disk counted every fifth): wait for the ones
	// that saw the cell.
	var all []sample
	testutil.WaitFor(t, 30*time.Second, func() error {
		all = get("")
		busy, disk := false, false
		for _, s := range all {
			busy = busy || s.CPUUsedPct > 20
			disk = disk || s.DiskUsed >= 3<<20
		}
		if !busy || !disk {
			return fmt.Errorf("after a second of CPU and a 3 MiB file: %+v", all)
		}
		return nil
	})
	last := all[len(all)-1]
	for i := 1; i < len(all); i++ {
		if d := all[i].TimestampUnix - all[i-1].TimestampUnix; d < 0 || d > 3 {
			t.Errorf("samples %d and %d are %d s apart, want about one: %+v", i-1, i, d, all)
		}
	}
	// The window: nothing before start, nothing after end.
	if got := get(fmt.Sprintf("?start=%d", last.TimestampUnix+3600)); len(got) != 0 {
		t.Errorf("samples after start+1h: %+v", got)
	}
	if got := get(fmt.Sprintf("?start=0&end=%d", first[0].TimestampUnix)); len(got) == 0 || got[len(got)-1].TimestampUnix > first[0].TimestampUnix+1 {
		t.Errorf("samples up to end: %+v", got)
	}
	if resp, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID+"/metrics?start=x", "", keyA); resp.StatusCode != 400 {
		t.Errorf("start=x: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID+"/metrics", "", keyB); resp.StatusCode != 404 {
		t.Errorf("another key: %d %s", resp.StatusCode, b)
	}
}
