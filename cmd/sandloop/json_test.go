package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// --json: every line carries the run's id, run_started first.
func TestAgentJSONCarriesRunID(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print(1)"}`)},
		{ToolCalls: tc("finish", `{"summary":"ok"}`)},
	})
	code, stdout, stderr := sandloop(t, "", "agent", "t", "--json", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d %s", code, stderr)
	}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	var id string
	n := 0
	for sc.Scan() {
		var e struct {
			Type  string `json:"type"`
			RunID string `json:"run_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %d is not JSON: %q", n+1, sc.Text())
		}
		if n == 0 && (e.Type != "run_started" || len(e.RunID) < 8) {
			t.Fatalf("first line: %s", sc.Text())
		}
		if n == 0 {
			id = e.RunID
		}
		if e.RunID != id {
			t.Errorf("line %d has run_id %q, not %q: %s", n+1, e.RunID, id, sc.Text())
		}
		n++
	}
	if n < 5 || !strings.Contains(stderr, id) {
		t.Errorf("%d lines; stderr %q does not name run %s", n, stderr, id)
	}
}

// A model server sending broken JSON is told as such, with what it sent.
func TestAgentInvalidJSONFromModel(t *testing.T) {
	for _, tt := range []struct{ name, contentType, body, want string }{
		{"stream", "text/event-stream", "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\n\ndata: [DONE]\n\n", "chat.completion.chunk"},
		{"html", "application/json", "<html><body>Bad Gateway from the proxy</body></html>", "Bad Gateway from the proxy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				fmt.Fprint(w, tt.body)
			}))
			t.Cleanup(srv.Close)
			t.Setenv("SANDLOOP_MODEL", "openai/gpt-4o-mini")
			t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
			t.Setenv("OPENAI_API_KEY", "test-key")
			code, stdout, stderr := sandloop(t, "", "agent", "t", "--data-dir", t.TempDir())
			all := stdout + stderr
			if code == 0 || !strings.Contains(all, "the model server sent invalid JSON") || !strings.Contains(all, tt.want) {
				t.Errorf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
			}
		})
	}
}

// serve says which model agent runs use, or how to configure one; --model
// chooses it.
// serveOutput starts `sandloop serve` on a free port, without a pool, and
// returns what it prints; it is stopped when the test ends.
func serveOutput(t *testing.T, args ...string) *bufio.Reader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := cliCommand(ctx, append([]string{"serve", "--addr", "127.0.0.1:0", "--pool", "0", "--e2b=false", "--data-dir", t.TempDir()}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	return bufio.NewReader(stdout)
}

func TestServeSaysItsModel(t *testing.T) {
	serveLine := func(t *testing.T, args ...string) string {
		br := serveOutput(t, args...)
		var seen strings.Builder
		for {
			line, err := br.ReadString('\n')
			seen.WriteString(line)
			if strings.HasPrefix(line, "agent runs") {
				return line
			}
			if err != nil {
				t.Fatalf("serve never said its model:\n%s", seen.String())
			}
		}
	}
	for _, k := range []string{"SANDLOOP_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "OPENAI_BASE_URL"} {
		t.Setenv(k, "")
	}
	t.Setenv("OLLAMA_HOST", "127.0.0.1:9") // nothing listens on discard
	if got := serveLine(t); !strings.Contains(got, "no model configured: set SANDLOOP_MODEL or --model") {
		t.Errorf("without a model: %q", got)
	}
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{})
	t.Setenv("OPENAI_BASE_URL", srv.URL)
	t.Setenv("OPENAI_API_KEY", "test-key")
	if got := serveLine(t, "--model", "openai/gpt-4o-mini"); got != "agent runs use openai/gpt-4o-mini\n" {
		t.Errorf("--model: %q", got)
	}
}

// runs show ends a failed step with its traceback's last lines, --full
// shows it whole; "cost unknown" stays unknown in runs ls; without --out the
// footer says where the files are.
func TestRunsShowAndCostUnknown(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("write_file", `{"path":"deep.py","content":"def f(n):\n    if n == 0:\n        raise ValueError('the real error')\n    f(n - 1)\nf(8)\n"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 deep.py"}`)},
		{ToolCalls: tc("write_file", `{"path":"deep.py","content":"print('fine')\n"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 deep.py"}`)},
		{ToolCalls: tc("finish", `{"summary":"ok"}`)},
		{Text: "lesson: name the error"},
	})
	t.Setenv("SANDLOOP_MODEL", "openai-compatible/mystery-model")
	data := t.TempDir()
	code, _, stderr := sandloop(t, "", "agent", "t", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d %s", code, stderr)
	}
	if !strings.Contains(stderr, "sandloop runs export ") || !strings.Contains(stderr, "--out") {
		t.Errorf("the footer does not say where the files are: %q", stderr)
	}
	_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
	if !strings.Contains(ls, "cost unknown") || strings.Contains(ls, "$0.0000") {
		t.Errorf("runs ls:\n%s", ls)
	}
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	_, show, _ := sandloop(t, "", "runs", "show", id, "--data-dir", data)
	if !strings.Contains(show, "ValueError: the real error") || !strings.Contains(show, "cost unknown") || strings.Contains(show, "Previous line repeated") {
		t.Errorf("runs show does not end the failed step with its error:\n%s", show)
	}
	_, full, _ := sandloop(t, "", "runs", "show", id, "--full", "--data-dir", data)
	if !strings.Contains(full, "Previous line repeated") || !strings.Contains(full, "line 5, in <module>") || !strings.Contains(full, "ValueError: the real error") {
		t.Errorf("runs show --full does not show the whole traceback:\n%s", full)
	}
}
