package agent

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// A failed run_shell shows the command's own error and exit status —
// everywhere: what the model reads, the live events, the tool result — and
// nothing of the kernel's shell helper.
func TestFailedShellShowsTheCommandsErrorNotTheHelper(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, `{"path":"monthly.py","content":"import sys\nprint('reading')\nraise ValueError(\"Missing column 'date'\")\n"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolRunShell, `{"command":"python3 monthly.py"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, `{"path":"monthly.py","content":"print('ok')\n"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolRunShell, `{"command":"python3 monthly.py"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"fixed"}`)}},
	})
	var ev events
	if _, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t), OnEvent: ev.add}); err != nil {
		t.Fatal(err)
	}
	leaks := []string{"__sandloop_shell__", "CalledProcessError", "<cell", "subprocess"}
	res := srv.Requests()[2].ToolResults()
	model := res[len(res)-1].Text
	for _, want := range []string{"exit code 1", "ValueError: Missing column 'date'", "python3 monthly.py"} {
		if !strings.Contains(model, want) {
			t.Errorf("the model did not read %q:\n%s", want, model)
		}
	}
	if n := strings.Count(model, "python3 monthly.py"); n != 1 {
		t.Errorf("the command is echoed %d times to the model:\n%s", n, model)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var sawError bool
	for _, e := range ev.ev {
		b, _ := json.Marshal(e)
		for _, leak := range leaks {
			if strings.Contains(string(b), leak) {
				t.Errorf("event %s shows %q: %s", e.Type, leak, b)
			}
		}
		if e.Type == EventOutput && e.Exec != nil && e.Exec.Type == "error" {
			sawError = true
			if !strings.Contains(e.Exec.Value, "exited with status 1") {
				t.Errorf("live error event: %+v", e.Exec)
			}
		}
	}
	if !sawError {
		t.Error("no live error event for the failed command")
	}
	for _, leak := range leaks {
		if strings.Contains(model, leak) {
			t.Errorf("the model reads %q:\n%s", leak, model)
		}
	}
}
