package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/mcpserver"
	"github.com/sandloop/sandloop/internal/session"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

// source makes real sessions and records their lifecycle.
type source struct {
	t      *testing.T
	mu     sync.Mutex
	made   int
	closed chan string // workspace of each session closed
}

func newSource(t *testing.T) *source {
	return &source{t: t, closed: make(chan string, 16)}
}

func (s *source) NewSession(ctx context.Context) (mcpserver.Session, error) {
	sess, err := session.New(ctx, &session.Options{})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.made++
	s.mu.Unlock()
	s.t.Cleanup(func() { sess.Close() })
	return &recorded{Session: sess, closed: s.closed}, nil
}

func (s *source) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.made
}

type recorded struct {
	*session.Session
	closed chan string
	once   sync.Once
}

func (r *recorded) Close() error {
	err := r.Session.Close()
	r.once.Do(func() { r.closed <- r.Workspace() })
	return err
}

// waitClosed waits for a session of src to be closed.
func waitClosed(t *testing.T, src *source) string {
	t.Helper()
	select {
	case ws := <-src.closed:
		return ws
	case <-time.After(30 * time.Second): // a hang guard, not a timing claim
		t.Fatal("the session was not closed after its connection ended")
		return ""
	}
}

func newServer(t *testing.T, src mcpserver.SessionSource, opts *mcpserver.Options) *mcpserver.Server {
	t.Helper()
	srv, err := mcpserver.New(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// connect connects a Go SDK client to srv over an in-memory transport.
func connect(t *testing.T, srv *mcpserver.Server, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := srv.Connect(ctx, st); err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, copts)
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// structured decodes a result's structuredContent into a map.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structuredContent %s: %v", b, err)
	}
	return m
}

func TestListTools(t *testing.T) {
	src := newSource(t)
	cs := connect(t, newServer(t, src, nil), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	var names []string
	for _, tool := range res.Tools {
		tools[tool.Name] = tool
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	// fork_session and snapshot are offered only by a source that can fork
	// and keeps snapshots (this one cannot).
	want := slices.Sorted(slices.Values(slices.DeleteFunc(slices.Clone(mcpserver.ToolNames), func(n string) bool { return n == "fork_session" || n == "snapshot" })))
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	hints := []struct {
		name                              string
		readOnly, destructive, idempotent bool
	}{
		{"execute_python", false, true, false},
		{"run_shell", false, true, false},
		{"write_file", false, true, true},
		{"read_file", true, false, true},
		{"list_files", true, false, true},
		{"reset_session", false, true, true},
		{"checkpoint", false, false, false},
		{"undo", false, true, false},
	}
	for _, h := range hints {
		tool := tools[h.name]
		a := tool.Annotations
		if a == nil {
			t.Errorf("%s: no annotations", h.name)
			continue
		}
		destructive := a.DestructiveHint == nil || *a.DestructiveHint
		if a.ReadOnlyHint != h.readOnly || (!h.readOnly && destructive != h.destructive) || a.IdempotentHint != h.idempotent {
			t.Errorf("%s: annotations %+v", h.name, a)
		}
		if a.OpenWorldHint == nil || *a.OpenWorldHint {
			t.Errorf("%s: openWorldHint should be false without network", h.name)
		}
		if len(tool.Description) < 60 {
			t.Errorf("%s: description too short: %q", h.name, tool.Description)
		}
	}
	schema, _ := json.Marshal(tools["execute_python"].InputSchema)
	for _, want := range []string{`"required":["code"]`, `"timeout_s"`, `"maximum":600`, `"exclusiveMinimum":0`} {
		if !bytes.Contains(schema, []byte(want)) {
			t.Errorf("execute_python schema lacks %s: %s", want, schema)
		}
	}
	out, _ := json.Marshal(tools["execute_python"].OutputSchema)
	if !bytes.Contains(out, []byte(`"execution_count"`)) {
		t.Errorf("execute_python output schema: %s", out)
	}
	if src.count() != 0 {
		t.Errorf("listing tools started %d sessions; sessions start on first use", src.count())
	}
}

func TestToolsOption(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), &mcpserver.Options{Tools: []string{"execute_python", "read_file"}}), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	if !slices.Equal(names, []string{"execute_python", "read_file"}) {
		t.Errorf("tools %v", names)
	}
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_shell", Arguments: map[string]any{"command": "ls"}}); err == nil {
		t.Error("a disabled tool could be called")
	}
	if _, err := mcpserver.New(newSource(t), &mcpserver.Options{Tools: []string{"exec"}}); err == nil || !strings.Contains(err.Error(), `unknown tool "exec"`) {
		t.Errorf("unknown tool name in options: %v", err)
	}
}

func TestExecuteKeepsState(t *testing.T) {
	src := newSource(t)
	cs := connect(t, newServer(t, src, nil), nil)
	res := call(t, cs, "execute_python", map[string]any{"code": "x = 41\nprint('hello')"})
	if res.IsError {
		t.Fatalf("first call failed: %s", text(res))
	}
	res = call(t, cs, "execute_python", map[string]any{"code": "x + 1"})
	txt := text(res)
	if res.IsError || !strings.Contains(txt, "status: ok") || !strings.Contains(txt, "--- result ---\n42") {
		t.Fatalf("state not kept: %s", txt)
	}
	sc := structured(t, res)
	if sc["status"] != "ok" || sc["execution_count"] != 2.0 {
		t.Errorf("structuredContent %v", sc)
	}
	main := sc["results"].([]any)[0].(map[string]any)
	if main["is_main_result"] != true || main["data"].(map[string]any)["text/plain"] != "42" {
		t.Errorf("results %v", sc["results"])
	}
	if src.count() != 1 {
		t.Errorf("%d sessions for one connection", src.count())
	}
}

func TestPythonErrorIsToolError(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	res := call(t, cs, "execute_python", map[string]any{"code": "print('before')\ndef f():\n    return 1/0\nf()"})
	txt := text(res)
	if !res.IsError {
		t.Fatalf("a Python exception should be a tool error: %s", txt)
	}
	for _, want := range []string{"status: error", "--- stdout ---\nbefore", "Traceback (most recent call last)", "line 3, in f", "ZeroDivisionError: division by zero"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}
	sc := structured(t, res)
	if e, _ := sc["error"].(map[string]any); e["name"] != "ZeroDivisionError" {
		t.Errorf("structured error %v", sc["error"])
	}
	// The session survives the error.
	if res := call(t, cs, "execute_python", map[string]any{"code": "f"}); res.IsError {
		t.Errorf("after an error: %s", text(res))
	}
}

func TestMatplotlibImage(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	res := call(t, cs, "execute_python", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"})
	if res.IsError {
		t.Fatalf("plot failed: %s", text(res))
	}
	var imgs []*mcp.ImageContent
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			imgs = append(imgs, img)
		}
	}
	if len(imgs) != 1 {
		t.Fatalf("%d images, want 1: %s", len(imgs), text(res))
	}
	if imgs[0].MIMEType != "image/png" || !bytes.HasPrefix(imgs[0].Data, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("image %s, %d bytes starting %q", imgs[0].MIMEType, len(imgs[0].Data), imgs[0].Data[:min(8, len(imgs[0].Data))])
	}
	if !strings.Contains(text(res), "1 image(s) attached") {
		t.Errorf("text does not mention the image: %s", text(res))
	}
	// The image travels once: not again as base64 in structuredContent.
	sc, _ := json.Marshal(res.StructuredContent)
	if strings.Contains(string(sc), "iVBORw0KGgo") || !strings.Contains(string(sc), "results") {
		t.Errorf("structuredContent repeats the image: %.300s", sc)
	}
}

func TestRunShell(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	res := call(t, cs, "run_shell", map[string]any{"command": "echo \"it's\" \"$HOME\" > out.txt\ncat out.txt\necho oops >&2\nexit 3"})
	sc := structured(t, res)
	if !res.IsError || sc["exit_code"] != 3.0 || sc["stdout"] != "it's /workspace\n" || sc["stderr"] != "oops\n" {
		t.Errorf("exit 3: error=%v %v\n%s", res.IsError, sc, text(res))
	}
	if !strings.HasPrefix(text(res), "exit code 3") {
		t.Errorf("text: %s", text(res))
	}
	// Same sandbox and workspace as execute_python.
	res = call(t, cs, "execute_python", map[string]any{"code": "open('out.txt').read()"})
	if !strings.Contains(text(res), "it's /workspace") {
		t.Errorf("python does not see the shell's file: %s", text(res))
	}
	res = call(t, cs, "run_shell", map[string]any{"command": "true"})
	if res.IsError || structured(t, res)["exit_code"] != 0.0 {
		t.Errorf("true: %s", text(res))
	}
	// The shell reports a command killed by a signal as 128+N.
	res = call(t, cs, "run_shell", map[string]any{"command": "kill -9 $$"})
	if !res.IsError || structured(t, res)["exit_code"] != 137.0 {
		t.Errorf("kill -9: %v %s", structured(t, res), text(res))
	}
}

func TestFiles(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), &mcpserver.Options{MaxFileBytes: 100_000}), nil)
	res := call(t, cs, "write_file", map[string]any{"path": "data/in.csv", "content": "a,b\n1,2\n"})
	if res.IsError || structured(t, res)["bytes"] != 8.0 {
		t.Fatalf("write: %s", text(res))
	}
	res = call(t, cs, "execute_python", map[string]any{"code": "import csv\nrows = list(csv.reader(open('data/in.csv')))\nopen('/workspace/data/out.txt', 'w').write(str(len(rows)))\nrows"})
	if res.IsError || !strings.Contains(text(res), "[['a', 'b'], ['1', '2']]") {
		t.Fatalf("python reading the file: %s", text(res))
	}
	for _, p := range []string{"data/out.txt", "/workspace/data/out.txt"} {
		res = call(t, cs, "read_file", map[string]any{"path": p})
		if res.IsError || text(res) != "2" {
			t.Errorf("read %s: %q", p, text(res))
		}
	}
	call(t, cs, "write_file", map[string]any{"path": "data/empty.txt", "content": ""})
	if res := call(t, cs, "read_file", map[string]any{"path": "data/empty.txt"}); res.IsError || !strings.Contains(text(res), "is empty") {
		t.Errorf("read an empty file: %q", text(res))
	}
	res = call(t, cs, "list_files", map[string]any{"path": "data"})
	entries := structured(t, res)["entries"].([]any)
	if res.IsError || len(entries) != 3 || !strings.Contains(text(res), "in.csv  (8 bytes)") {
		t.Errorf("list: %s", text(res))
	}
	res = call(t, cs, "list_files", map[string]any{})
	if !strings.Contains(text(res), "data/") {
		t.Errorf("list root: %s", text(res))
	}
	call(t, cs, "execute_python", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1,2]); plt.savefig('p.png', dpi=10)\nopen('b.bin','wb').write(bytes(range(256)))"})
	res = call(t, cs, "read_file", map[string]any{"path": "p.png"})
	if len(res.Content) != 2 || res.Content[1].(*mcp.ImageContent).MIMEType != "image/png" {
		t.Errorf("read png: %s", text(res))
	}
	res = call(t, cs, "read_file", map[string]any{"path": "b.bin"})
	if res.IsError || !strings.Contains(text(res), "binary file") {
		t.Errorf("read binary: %s", text(res))
	}

	bad := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read_file", map[string]any{"path": "missing.txt"}, "no such file"},
		{"read_file", map[string]any{"path": "../etc/passwd"}, `".." is not allowed`},
		{"read_file", map[string]any{"path": "/etc/passwd"}, "outside /workspace"},
		{"read_file", map[string]any{"path": "data"}, "not a regular file"},
		{"write_file", map[string]any{"path": "big.txt", "content": strings.Repeat("x", 100_001)}, "limit of 100000 bytes"},
		{"write_file", map[string]any{"path": "/workspace", "content": "x"}, "path is empty"},
		{"list_files", map[string]any{"path": "nope"}, "no such file"},
	}
	for _, b := range bad {
		res := call(t, cs, b.tool, b.args)
		if !res.IsError || !strings.Contains(text(res), b.want) {
			t.Errorf("%s %v: error=%v %q, want %q", b.tool, b.args, res.IsError, text(res), b.want)
		}
	}
	// A symlink planted by code does not lead out of the workspace.
	call(t, cs, "run_shell", map[string]any{"command": "ln -s /etc/hostname link"})
	res = call(t, cs, "read_file", map[string]any{"path": "link"})
	if !res.IsError {
		t.Errorf("read through a symlink out of the workspace: %s", text(res))
	}
}

func TestResetSession(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	if res := call(t, cs, "reset_session", nil); res.IsError || !strings.Contains(text(res), "fresh") {
		t.Errorf("reset before use: %s", text(res))
	}
	call(t, cs, "execute_python", map[string]any{"code": "x = 1\nopen('keep.txt', 'w').write('k')"})
	if res := call(t, cs, "reset_session", map[string]any{}); res.IsError {
		t.Fatalf("reset: %s", text(res))
	}
	res := call(t, cs, "execute_python", map[string]any{"code": "import os\nprint(os.listdir('.'))\nx"})
	if !res.IsError || !strings.Contains(text(res), "NameError") || !strings.Contains(text(res), "['keep.txt']") {
		t.Errorf("after reset: %s", text(res))
	}
	if res := call(t, cs, "reset_session", map[string]any{"clear_files": true}); res.IsError || !strings.Contains(text(res), "emptied") {
		t.Fatalf("reset clear_files: %s", text(res))
	}
	res = call(t, cs, "list_files", nil)
	if n := len(structured(t, res)["entries"].([]any)); n != 0 {
		t.Errorf("%d files after clear_files: %s", n, text(res))
	}
}

func TestBadInput(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), &mcpserver.Options{MaxCodeBytes: 100}), nil)
	ctx := context.Background()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), `unknown tool "no_such_tool"`) {
		t.Errorf("unknown tool: %v", err)
	}
	bad := []struct {
		name string
		args map[string]any
		want string
	}{
		{"code of the wrong type", map[string]any{"code": 5}, "code"},
		{"no code", map[string]any{}, "code"},
		{"oversize code", map[string]any{"code": strings.Repeat("#", 101)}, "code is 101 bytes, more than the limit of 100 bytes"},
		{"negative timeout", map[string]any{"code": "1", "timeout_s": -1}, "timeout_s"},
		{"huge timeout", map[string]any{"code": "1", "timeout_s": 1e9}, "timeout_s"},
		{"timeout as a string", map[string]any{"code": "1", "timeout_s": "5"}, "timeout_s"},
		{"unknown argument", map[string]any{"code": "1", "cell": 2}, "cell"},
	}
	for _, b := range bad {
		res := call(t, cs, "execute_python", b.args)
		if !res.IsError || !strings.Contains(text(res), b.want) {
			t.Errorf("%s: error=%v %q, want it to mention %q", b.name, res.IsError, text(res), b.want)
		}
	}
	if res := call(t, cs, "run_shell", map[string]any{"command": 1}); !res.IsError || !strings.Contains(text(res), "command") {
		t.Errorf("run_shell command of the wrong type: %s", text(res))
	}
	// The server keeps serving.
	if res := call(t, cs, "execute_python", map[string]any{"code": "6*7"}); res.IsError || !strings.Contains(text(res), "42") {
		t.Errorf("after bad input: %s", text(res))
	}
}

func TestTimeoutKeepsState(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	call(t, cs, "execute_python", map[string]any{"code": "y = 'kept'"})
	res := call(t, cs, "execute_python", map[string]any{"code": "import time\nprint('start', flush=True)\ntime.sleep(60)", "timeout_s": 0.5})
	if !res.IsError || structured(t, res)["status"] != "timeout" || !strings.Contains(text(res), "timeout of 500ms") {
		t.Errorf("timeout: %s", text(res))
	}
	if res := call(t, cs, "execute_python", map[string]any{"code": "y"}); !strings.Contains(text(res), "'kept'") {
		t.Errorf("state after a timeout: %s", text(res))
	}
}

func TestDeadKernelIsRestarted(t *testing.T) {
	cs := connect(t, newServer(t, newSource(t), nil), nil)
	call(t, cs, "execute_python", map[string]any{"code": "open('f.txt', 'w').write('still here')"})
	res := call(t, cs, "execute_python", map[string]any{"code": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"})
	if !res.IsError || structured(t, res)["status"] != "killed" {
		t.Fatalf("kill: %s", text(res))
	}
	res = call(t, cs, "execute_python", map[string]any{"code": "open('f.txt').read()"})
	if res.IsError || !strings.Contains(text(res), "previous kernel had died") || !strings.Contains(text(res), "still here") {
		t.Errorf("after the kernel died: %s", text(res))
	}
}

func TestProgressNotifications(t *testing.T) {
	got := make(chan string, 100)
	cs := connect(t, newServer(t, newSource(t), nil), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			got <- req.Params.Message
		},
	})
	params := &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "print('step one', flush=True)\nimport time; time.sleep(0.2)"}}
	params.SetProgressToken("tok")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if msg != "step one" {
			t.Errorf("progress message %q", msg)
		}
	case <-time.After(10 * time.Second): // notifications may trail the result; a hang guard
		t.Error("no progress notification")
	}
}

func TestSessionPerConnection(t *testing.T) {
	src := newSource(t)
	srv := newServer(t, src, nil)
	a, b := connect(t, srv, nil), connect(t, srv, nil)
	call(t, a, "execute_python", map[string]any{"code": "secret = 'a'\nopen('a.txt', 'w').write('a')"})
	res := call(t, b, "execute_python", map[string]any{"code": "import os\nprint(os.listdir('.'))\nsecret"})
	if !strings.Contains(text(res), "NameError") || !strings.Contains(text(res), "[]") {
		t.Errorf("connection b sees a's session: %s", text(res))
	}
	if src.count() != 2 {
		t.Errorf("%d sessions for two connections", src.count())
	}
	// Closing a connection closes its session (and removes its workspace).
	a.Close()
	ws := waitClosed(t, src)
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workspace of the closed session still there: %v", err)
	}
	if res := call(t, b, "execute_python", map[string]any{"code": "1"}); res.IsError {
		t.Errorf("b after a closed: %s", text(res))
	}
}

func TestHTTPHandler(t *testing.T) {
	src := newSource(t)
	h, err := mcpserver.NewHTTPHandler(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	t.Cleanup(func() { h.Close() })
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	call(t, cs, "execute_python", map[string]any{"code": "z = 7"})
	if res := call(t, cs, "execute_python", map[string]any{"code": "z * 6"}); !strings.Contains(text(res), "42") {
		t.Errorf("state over HTTP: %s", text(res))
	}
	// Closing the client deletes the MCP session, which closes the sandbox.
	cs.Close()
	waitClosed(t, src)
}

func TestHTTPHostCheck(t *testing.T) {
	for _, checked := range []bool{false, true} {
		h, err := mcpserver.NewHTTPHandler(newSource(t), &mcpserver.Options{HostChecked: checked})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(h)
		t.Cleanup(ts.Close)
		t.Cleanup(func() { h.Close() })
		req, _ := http.NewRequest("POST", ts.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Host = "rebound.example"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if refused := resp.StatusCode == http.StatusForbidden; refused == checked {
			t.Errorf("HostChecked=%v: a foreign Host got status %d", checked, resp.StatusCode)
		}
	}
}
