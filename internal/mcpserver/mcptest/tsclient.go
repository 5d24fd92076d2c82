// Package mcptest drives sandloop's MCP server with a client nobody here
// wrote: the official TypeScript MCP SDK (testdata/tsclient/client.mjs of
// package mcpserver). The tests of mcpserver (HTTP handler) and of the
// sandloop command (stdio, serve) share it.
package mcptest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/mcpserver"
)

// tsclientDir is internal/mcpserver/testdata/tsclient, found from this
// file so that tests of any package can use it.
func tsclientDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "tsclient")
}

var npmOnce struct {
	sync.Once
	err error
	out []byte
}

// TSClient returns the path of client.mjs, installing its packages with
// `npm ci` (from the committed package-lock.json) the first time.
func TSClient(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the TypeScript MCP client test needs %s (Node.js 18 or newer) on PATH", tool)
		}
	}
	npmOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(tsclientDir(), "node_modules", "@modelcontextprotocol", "sdk")); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = tsclientDir()
		npmOnce.out, npmOnce.err = cmd.CombinedOutput()
	})
	if npmOnce.err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", tsclientDir(), npmOnce.err, npmOnce.out)
	}
	p, err := filepath.Abs(filepath.Join(tsclientDir(), "client.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TSResult is what client.mjs prints.
type TSResult struct {
	Tools []struct {
		Name            string         `json:"name"`
		Annotations     map[string]any `json:"annotations"`
		Required        []string       `json:"required"`
		HasOutputSchema bool           `json:"hasOutputSchema"`
	} `json:"tools"`
	State1, State2, Plot, PyError, Write, PyRead, PyWrite, Read, List, Shell, AfterBadInput TSCall
	UnknownTool, WrongType                                                                  struct {
		Refused bool   `json:"refused"`
		Code    int    `json:"code"`
		Message string `json:"message"`
		Result  TSCall `json:"result"`
	}
}

// TSCall is what client.mjs saw of one tool call.
type TSCall struct {
	IsError    bool           `json:"isError"`
	Text       string         `json:"text"`
	Structured map[string]any `json:"structured"`
	Images     []struct {
		MIMEType string `json:"mimeType"`
		Magic    string `json:"magic"`
	} `json:"images"`
}

// RunTSClient runs client.mjs with args and decodes what it saw.
func RunTSClient(t *testing.T, args ...string) *TSResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, "node", append([]string{TSClient(t)}, args...)...)
	cmd.Dir = tsclientDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var r TSResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("client output: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return &r
}

// CheckTSResult checks the scenarios of client.mjs. canFork says the
// server's sessions can fork and be snapshotted (serve's /mcp, with its
// snapshot store), so it offers fork_session and snapshot.
func CheckTSResult(t *testing.T, r *TSResult, canFork bool) {
	t.Helper()
	var names []string
	for _, tool := range r.Tools {
		names = append(names, tool.Name)
		if tool.Annotations == nil {
			t.Errorf("%s: no annotations", tool.Name)
		}
	}
	slices.Sort(names)
	want := slices.Clone(mcpserver.ToolNames)
	if !canFork {
		want = slices.DeleteFunc(want, func(n string) bool { return n == "fork_session" || n == "snapshot" })
	}
	if slices.Sort(want); !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
	for _, tool := range r.Tools {
		if tool.Name == "read_file" && tool.Annotations["readOnlyHint"] != true {
			t.Errorf("read_file annotations %v", tool.Annotations)
		}
		if tool.Name == "execute_python" && (!slices.Equal(tool.Required, []string{"code"}) || !tool.HasOutputSchema) {
			t.Errorf("execute_python: required %v, output schema %v", tool.Required, tool.HasOutputSchema)
		}
	}

	// State kept between calls.
	if r.State1.IsError || !strings.Contains(r.State1.Text, "hello from the sandbox") {
		t.Errorf("first execution: %+v", r.State1)
	}
	if r.State2.IsError || !strings.Contains(r.State2.Text, "--- result ---\n42") || r.State2.Structured["execution_count"] != 2.0 {
		t.Errorf("second execution (state kept?): %+v", r.State2)
	}
	// A plot comes back as an image.
	if r.Plot.IsError || len(r.Plot.Images) != 1 || r.Plot.Images[0].MIMEType != "image/png" || r.Plot.Images[0].Magic != "89504e470d0a1a0a" {
		t.Errorf("plot: error=%v images=%+v text=%q", r.Plot.IsError, r.Plot.Images, r.Plot.Text)
	}
	// A Python error is a tool error result with the traceback.
	if !r.PyError.IsError || !strings.Contains(r.PyError.Text, "ZeroDivisionError: division by zero") || !strings.Contains(r.PyError.Text, "in f") {
		t.Errorf("python error: %+v", r.PyError)
	}
	if e, _ := r.PyError.Structured["error"].(map[string]any); e["name"] != "ZeroDivisionError" {
		t.Errorf("python error structuredContent: %v", r.PyError.Structured)
	}
	// Files written and read back, both ways.
	if r.Write.IsError || r.Write.Structured["bytes"] != 33.0 {
		t.Errorf("write_file: %+v", r.Write)
	}
	if !strings.Contains(r.PyRead.Text, "WRITTEN BY THE TYPESCRIPT CLIENT") {
		t.Errorf("python reading the written file: %+v", r.PyRead)
	}
	if r.Read.IsError || r.Read.Text != "a,b\n1,2\n" {
		t.Errorf("read_file of python's file: %+v", r.Read)
	}
	if r.List.IsError || !strings.Contains(r.List.Text, "made_by_python.csv  (8 bytes)") || !strings.Contains(r.List.Text, "notes/") {
		t.Errorf("list_files: %+v", r.List)
	}
	if r.Shell.IsError || r.Shell.Structured["stdout"] != "2\nhello.txt\n" || r.Shell.Structured["exit_code"] != 0.0 {
		t.Errorf("run_shell: %+v", r.Shell)
	}
	// Bad input: an unknown tool is a protocol error, a wrong argument type
	// a tool error naming the argument; the server keeps serving.
	if !r.UnknownTool.Refused || !strings.Contains(r.UnknownTool.Message, `unknown tool "no_such_tool"`) {
		t.Errorf("unknown tool: %+v", r.UnknownTool)
	}
	if r.WrongType.Refused || !r.WrongType.Result.IsError || !strings.Contains(r.WrongType.Result.Text, "/properties/code") {
		t.Errorf("wrong argument type: %+v", r.WrongType)
	}
	if r.AfterBadInput.IsError || !strings.Contains(r.AfterBadInput.Text, "82") {
		t.Errorf("after bad input: %+v", r.AfterBadInput)
	}
}
