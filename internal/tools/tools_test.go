package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/sandloop/sandloop/internal/workspace"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	os.Exit(m.Run())
}

// sandbox is a real session as the tools use it.
type sandbox struct{ *session.Session }

func (s sandbox) Files(context.Context) (tools.Files, error) {
	return s.Session.Files(workspace.Options{})
}

func newSandbox(t *testing.T) sandbox {
	t.Helper()
	s, err := session.New(context.Background(), &session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return sandbox{s}
}

func newSet(t *testing.T, cfg tools.Config, names ...string) *tools.Set {
	t.Helper()
	if names == nil {
		names = tools.Names()
	}
	set, err := tools.New(cfg, names...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func callLLM(t *testing.T, set *tools.Set, sess tools.Session, name string, args map[string]any) *tools.Result {
	t.Helper()
	b, _ := json.Marshal(args)
	res, err := set.Call(context.Background(), sess, name, string(b), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", name, b, err)
	}
	return res
}

// TestSchemas checks that every tool's schema is generated from its input
// type, resolves, and reaches both faces the same.
func TestSchemas(t *testing.T) {
	set := newSet(t, tools.Config{MaxTimeout: time.Minute})
	required := map[string][]string{
		tools.ExecutePython: {"code"}, tools.RunShell: {"command"}, tools.WriteFile: {"content", "path"},
		tools.ReadFile: {"path"}, tools.EditFile: {"new_text", "old_text", "path"}, tools.ListFiles: nil,
		tools.StartProcess: {"command", "name"}, tools.ProcessOutput: {"name"}, tools.StopProcess: {"name"},
		tools.InstallPackages: {"names"}, tools.ResetSession: nil,
		tools.CheckpointName: nil, tools.Undo: nil, tools.ForkSession: nil, tools.SnapshotName: nil,
	}
	llmTools := map[string]json.RawMessage{}
	for _, lt := range set.ToLLM() {
		llmTools[lt.Name] = lt.Parameters
	}
	if len(set.Tools()) != len(required) || len(llmTools) != len(required) {
		t.Fatalf("%d tools, %d for the LLM; want %d", len(set.Tools()), len(llmTools), len(required))
	}
	for _, tool := range set.Tools() {
		s := tool.InputSchema
		if s.Type != "object" || len(s.Properties) == 0 && tool.Name != tools.ResetSession {
			t.Errorf("%s: schema %+v", tool.Name, s)
		}
		if _, err := s.Resolve(nil); err != nil {
			t.Errorf("%s: schema does not resolve: %v", tool.Name, err)
		}
		got := slices.Sorted(slices.Values(s.Required))
		if !slices.Equal(got, required[tool.Name]) {
			t.Errorf("%s: required %v, want %v", tool.Name, got, required[tool.Name])
		}
		for name, p := range s.Properties {
			if p.Description == "" && name != "clear_files" {
				t.Errorf("%s: argument %s has no description", tool.Name, name)
			}
		}
		// The LLM face sends the same schema.
		var back jsonschema.Schema
		if err := json.Unmarshal(llmTools[tool.Name], &back); err != nil || !slices.Equal(slices.Sorted(slices.Values(back.Required)), got) {
			t.Errorf("%s: LLM schema %s: %v", tool.Name, llmTools[tool.Name], err)
		}
		if len(tool.Description) < 60 || strings.Contains(tool.Description, "{{") {
			t.Errorf("%s: description %q", tool.Name, tool.Description)
		}
		if tool.Annotations == nil || tool.Annotations.Title == "" {
			t.Errorf("%s: no annotations", tool.Name)
		}
	}
	b, _ := json.Marshal(set.Tools()[0].InputSchema)
	for _, want := range []string{`"maximum":60`, `"exclusiveMinimum":0`, `"additionalProperties":false`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("execute_python schema lacks %s: %s", want, b)
		}
	}
	if _, err := tools.New(tools.Config{}, "exec"); err == nil || !strings.Contains(err.Error(), `unknown tool "exec"`) {
		t.Errorf("unknown tool: %v", err)
	}
}

// TestArgumentsCheckedLikeMCP: the LLM face checks a call against the
// same schema as an MCP client's call is checked.
func TestArgumentsCheckedLikeMCP(t *testing.T) {
	set := newSet(t, tools.Config{MaxTimeout: time.Minute})
	for _, tt := range []struct{ name, args, want string }{
		{tools.ExecutePython, `{}`, "code"},
		{tools.ExecutePython, `{"code": 5}`, `argument "code" must be string`},
		{tools.ExecutePython, `{"code": "1", "timeout_s": 61}`, "timeout_s"},
		{tools.ExecutePython, `{"code": "1", "cell": 2}`, "cell"},
		{tools.RunShell, `{"command": "  "}`, "command is empty"},
		{tools.ReadFile, `{"path": "/etc/passwd"}`, "outside /workspace"},
		{tools.ReadFile, `{"path": "a", "offset": -1}`, "offset"},
		{"launch_rockets", `{}`, `no tool "launch_rockets"`},
		{tools.WriteFile, `{"path": "a"`, "not a valid JSON object"},
	} {
		_, err := set.Call(context.Background(), nil, tt.name, tt.args, nil)
		var ae *tools.ArgumentError
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &ae) {
			t.Errorf("%s %s: %v, want an ArgumentError about %q", tt.name, tt.args, err, tt.want)
		}
	}
}

// mcpFace serves set over an in-memory MCP connection whose calls run in sess.
func mcpFace(t *testing.T, set *tools.Set, sess tools.Session) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	srv := mcp.NewServer(&mcp.Implementation{Name: "tools-test", Version: "1"}, nil)
	set.AddToMCP(srv, func(context.Context, *mcp.CallToolRequest) (tools.Session, kernel.EventFunc, error) {
		return sess, nil, nil
	})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := srv.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func mcpText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// sameDuration blanks the duration and the cost line, the parts of a shell
// result that differ between two runs.
func sameDuration(s string) string {
	s = reCost.ReplaceAllString(s, "cost: ...\n")
	i := strings.Index(s, "status: ")
	j := strings.Index(s, ")\n")
	if i < 0 || j < i {
		return s
	}
	return s[:i] + s[j:]
}

var reCostLine = regexp.MustCompile(`(?m)^cost: \d+\.\d+ m?s CPU, peak \d+(\.\d)? [KMG]iB memory$`)

var reCost = regexp.MustCompile(`(?m)^cost: .*\n`)

// TestRunShellBothFaces: one run_shell, bash, with the same result through
// the agent's face and MCP's.
func TestRunShellBothFaces(t *testing.T) {
	set := newSet(t, tools.Config{}, tools.RunShell)
	sess := newSandbox(t)
	cs := mcpFace(t, set, sess)
	for _, tt := range []struct {
		command string
		exit    float64
		stdout  string
	}{
		{`[[ -n "$BASH_VERSION" ]] && echo "bash, it's $HOME"`, 0, "bash, it's /workspace\n"},
		{"echo out; echo err >&2; exit 3", 3, "out\n"},
		{"kill -9 $$", 137, ""}, // a shell reports a command killed by signal N as 128+N
		{"printf '%s\\n' \"a'b\" 'c\"d' `echo e`\nset -o pipefail; false | true", 1, "a'b\nc\"d\ne\n"},
	} {
		llmRes := callLLM(t, set, sess, tools.RunShell, map[string]any{"command": tt.command})
		mres, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tools.RunShell, Arguments: map[string]any{"command": tt.command}})
		if err != nil {
			t.Fatal(err)
		}
		sh := llmRes.Structured.(*tools.ShellOutput)
		if sh.ExitCode == nil || float64(*sh.ExitCode) != tt.exit || sh.Stdout != tt.stdout || llmRes.IsError != (tt.exit != 0) {
			t.Errorf("%q: exit %v stdout %q error %v\n%s", tt.command, sh.ExitCode, sh.Stdout, llmRes.IsError, llmRes.Text)
		}
		var msh map[string]any
		b, _ := json.Marshal(mres.StructuredContent)
		json.Unmarshal(b, &msh)
		if msh["exit_code"] != tt.exit || msh["stdout"] != tt.stdout || mres.IsError != llmRes.IsError {
			t.Errorf("%q over MCP: %s", tt.command, b)
		}
		// What the execution cost, measured by the jail's cgroup, is in the
		// text both faces show.
		if !reCostLine.MatchString(llmRes.Text) || !reCostLine.MatchString(mcpText(mres)) {
			t.Errorf("%q: no cost line:\n%s\n---\n%s", tt.command, llmRes.Text, mcpText(mres))
		}
		if a, b := sameDuration(llmRes.Text), sameDuration(mcpText(mres)); a != b {
			t.Errorf("%q: the faces differ:\n%s\n---\n%s", tt.command, a, b)
		}
		if tt.exit != 0 && (llmRes.Exec.Error == nil || llmRes.Exec.Error.Name != "CommandFailed" || llmRes.Exec.Error.Traceback != "") {
			t.Errorf("%q: the execution shows the helper's error: %+v", tt.command, llmRes.Exec.Error)
		}
	}
}

// TestRunShellBackgroundChild: a command that leaves a child holding its
// stdout returns when the command ends, not when the child does.
func TestRunShellBackgroundChild(t *testing.T) {
	set := newSet(t, tools.Config{}, tools.RunShell)
	sess := newSandbox(t)
	// If the call waited for the child it would hit its 30 s limit (the
	// child sleeps 300 s) and report a timeout.
	res := callLLM(t, set, sess, tools.RunShell, map[string]any{"command": "sleep 300 & echo started", "timeout_s": 30})
	sh := res.Structured.(*tools.ShellOutput)
	if sh.Status != "ok" || sh.ExitCode == nil || *sh.ExitCode != 0 || sh.Stdout != "started\n" {
		t.Errorf("background child: %+v\n%s", sh, res.Text)
	}
	// The session goes on.
	if res := callLLM(t, set, sess, tools.RunShell, map[string]any{"command": "echo next"}); res.IsError || !strings.Contains(res.Text, "next") {
		t.Errorf("after: %s", res.Text)
	}
}

// TestStopProcess: stop_process ends a process that ignores SIGTERM, and
// its children, within its grace period.
func TestStopProcess(t *testing.T) {
	set := newSet(t, tools.Config{}, tools.StartProcess, tools.ProcessOutput, tools.StopProcess, tools.RunShell)
	sess := newSandbox(t)
	res := callLLM(t, set, sess, tools.StartProcess, map[string]any{"name": "stubborn", "command": "trap '' TERM; echo up; sleep 300 & wait; sleep 300"})
	if res.IsError || !strings.Contains(res.Text, "running") || !strings.Contains(res.Text, "up") {
		t.Fatalf("start: %s", res.Text)
	}
	start := time.Now()
	res = callLLM(t, set, sess, tools.StopProcess, map[string]any{"name": "stubborn"})
	took := time.Since(start)
	if res.IsError || !strings.Contains(res.Text, "ignored SIGTERM") {
		t.Errorf("stop: %s", res.Text)
	}
	// The old stop waited 5 s for SIGTERM; a hang guard, not a timing claim.
	if took > 5*time.Second {
		t.Errorf("stop_process took %v", took)
	}
	t.Logf("stop_process took %v", took)
	// Exit 7: no process named sleep runs in the sandbox (a killed one
	// the sandbox's init has not reaped yet, a zombie, runs no more).
	res = callLLM(t, set, sess, tools.RunShell, map[string]any{"command": `for d in /proc/[0-9]*; do read c < "$d/comm" && [[ $c == sleep ]] && read -r s < "$d/stat" && s=${s##*) } && [[ ${s:0:1} != Z ]] && exit 0; done; exit 7`})
	if sh := res.Structured.(*tools.ShellOutput); sh.ExitCode == nil || *sh.ExitCode != 7 {
		t.Errorf("a sleep is still running: %s", res.Text)
	}
	if res := callLLM(t, set, sess, tools.ProcessOutput, map[string]any{"name": "stubborn"}); !res.IsError || !strings.Contains(res.Text, "no process named") {
		t.Errorf("output after stop: %s", res.Text)
	}
}

// TestFilesLLMFace: the agent's face numbers lines and edits in place.
func TestFilesLLMFace(t *testing.T) {
	set := newSet(t, tools.Config{NumberLines: true}, tools.WriteFile, tools.ReadFile, tools.EditFile, tools.ListFiles)
	sess := newSandbox(t)
	if res := callLLM(t, set, sess, tools.WriteFile, map[string]any{"path": "/workspace/a/x.py", "content": "a = 1\nb = 2\n"}); !slices.Equal(res.Changed, []string{"a/x.py"}) {
		t.Errorf("write: %+v", res)
	}
	if res := callLLM(t, set, sess, tools.EditFile, map[string]any{"path": "a/x.py", "old_text": "b = 2", "new_text": "b = 3"}); res.Text != "edited a/x.py" {
		t.Errorf("edit: %s", res.Text)
	}
	if res := callLLM(t, set, sess, tools.ReadFile, map[string]any{"path": "a/x.py"}); res.Text != "    1| a = 1\n    2| b = 3" {
		t.Errorf("read: %q", res.Text)
	}
	if res := callLLM(t, set, sess, tools.ListFiles, map[string]any{"path": "a"}); res.Text != "/workspace/a: 1 entries\nx.py  (12 bytes)" {
		t.Errorf("list: %q", res.Text)
	}
}

// A listed host loopback port is described to the model with the name that
// reaches it: localhost in the sandbox is the sandbox's own.
func TestDescriptionsNameTheHostLoopback(t *testing.T) {
	for _, tc := range []struct {
		allow []string
		want  bool
	}{{[]string{"pypi", "localhost:8000"}, true}, {[]string{"pypi"}, false}} {
		set := newSet(t, tools.Config{Allow: tc.allow}, tools.ExecutePython)
		d := set.Tools()[0].Description
		if got := strings.Contains(d, "host.sandloop.internal:8000") && strings.Contains(d, "sandbox's own loopback"); got != tc.want {
			t.Errorf("allow %v: mentions the host's loopback = %v:\n%s", tc.allow, got, d)
		}
	}
}
