package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/session"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

func newSession(t *testing.T) *session.Session {
	t.Helper()
	s, err := session.New(context.Background(), &session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type providerKind int

const (
	openAI providerKind = iota
	anthropic
)

func newProvider(t *testing.T, kind providerKind, script llmtest.Script) (llm.Provider, *llmtest.Server) {
	t.Helper()
	retry := llm.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: time.Second}
	if kind == anthropic {
		srv := llmtest.NewAnthropicServer(t, script)
		return llm.NewAnthropic(&llm.AnthropicOptions{BaseURL: srv.URL, APIKey: "test", Model: "claude-sonnet-4-5", Retry: retry}), srv
	}
	srv := llmtest.NewOpenAIServer(t, script)
	return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: srv.URL, APIKey: "test", Model: "gpt-4o-mini", Retry: retry}), srv
}

func call(name, args string) llmtest.ToolCall { return llmtest.ToolCall{Name: name, Arguments: args} }

func pyArgs(code string) string {
	b, _ := json.Marshal(map[string]string{"code": code})
	return string(b)
}

// events collects a run's events safely.
type events struct {
	mu sync.Mutex
	ev []Event
}

func (e *events) add(ev Event) { e.mu.Lock(); e.ev = append(e.ev, ev); e.mu.Unlock() }
func (e *events) types() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.ev {
		if ev.Type != EventText && ev.Type != EventOutput {
			out = append(out, ev.Type)
		}
	}
	return out
}

func TestGenerateFixesItsError(t *testing.T) {
	for _, kind := range []providerKind{openAI, anthropic} {
		t.Run([]string{"openai", "anthropic"}[kind], func(t *testing.T) {
			p, srv := newProvider(t, kind, llmtest.Script{
				{Text: "Let me compute the mean.", ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, `{"path":"mean.py","content":"def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([]))\n"}`)}},
				{ToolCalls: []llmtest.ToolCall{call(ToolRunShell, `{"command":"python3 mean.py"}`)}},
				{ToolCalls: []llmtest.ToolCall{call(ToolEditFile, `{"path":"mean.py","old_text":"print(mean([]))","new_text":"print(mean([1, 2, 3]))"}`)}},
				{ToolCalls: []llmtest.ToolCall{call(ToolRunShell, `{"command":"python3 mean.py"}`)}},
				{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"mean.py prints 2.0"}`)}},
			})
			var ev events
			s := newSession(t)
			rep, err := Run(context.Background(), &Options{Task: "print the mean of 1,2,3", Provider: p, Session: s, OnEvent: ev.add})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Status != StatusDone || rep.Steps != 5 || rep.Summary != "mean.py prints 2.0" {
				t.Fatalf("report: %+v", rep)
			}
			reqs := srv.Requests()
			// The traceback of the first run reached the model in request 3.
			res := reqs[2].ToolResults()
			last := res[len(res)-1]
			if !strings.Contains(last.Text, "ZeroDivisionError: division by zero") || !strings.Contains(last.Text, "Traceback") || !strings.Contains(last.Text, "status: error") {
				t.Errorf("traceback did not reach the model: %q", last.Text)
			}
			if kind == anthropic && !last.IsError {
				t.Error("the failed run was not marked is_error for Anthropic")
			}
			res = reqs[4].ToolResults()
			if !strings.Contains(res[len(res)-1].Text, "2.0") {
				t.Errorf("fixed run output: %q", res[len(res)-1].Text)
			}
			b, _ := os.ReadFile(filepath.Join(s.Workspace(), "mean.py"))
			if !strings.Contains(string(b), "mean([1, 2, 3])") {
				t.Errorf("file not fixed: %q", b)
			}
			if !strings.Contains(rep.Diff, "+print(mean([1, 2, 3]))") || rep.Usage.InputTokens != 500 {
				t.Errorf("diff %q usage %+v", rep.Diff, rep.Usage)
			}
			types := strings.Join(ev.types(), ",")
			if !strings.HasPrefix(types, "run_started,model_wait,usage,assistant,tool_call,tool_result,model_wait") || !strings.HasSuffix(types, "run_finished") {
				t.Errorf("events: %s", types)
			}
		})
	}
}

func TestFinishRefusedAfterFailure(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import nonexistent_module"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"done"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("print('ok')"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"done"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone || rep.Steps != 4 {
		t.Fatalf("report %+v", rep)
	}
	res := srv.Requests()[2].ToolResults()
	if !strings.Contains(res[len(res)-1].Text, "most recent execution failed") {
		t.Errorf("finish was not refused: %q", res[len(res)-1].Text)
	}
}

func TestDebugModeFixesCrashingScript(t *testing.T) {
	script := "import json\n\ndef load(text):\n    data = json.loads(text)\n    return data['items']\n\nprint(len(load('{\"item\": [1, 2]}')))\n"
	p, srv := newProvider(t, anthropic, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolEditFile, `{"path":"app.py","old_text":"{\"item\": [1, 2]}","new_text":"{\"items\": [1, 2]}"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"fixed the key","root_cause":"the JSON used the key 'item' where the code reads 'items'"}`)}},
	})
	// The first edit is wrong on purpose? No: it is right; the point is the harness reruns.
	rep, err := Run(context.Background(), &Options{Task: "it crashes", Mode: ModeDebug, Provider: p, Session: newSession(t),
		Files: map[string][]byte{"app.py": []byte(script)}})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone || rep.RootCause == "" {
		t.Fatalf("report %+v", rep)
	}
	if rep.Reproduction == nil || rep.Reproduction.ErrorSig != "KeyError" || rep.Verification == nil || rep.Verification.Status != "ok" || !strings.Contains(rep.Verification.Output, "2") {
		t.Errorf("reproduction %+v verification %+v", rep.Reproduction, rep.Verification)
	}
	first := string(srv.Requests()[0].Body)
	if !strings.Contains(first, "KeyError") || !strings.Contains(first, "python3 app.py") {
		t.Errorf("the reproduced failure was not the first observation")
	}
	if !strings.Contains(rep.Diff, `-print(len(load('{"item": [1, 2]}')))`) || !strings.Contains(rep.Diff, `+print(len(load('{"items": [1, 2]}')))`) {
		t.Errorf("diff: %s", rep.Diff)
	}
}

func TestDebugFinishRefusedWhileStillCrashing(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"looks fine","root_cause":"none"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, `{"path":"crash.py","content":"print(1)\n"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"fixed","root_cause":"division by zero"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Mode: ModeDebug, Provider: p, Session: newSession(t),
		Files: map[string][]byte{"crash.py": []byte("print(1/0)\n")}})

	if err != nil {
		t.Fatal(err)
	}
	res := srv.Requests()[1].ToolResults()
	if rep.Status != StatusDone || !strings.Contains(res[0].Text, "still fails") || !strings.Contains(res[0].Text, "same ZeroDivisionError") {
		t.Errorf("report %+v, first finish answer %q", rep, res[0].Text)
	}
}

// TestRetryOn429ThenSuccess checks what a person watching a run sees of a
// failed model call that is retried: a model_wait before each request, a
// model_retry with the reason and the delay in between, then the answer.
func TestRetryOn429ThenSuccess(t *testing.T) {
	cases := []struct {
		name       string
		kind       providerKind
		first      llmtest.Turn
		wantText   string // the start of the sentence
		wantReason string
		wantDelay  int64 // exact, in ms; -1: a backoff in [5ms, 10ms]
	}{
		{"openai 429", openAI, llmtest.Turn{Status: 429, RetryAfter: "1"}, "rate limited by the model server, retrying in 1s (attempt 2/4)", "rate_limited", 1000},
		{"anthropic 503", anthropic, llmtest.Turn{Status: 503}, "the model server answered 503, retrying in ", "server_error", -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status := tc.first.Status
			p, srv := newProvider(t, tc.kind, llmtest.Script{
				tc.first,
				{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("1+1"))}},
				{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"2"}`)}},
			})
			var ev events
			rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t), OnEvent: ev.add})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Status != StatusDone || len(srv.Requests()) != 3 {
				t.Errorf("report %+v after %d requests", rep, len(srv.Requests()))
			}
			types := strings.Join(ev.types(), ",")
			want := "run_started,model_wait,model_retry,model_wait,usage,assistant,tool_call,tool_result,model_wait,usage,assistant,tool_call,tool_result,run_finished"
			if types != want {
				t.Fatalf("events:\n%s\nwant\n%s", types, want)
			}
			ev.mu.Lock()
			retry, wait2 := ev.ev[2], ev.ev[3]
			ev.mu.Unlock()
			if retry.Step != 1 || !strings.HasPrefix(retry.Text, tc.wantText) || !strings.HasSuffix(retry.Text, "(attempt 2/4)") || retry.Retry == nil {
				t.Fatalf("retry event %+v", retry)
			}
			ri := *retry.Retry
			if ri.Attempt != 2 || ri.MaxAttempts != 4 || ri.Reason != tc.wantReason || ri.Status != status {
				t.Errorf("retry info %+v", ri)
			}
			if (tc.wantDelay >= 0 && ri.DelayMS != tc.wantDelay) || (tc.wantDelay < 0 && (ri.DelayMS < 5 || ri.DelayMS > 10)) {
				t.Errorf("delay %d ms, want %d", ri.DelayMS, tc.wantDelay)
			}
			// The second wait began after the delay, not when the retry was announced.
			if d := wait2.Time.Sub(retry.Time); d < time.Duration(ri.DelayMS)*time.Millisecond {
				t.Errorf("the next model_wait came %v after the retry, before its %d ms delay", d, ri.DelayMS)
			}
			b, _ := json.Marshal(retry)
			if !strings.Contains(string(b), fmt.Sprintf(`"retry":{"attempt":2,"max_attempts":4,"delay_ms":%d,"reason":"%s","status":%d}`, ri.DelayMS, tc.wantReason, status)) {
				t.Errorf("retry event as JSON: %s", b)
			}
		})
	}
}

func TestUnauthorizedFailsClearly(t *testing.T) {
	p, _ := newProvider(t, openAI, llmtest.Script{{Status: 401}})
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusFailed || !strings.Contains(rep.Error, "OPENAI_API_KEY") {
		t.Errorf("report %+v", rep)
	}
}

func TestMalformedToolCallsGoBackToTheModel(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, `{"code": "print(1)"`)}}, // truncated JSON
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, `{"code": 5}`)}},
		{ToolCalls: []llmtest.ToolCall{call("launch_rockets", `{}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolEditFile, `{"path":"x.py","old_text":"a","new_text":"b"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("print('fine')"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"ok"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t),
		Files: map[string][]byte{"x.py": []byte("a = 1\na = 2\n")}})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone {
		t.Fatalf("report %+v", rep)
	}
	res := srv.Requests()[4].ToolResults()
	wants := []string{"not a valid JSON object", `argument "code" must be string`, `no tool "launch_rockets"`, "occurs 2 times"}
	for i, w := range wants {
		if !strings.Contains(res[i].Text, w) {
			t.Errorf("tool result %d: %q lacks %q", i, res[i].Text, w)
		}
	}
}

func TestStepBudget(t *testing.T) {
	var script llmtest.Script
	for i := 0; i < 5; i++ {
		script = append(script, llmtest.Turn{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("x = "+string(rune('1'+i))))}})
	}
	p, _ := newProvider(t, openAI, script)
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t), MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusBudgetExceeded || rep.Steps != 3 {
		t.Errorf("report %+v", rep)
	}
}

func TestStuckDetection(t *testing.T) {
	same := llmtest.Turn{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("open('missing.csv')"))}}
	p, srv := newProvider(t, openAI, llmtest.Script{same, same, same, same})
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusStuck || rep.Steps != 3 {
		t.Errorf("report %+v", rep)
	}
	res := srv.Requests()[2].ToolResults()
	if !strings.Contains(res[1].Text, "change your approach") {
		t.Errorf("no nudge: %q", res[1].Text)
	}
}

// A model that keeps calling finish while finish is refused is stuck after
// three identical refusals, not after the whole step budget.
func TestStuckOnRefusedFinish(t *testing.T) {
	fin := llmtest.Turn{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"done"}`)}}
	script := llmtest.Script{{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import nonexistent_module"))}}}
	for range 10 {
		script = append(script, fin)
	}
	p, srv := newProvider(t, openAI, script)
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t), MaxSteps: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusStuck || rep.Steps != 4 || !strings.Contains(rep.Error, "refused finish") {
		t.Fatalf("report %+v", rep)
	}
	res := srv.Requests()[3].ToolResults()
	if !strings.Contains(res[len(res)-1].Text, "change your approach") {
		t.Errorf("no nudge after the second refusal: %q", res[len(res)-1].Text)
	}
}

func TestCancellation(t *testing.T) {
	p, _ := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import time\nprint('sleeping', flush=True)\ntime.sleep(600)"))}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	s := newSession(t)
	rep, err := Run(ctx, &Options{Task: "t", Provider: p, Session: s, OnEvent: func(e Event) {
		if e.Type == EventOutput && e.Exec != nil && strings.Contains(e.Exec.Text, "sleeping") {
			cancel()
		}
	}})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusCancelled {
		t.Errorf("report %+v", rep)
	}
	// The session is still usable: the sleep was interrupted.
	if r, err := s.Execute(context.Background(), kernelReq("1+1"), nil); err != nil || r.MainResult()["text/plain"] != "2" {
		t.Errorf("session after cancel: %+v %v", r, err)
	}
}

func TestCutMiddle(t *testing.T) {
	s := strings.Repeat("a", 100) + strings.Repeat("b", 100)
	got := cutMiddle(s, 40)
	if !strings.HasPrefix(got, strings.Repeat("a", 20)) || !strings.HasSuffix(got, strings.Repeat("b", 20)) || !strings.Contains(got, "[160 bytes cut") {
		t.Errorf("cutMiddle: %q", got)
	}
	if cutMiddle("short", 40) != "short" {
		t.Error("short text changed")
	}
}

func kernelReq(code string) kernel.Request { return kernel.Request{Code: code} }
