package main

import (
	"archive/zip"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// useModel points the CLI at a local server speaking the OpenAI wire format.
func useModel(t *testing.T, script llmtest.Script) *llmtest.Server {
	srv := llmtest.NewOpenAIServer(t, script)
	t.Setenv("SANDLOOP_MODEL", "openai/gpt-4o-mini")
	t.Setenv("OPENAI_BASE_URL", srv.URL)
	t.Setenv("OPENAI_API_KEY", "test-key")
	t.Setenv("ANTHROPIC_API_KEY", "")
	return srv
}

func tc(name, args string) []llmtest.ToolCall {
	return []llmtest.ToolCall{{Name: name, Arguments: args}}
}

func TestAgentCLIGenerateRunsAndHistory(t *testing.T) {
	useModel(t, llmtest.Script{
		{Text: "I'll write the script.", ToolCalls: tc("write_file", `{"path":"squares.py","content":"print([i*i for i in range(5)])\n"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 squares.py"}`)},
		{ToolCalls: tc("finish", `{"summary":"squares.py prints the first five squares"}`)},
	})
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "result")
	code, stdout, stderr := sandloop(t, "", "agent", "print the first five squares", "--data-dir", data, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"task: print the first five squares", "── step 1 · write_file", "$ python3 squares.py", "[0, 1, 4, 9, 16]", "✓ ok", "══ done after 3 steps", "+print([i*i for i in range(5)])"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("progress lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\x1b[") {
		t.Error("colors on a non-terminal")
	}
	if strings.Contains(stdout+stderr, "level=") {
		t.Errorf("log lines in the normal output (they belong behind -v):\n%s", stderr)
	}
	if b, err := os.ReadFile(filepath.Join(out, "squares.py")); err != nil || !strings.Contains(string(b), "i*i") {
		t.Errorf("--out: %q %v", b, err)
	}
	code, stdout, _ = sandloop(t, "", "runs", "ls", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "done") || !strings.Contains(stdout, "print the first five squares") {
		t.Fatalf("runs ls: %d %s", code, stdout)
	}
	id := strings.Fields(strings.Split(stdout, "\n")[1])[0]
	code, stdout, _ = sandloop(t, "", "runs", "show", id[:8], "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "[run_shell ok]") || !strings.Contains(stdout, "squares.py (") || !strings.Contains(stdout, "summary: squares.py prints") {
		t.Errorf("runs show: %d\n%s", code, stdout)
	}
	zipPath := filepath.Join(t.TempDir(), "run.zip")
	if code, _, stderr := sandloop(t, "", "runs", "export", id, "-o", zipPath, "--data-dir", data); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	zr, err := zip.OpenReader(zipPath)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	names := map[string]bool{}
	for _, f := range zr.File {
		names[f.Name] = true
	}
	for _, want := range []string{"run.json", "steps.json", "events.jsonl", "files/squares.py"} {
		if !names[want] {
			t.Errorf("export lacks %s: %v", want, names)
		}
	}
	if code, _, stderr := sandloop(t, "", "runs", "show", "zzzz", "--data-dir", data); code != 2 || !strings.Contains(stderr, "no run") {
		t.Errorf("unknown run: %d %s", code, stderr)
	}
}

func TestAgentCLIJSONAndDebug(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("edit_file", `{"path":"div.py","old_text":"return a / b","new_text":"return a / b if b else 0.0"}`)},
		{ToolCalls: tc("finish", `{"summary":"guarded the division","root_cause":"ratio() divides by a zero count"}`)},
	})
	dir := t.TempDir()
	prog := filepath.Join(dir, "div.py")
	os.WriteFile(prog, []byte("def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n"), 0o644)
	code, stdout, stderr := sandloop(t, "", "agent", "--mode", "debug", "-f", prog, "--json", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	var last map[string]any
	types := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("not NDJSON: %q", sc.Text())
		}
		types[e["type"].(string)]++
		last = e
	}
	rep, _ := last["report"].(map[string]any)
	if last["type"] != "run_finished" || rep["status"] != "done" || rep["root_cause"] == "" || types["tool_result"] != 2 {
		t.Errorf("events %v, last %v", types, last)
	}
	repro, _ := rep["reproduction"].(map[string]any)
	if repro["error"] != "ZeroDivisionError" {
		t.Errorf("reproduction %v", repro)
	}
}

func TestAgentCLIBadInputAndNoModel(t *testing.T) {
	t.Setenv("SANDLOOP_MODEL", "")
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	t.Setenv("ANTHROPIC_API_KEY", "")
	t.Setenv("OPENROUTER_API_KEY", "")
	t.Setenv("OLLAMA_HOST", "127.0.0.1:1") // nothing listens on port 1
	data := t.TempDir()
	code, _, stderr := sandloop(t, "", "agent", "do something", "--data-dir", data)
	if code != 2 || !strings.Contains(stderr, "no language model configured") || !strings.Contains(stderr, "OPENAI_API_KEY") || !strings.Contains(stderr, "ollama/") {
		t.Errorf("no model: %d %s", code, stderr)
	}
	// The model is checked before the zygote starts: -v would log its start.
	code, _, stderr = sandloop(t, "", "agent", "do something", "-v", "--model", "nosuch/x", "--data-dir", data)
	if code != 2 || !strings.Contains(stderr, `unknown model provider "nosuch"`) || strings.Contains(stderr, "zygote") {
		t.Errorf("unknown provider: %d %s", code, stderr)
	}
	for _, args := range [][]string{
		{"agent"},
		{"agent", "x", "--mode", "refactorish"},
		{"agent", "--mode", "debug"},
		{"agent", "x", "-f", "/nonexistent/file.py"},
		{"agent", "x", "--max-steps", "0"},
	} {
		code, _, stderr := sandloop(t, "", append(args, "--data-dir", data)...)
		if code != 2 || stderr == "" {
			t.Errorf("%v: exit %d %q", args, code, stderr)
		}
	}
}

func TestAgentCLIConfirm(t *testing.T) {
	// A prompt needs a terminal: piped stdin is refused up front.
	useModel(t, llmtest.Script{})
	if code, _, stderr := sandloop(t, "y\n", "agent", "t", "--confirm", "--data-dir", t.TempDir()); code != 2 || !strings.Contains(stderr, "--confirm") || !strings.Contains(stderr, "terminal") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("--confirm with piped stdin: exit %d %q", code, stderr)
	}

	srv := useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print('declined code ran')"}`)},
		{ToolCalls: tc("execute_python", `{"code":"print('declined code ran')"}`)},
		{ToolCalls: tc("execute_python", `{"code":"print('declined code ran')"}`)},
		{ToolCalls: tc("execute_python", `{"code":"print('approved')"}`)},
		{ToolCalls: tc("finish", `{"summary":"ok"}`)},
	})
	master, tty := openPty(t)
	cmd := cliCommand(t.Context(), "agent", "t", "--confirm", "--data-dir", t.TempDir())
	var stdout, stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	go io.Copy(io.Discard, master) // the terminal's echo
	master.Write([]byte("n\nn\nn\ny\n"))
	err := cmd.Wait()
	if err != nil || strings.Count(stderr.String(), "run this execute_python? [y/N] ") != 4 {
		t.Fatalf("%v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if strings.Contains(stdout.String(), "\ndeclined code ran\n") || !strings.Contains(stdout.String(), "\napproved\n") {
		t.Errorf("declined code ran, or approved code did not:\n%s", stdout.String())
	}
	// Declining is not failing: the model is told the user said no, never
	// that it repeated the same failing call.
	for i := 1; i <= 3; i++ {
		res := srv.Requests()[i].ToolResults()
		if text := res[len(res)-1].Text; !strings.Contains(text, "declined") || strings.Contains(text, "failed the same way") {
			t.Errorf("request %d tells the model %q", i+1, text)
		}
	}
}

// --timeout bounds each of the agent's executions, as it does run's: the
// model's 30 s sleep is interrupted after 1 s, and the model is told so.
func TestAgentCLITimeoutBoundsEachExecution(t *testing.T) {
	srv := useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"import time\ntime.sleep(30)"}`)},
		{ToolCalls: tc("execute_python", `{"code":"print('quick')"}`)},
		{ToolCalls: tc("finish", `{"summary":"slept less"}`)},
	})
	code, stdout, stderr := sandloop(t, "", "agent", "sleep a while", "--timeout", "1s", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	res := srv.Requests()[1].ToolResults()
	if len(res) != 1 || !strings.Contains(res[0].Text, "status: timeout") || !strings.Contains(res[0].Text, "timeout of 1s") {
		t.Errorf("the execution was not bounded by --timeout 1s: %+v", res)
	}
}

// --out is checked before the run (no model call for a bad one); "." works;
// files already there are overwritten only with --force, and input files
// the run did not change are not rewritten.
func TestAgentCLIOutRules(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	notDir := writeFile(t, dir, "notes.txt", "mine\n")
	srv := useModel(t, llmtest.Script{})
	if code, _, stderr := sandloop(t, "", "agent", "t", "--out", notDir, "--data-dir", t.TempDir()); code != 2 || !strings.Contains(stderr, "not a directory") || len(srv.Requests()) != 0 {
		t.Fatalf("--out FILE: exit %d, %d model calls, %s", code, len(srv.Requests()), stderr)
	}
	if code, _, stderr := sandloop(t, "", "agent", "t", "--out", filepath.Join(dir, "no", "such"), "--data-dir", t.TempDir()); code != 2 || !strings.Contains(stderr, "--out") || len(srv.Requests()) != 0 {
		t.Fatalf("--out in a missing directory: exit %d, %s", code, stderr)
	}

	input := writeFile(t, dir, "data.txt", "1 2 3\n")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(input, old, old); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "sum.py", "# the user's own sum.py\n")
	script := llmtest.Script{
		{ToolCalls: tc("write_file", `{"path":"sum.py","content":"print(sum(map(int, open('data.txt').read().split())))\n"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 sum.py"}`)},
		{ToolCalls: tc("finish", `{"summary":"sum.py prints 6"}`)},
	}
	data := t.TempDir()
	useModel(t, script)
	code, _, stderr := sandloop(t, "", "agent", "sum the numbers", "-f", "data.txt", "--out", ".", "--data-dir", data)
	if code != 2 || !strings.Contains(stderr, "would overwrite 1 existing file(s) (sum.py)") || !strings.Contains(stderr, "--force") {
		t.Fatalf("--out . over the user's sum.py: exit %d\n%s", code, stderr)
	}
	if b, _ := os.ReadFile("sum.py"); string(b) != "# the user's own sum.py\n" {
		t.Fatalf("sum.py was overwritten without --force: %q", b)
	}
	useModel(t, script)
	code, _, stderr = sandloop(t, "", "agent", "sum the numbers", "-f", "data.txt", "--out", ".", "--force", "--data-dir", data)
	if code != 0 || !strings.Contains(stderr, "1 final file(s) written to .") {
		t.Fatalf("--out . --force: exit %d\n%s", code, stderr)
	}
	if b, _ := os.ReadFile("sum.py"); !strings.Contains(string(b), "print(sum(") {
		t.Errorf("--force did not write sum.py: %q", b)
	}
	if fi, err := os.Stat(input); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("the unchanged input data.txt was rewritten: %v %v", fi.ModTime(), err)
	}
}

// Refactor mode needs no task: it means "refactor these files without
// changing their behaviour"; agent --help lists all four modes.
func TestAgentCLIRefactorWithoutTask(t *testing.T) {
	srv := useModel(t, llmtest.Script{
		{ToolCalls: tc("finish", `{"summary":"already clean"}`)},
	})
	dir := t.TempDir()
	prog := filepath.Join(dir, "legacy.py")
	os.WriteFile(prog, []byte("print(sum(range(10)))\n"), 0o644)
	code, stdout, stderr := sandloop(t, "", "agent", "--mode", "refactor", "-f", prog, "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	reqs := srv.Requests()
	if len(reqs) == 0 || !strings.Contains(string(reqs[0].Body), "without changing their behaviour") {
		t.Errorf("the model was not told to refactor without changing behaviour (%d requests)", len(reqs))
	}
	code, stdout, _ = sandloop(t, "", "agent", "--help")
	for _, m := range []string{"generate", "debug", "refactor", "app"} {
		if code != 0 || !strings.Contains(stdout, "\n  "+m+" ") {
			t.Errorf("agent --help does not list mode %s:\n%s", m, stdout)
		}
	}
}

// --max-cost with a model of unknown price is said at the start not to be
// enforced, with what to use instead.
func TestAgentCLIMaxCostUnknownPrice(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print(6*7)"}`)},
		{ToolCalls: tc("finish", `{"summary":"42"}`)},
	})
	t.Setenv("SANDLOOP_MODEL", "openai/some-local-model")
	code, stdout, stderr := sandloop(t, "", "agent", "t", "--max-cost", "0.5", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	out := stdout + stderr
	i := strings.Index(out, "not enforced")
	if i < 0 || !strings.Contains(out[i:], "--max-tokens") || !strings.Contains(out[i:], "--prices") {
		t.Fatalf("no warning that --max-cost is not enforced:\n%s\n%s", stdout, stderr)
	}
	if j := strings.Index(stdout, "42"); strings.Contains(stdout, "not enforced") && j < strings.Index(stdout, "not enforced") {
		t.Errorf("the warning comes after the run's output:\n%s", stdout)
	}
	// The server at OPENAI_BASE_URL is not OpenAI: a model it calls gpt-4o-mini is not
	// charged OpenAI's list price either.
	t.Setenv("SANDLOOP_MODEL", "openai/gpt-4o-mini")
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print(6*7)"}`)},
		{ToolCalls: tc("finish", `{"summary":"42"}`)},
	})
	if _, stdout, stderr := sandloop(t, "", "agent", "t", "--max-cost", "0.5", "--data-dir", t.TempDir()); !strings.Contains(stdout+stderr, "not enforced") || !strings.Contains(stdout, "cost unknown") {
		t.Errorf("a local server's gpt-4o-mini was priced as OpenAI's:\n%s\n%s", stdout, stderr)
	}
	// A model the user priced gives no such warning.
	prices := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(prices, []byte(`{"openai/gpt-4o-mini": {"input": 0.1, "output": 0.2}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print(6*7)"}`)},
		{ToolCalls: tc("finish", `{"summary":"42"}`)},
	})
	if _, stdout, stderr := sandloop(t, "", "agent", "t", "--max-cost", "0.5", "--prices", prices, "--data-dir", t.TempDir()); strings.Contains(stdout+stderr, "not enforced") || strings.Contains(stdout, "cost unknown") {
		t.Errorf("warning for a priced model:\n%s\n%s", stdout, stderr)
	}
}

// A step that prints 200,000 lines shows its head and tail on the terminal and says
// where the rest is.
func TestAgentCLIOutputHeadAndTail(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("run_shell", `{"command":"seq 1 200000"}`)},
		{ToolCalls: tc("finish", `{"summary":"counted"}`)},
	})
	data := t.TempDir()
	code, stdout, stderr := sandloop(t, "", "agent", "count to 200000", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	defer func() {
		// The pointer holds: the history has the lines the terminal left out.
		_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
		id := strings.Fields(strings.Split(ls, "\n")[1])[0]
		if _, full, _ := sandloop(t, "", "runs", "show", "--full", id, "--data-dir", data); !strings.Contains(full, "199990") {
			t.Errorf("runs show --full lacks the lines the terminal left out")
		}
	}()
	lines := strings.Split(stdout, "\n")
	if len(lines) > 120 {
		t.Errorf("the terminal got %d lines for one step's output, want head and tail only", len(lines))
	}
	for _, want := range []string{"\n1\n2\n", "\n40\n", "more lines (sandloop runs show --full has them)", "\n199991\n", "\n200000\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\n41\n") || strings.Contains(stdout, "\n199990\n") {
		t.Errorf("lines beyond the head and tail shown:\n%s", stdout)
	}
}

// Debug mode prints the crash it reproduced before the model's first step, and
// the run is titled after its program in runs ls and runs show.
func TestAgentCLIDebugShowsTheCrashFirst(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("edit_file", `{"path":"crash.py","old_text":"return a / b","new_text":"return a / b if b else 0.0"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 crash.py"}`)},
		{ToolCalls: tc("finish", `{"summary":"guarded the division","root_cause":"ratio() divides by a zero count"}`)},
	})
	dir := t.TempDir()
	prog := filepath.Join(dir, "crash.py")
	os.WriteFile(prog, []byte("def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n"), 0o644)
	data := t.TempDir()
	master, tty := openPty(t) // as a person at a terminal sees it
	cmd := cliCommand(t.Context(), "agent", "--mode", "debug", "-f", prog, "--data-dir", data)
	cmd.Stdout, cmd.Stderr = tty, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	out := readPty(master)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	out.drained()
	stdout := regexp.MustCompile("\x1b\\[[0-9;]*[A-Za-z]").ReplaceAllString(out.String(), "")
	crash, step1 := strings.Index(stdout, "ZeroDivisionError: division by zero"), strings.Index(stdout, "── step 1")
	if crash < 0 || step1 < 0 || crash > step1 || !strings.Contains(stdout[:step1], "$ python3 crash.py") || !strings.Contains(stdout[:step1], "the crash to fix") {
		t.Fatalf("the reproduced crash is not shown before step 1:\n%s", stdout)
	}
	_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
	if !strings.Contains(ls, "debug crash.py") {
		t.Errorf("runs ls has no title for the debug run:\n%s", ls)
	}
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	_, show, _ := sandloop(t, "", "runs", "show", id, "--data-dir", data)
	if !strings.Contains(show, "task: debug crash.py") || !strings.Contains(show, "[reproduce error] $ python3 crash.py") || !strings.Contains(show, "ZeroDivisionError") {
		t.Errorf("runs show:\n%s", show)
	}
}

// runs show --full shows what each tool call did: the code run, the command,
// the file written, the edit.
func TestRunsShowFullHasTheCalls(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("write_file", `{"path":"calc.py","content":"TOTAL = sum(range(10))\nprint('total', TOTAL)\n"}`)},
		{ToolCalls: tc("execute_python", `{"code":"import math\nprint(math.sqrt(1764))"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 calc.py | tr a-z A-Z"}`)},
		{ToolCalls: tc("finish", `{"summary":"ok"}`)},
	})
	data := t.TempDir()
	if code, stdout, stderr := sandloop(t, "", "agent", "t", "--data-dir", data); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	_, full, _ := sandloop(t, "", "runs", "show", id, "--full", "--data-dir", data)
	for _, want := range []string{"write calc.py (", "| TOTAL = sum(range(10))", "> import math", "> print(math.sqrt(1764))", "$ python3 calc.py | tr a-z A-Z", "TOTAL 45"} {
		if !strings.Contains(full, want) {
			t.Errorf("runs show --full lacks %q:\n%s", want, full)
		}
	}
	_, short, _ := sandloop(t, "", "runs", "show", id, "--data-dir", data)
	if strings.Contains(short, "| TOTAL = sum") {
		t.Errorf("runs show without --full prints whole files:\n%s", short)
	}
}

// The footers say what happened (issue 31.19): a run that wrote nothing
// says nothing was written to --out, and its cost is said in the same
// words by the run's report, runs ls and runs show. The model reads what
// each execution cost (31.21).
func TestAgentCLIFootersSayWhatHappened(t *testing.T) {
	script := llmtest.Script{ // 2 turns: 200 tokens in, 40 out
		{ToolCalls: tc("execute_python", `{"code":"print(6*7)"}`)},
		{ToolCalls: tc("finish", `{"summary":"42"}`)},
	}
	prices := func(in, out float64) string {
		p := filepath.Join(t.TempDir(), "prices.json")
		writeFile(t, filepath.Dir(p), "prices.json", fmt.Sprintf(`{"openai/gpt-4o-mini": {"input": %g, "output": %g}}`, in, out))
		return p
	}
	for _, tt := range []struct {
		name string
		args []string
		cost string
	}{
		{"no price", nil, "cost unknown"},
		{"free", []string{"--prices", prices(0, 0)}, "$0"},
		{"priced", []string{"--prices", prices(100, 200)}, "$0.03"},
	} {
		srv := useModel(t, script)
		data, out := t.TempDir(), filepath.Join(t.TempDir(), "notes")
		code, stdout, stderr := sandloop(t, "", append([]string{"agent", "t", "--out", out, "--data-dir", data}, tt.args...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", tt.name, code, stdout, stderr)
		}
		if !strings.Contains(stderr, "nothing written to "+out) || strings.Contains(stderr, "file(s) written") {
			t.Errorf("%s: the footer does not say that nothing was written:\n%s", tt.name, stderr)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("%s: --out holds %d entries", tt.name, len(entries))
		}
		// The model is told what its execution cost (issue 31.21).
		if res := srv.Requests()[1].ToolResults(); len(res) != 1 || !regexp.MustCompile(`(?m)^cost: [\d.]+ m?s CPU, peak [\d.]+ [KMG]iB memory$`).MatchString(res[0].Text) {
			t.Errorf("%s: the model was not told what the execution cost: %+v", tt.name, res)
		}
		if !strings.Contains(stdout, " · "+tt.cost+" · ") {
			t.Errorf("%s: the report does not say %q:\n%s", tt.name, tt.cost, stdout)
		}
		_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
		row := strings.Split(ls, "\n")[1]
		if !strings.Contains(row, "  "+tt.cost+"  ") {
			t.Errorf("%s: runs ls does not say %q:\n%s", tt.name, tt.cost, ls)
		}
		_, show, _ := sandloop(t, "", "runs", "show", strings.Fields(row)[0], "--data-dir", data)
		if strings.Count(show, " · "+tt.cost+" · ") != 2 { // the run's line and its report
			t.Errorf("%s: runs show does not say %q twice:\n%s", tt.name, tt.cost, show)
		}
	}
}

// TestAgentCLIAppPreview: a foreground app run whose agent leaves its
// server running prints a preview URL that opens the app after the run,
// while the command waits (--preview-for); Enter ends it, and with it the
// sandbox and the preview.
func TestAgentCLIAppPreview(t *testing.T) {
	file := func(path, content string) llmtest.ToolCall {
		b, _ := json.Marshal(map[string]string{"path": path, "content": content})
		return llmtest.ToolCall{Name: "write_file", Arguments: string(b)}
	}
	app := "import http.server\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        b = b'built by the agent'\n        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)\nhttp.server.ThreadingHTTPServer(('127.0.0.1', 5000), H).serve_forever()\n"
	wait := `{"code":"import socket, time\nfor _ in range(300):\n    try:\n        socket.create_connection(('127.0.0.1', 5000), 1).close(); break\n    except OSError:\n        time.sleep(0.1)\nprint('up')"}`
	useModel(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{file("app.py", app), file("test_app.py", "def test_ok():\n    assert True\n"),
			file("requirements.txt", "\n"), file("README.md", "# App\n\nRun: python3 app.py\n")}},
		{ToolCalls: tc("start_process", `{"name":"server","command":"python3 app.py"}`)},
		{ToolCalls: tc("execute_python", wait)},
		{ToolCalls: tc("finish", `{"summary":"a small web app"}`)},
	})
	stdinR, stdinW := io.Pipe()
	t.Cleanup(func() { stdinW.Close() })
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- execute([]string{"agent", "--mode", "app", "a web page that says who built it", "--data-dir", t.TempDir(), "--preview-for", "10m"}, stdinR, &stdout, &stderr)
	}()
	urlRe := regexp.MustCompile(`preview \(port 5000\): (http://5000-[a-z0-9]+\.localhost:(\d+)/\?sandloop_sig=\S+)`)
	var m []string
	testutil.WaitFor(t, 3*time.Minute, func() error {
		select {
		case code := <-done:
			t.Fatalf("the command ended (%d) before the preview was served:\n%s\n%s", code, stdout.String(), stderr.String())
		default:
		}
		if m = urlRe.FindStringSubmatch(stdout.String()); m == nil || !strings.Contains(stderr.String(), "press Enter or Ctrl-C") {
			return errors.New("no preview URL yet")
		}
		return nil
	})
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, "127.0.0.1:"+m[2]) // *.localhost is the loopback
	}}}
	get := func(raw string) (int, string, error) {
		resp, err := browser.Get(raw)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if st, body, err := get(m[1]); err != nil || st != 200 || body != "built by the agent" {
		t.Fatalf("the preview after the run: %d %q %v", st, body, err)
	}
	u, _ := url.Parse(m[1])
	u.RawQuery = ""
	stranger := &http.Client{Transport: browser.Transport} // no cookie from the signed visit
	if resp, err := stranger.Get(u.String()); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("the preview without its signature: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	io.WriteString(stdinW, "\n")
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Enter did not end the preview")
	}
	if _, _, err := get(m[1]); err == nil {
		t.Error("the preview still answers after the command ended")
	}
}
