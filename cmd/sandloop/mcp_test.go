package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/keeper"
	"github.com/sandloop/sandloop/internal/mcpserver/mcptest"
)

// asCLI makes this test binary act as the sandloop command, so tests can
// start `sandloop mcp` and `sandloop serve` as real processes without
// building the binary. It runs before TestMain.
const asCLI = "SANDLOOP_TEST_AS_CLI"

func init() {
	// A keeper started by a serve under test is this binary too (serve
	// --keep-sessions).
	keeper.MaybeRun()
	if os.Getenv(asCLI) == "1" {
		jail.MaybeInit() // a jail's init inherits the variable: it must stay an init
		os.Exit(execute(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
}

// cliCommand returns this binary started as `sandloop args...`.
func cliCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), asCLI+"=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

func TestMCPBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"mcp", "--tools", "execute_python,exec"}, `unknown tool "exec"`},
		{[]string{"mcp", "--timeout", "-1s"}, "--timeout must not be negative"},
		{[]string{"mcp", "--timeout", "5m", "--max-timeout", "1m"}, "longer than --max-timeout"},
		{[]string{"mcp", "--timeout", "11m"}, "longer than --max-timeout 10m0s"},
		{[]string{"mcp", "--max-timeout", "-1s"}, "--max-timeout must not be negative"},
		{[]string{"mcp", "--memory", "lots"}, "not a size"},
		{[]string{"mcp", "--env", "NOEQUALS"}, "must be KEY=VALUE"},
		{[]string{"mcp", "extra"}, "unknown command"},
	}
	for _, tt := range tests {
		code, out, errOut := sandloop(t, "", tt.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tt.want) {
			t.Errorf("sandloop %s: exit %d, stdout %q, stderr %q; want 2 and %q", strings.Join(tt.args, " "), code, out, errOut, tt.want)
		}
	}
}

// TestMCPStdioFlags drives `sandloop mcp` over real stdio with the Go SDK
// client and checks that its flags take effect.
func TestMCPStdioFlags(t *testing.T) {
	ctx := context.Background()
	cmd := cliCommand(ctx, "mcp", "--tools", "execute_python,read_file", "--env", "GREETING=hi", "--max-text", "100", "--max-code", "1K")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if !slices.Equal(names, []string{"execute_python", "read_file"}) {
		t.Errorf("--tools: %v", names)
	}
	callText := func(code string) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": code}})
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				parts = append(parts, tc.Text)
			}
		}
		return strings.Join(parts, "\n"), res.IsError
	}
	if txt, _ := callText("import os\nos.environ['GREETING']"); !strings.Contains(txt, "'hi'") {
		t.Errorf("--env: %s", txt)
	}
	if txt, _ := callText("print('a' * 300 + 'END')"); !strings.Contains(txt, "[... 204 bytes cut here") || !strings.Contains(txt, "END") {
		t.Errorf("--max-text 100: %s", txt)
	}
	if txt, isErr := callText(strings.Repeat("#", 1025)); !isErr || !strings.Contains(txt, "limit of 1024 bytes") {
		t.Errorf("--max-code 1K: %s", txt)
	}
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err) // the server exiting on EOF may race the client's own close
	}
	if t.Failed() {
		t.Logf("sandloop mcp stderr:\n%s", stderr.String())
	}
}

// TestTypeScriptClientStdio drives `sandloop mcp` with the official
// TypeScript MCP SDK client.
func TestTypeScriptClientStdio(t *testing.T) {
	mcptest.TSClient(t)
	t.Setenv(asCLI, "1") // for the server node starts: this binary, as sandloop
	mcptest.CheckTSResult(t, mcptest.RunTSClient(t, "stdio", os.Args[0], "mcp", "--memory", "1G"), false)
}

// TestTypeScriptClientServe drives /mcp of `sandloop serve` with the
// official TypeScript MCP SDK client.
func TestTypeScriptClientServe(t *testing.T) {
	mcptest.TSClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := cliCommand(ctx, "serve", "--addr", "127.0.0.1:0", "--pool", "0", "--data-dir", t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sandloop serve stderr:\n%s", stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("sandloop serve printed no address: %v", err)
	}
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+`).FindString(line)
	if url == "" {
		t.Fatalf("no URL in %q", line)
	}
	mcptest.CheckTSResult(t, mcptest.RunTSClient(t, "http", url+"/mcp"), true)
}

// `sandloop mcp` answers a line that is not JSON with a parse error and
// keeps serving, and answers every request it received before its input
// ended (`printf ... | sandloop mcp`).
func TestMCPStdioBadLineAndEOF(t *testing.T) {
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{not json`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"hello":"world","id":7}`,
		`{"jsonrpc":"2.0","id":3,"method":"ping"}`,
	}, "\n") + "\n"
	code, out, errOut := sandloop(t, in, "mcp")
	short := out
	if len(short) > 2000 {
		short = short[:2000] + "…"
	}
	if code != 0 {
		t.Errorf("exit code %d (stderr %q)", code, errOut)
	}
	got := map[string]map[string]any{} // id → response
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("stdout line %q: %v", line, err)
		}
		got[fmt.Sprint(m["id"])] = m
	}
	errCode := func(id string) float64 {
		e, _ := got[id]["error"].(map[string]any)
		c, _ := e["code"].(float64)
		return c
	}
	if errCode("<nil>") != -32700 {
		t.Errorf("no parse error (-32700, id null) for the line that is not JSON; stdout:\n%s", short)
	}
	if errCode("7") != -32600 {
		t.Errorf("no invalid-request error (-32600, id 7) for the line that is not JSON-RPC; stdout:\n%s", short)
	}
	for _, id := range []string{"1", "2", "3"} {
		if got[id]["result"] == nil {
			t.Errorf("request %s has no result; stdout:\n%s", id, short)
		}
	}
	res, _ := got["2"]["result"].(map[string]any)
	if tools, _ := res["tools"].([]any); len(tools) == 0 {
		t.Errorf("tools/list answered no tools: %v", got["2"])
	}
}
