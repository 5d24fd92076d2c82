package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// These tests drive the real SDK clients against llmtest's wire-format servers.

// sleeps records the waits a RetryPolicy asks for, without waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d = append(s.d, d)
	return ctx.Err()
}

func (s *sleeps) got() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

type fixture struct {
	name   string
	envVar string
	model  string
	server func(testing.TB, llmtest.Script) *llmtest.Server
	// provider builds a provider for the server; mod adjusts options per test.
	provider func(url string, retry RetryPolicy, images *bool, prices Prices) Provider
}

var fixtures = []fixture{
	{
		name: "openai", envVar: "OPENAI_API_KEY", model: "gpt-4o-mini",
		server: llmtest.NewOpenAIServer,
		provider: func(url string, retry RetryPolicy, images *bool, prices Prices) Provider {
			if prices == nil {
				prices = DefaultPrices() // the test server plays OpenAI's API, at its prices
			}
			return NewOpenAI(&OpenAIOptions{BaseURL: url, APIKey: "test", Model: "gpt-4o-mini", Retry: retry, Images: images, Prices: prices})
		},
	},
	{
		name: "anthropic", envVar: "ANTHROPIC_API_KEY", model: "claude-sonnet-4-5",
		server: llmtest.NewAnthropicServer,
		provider: func(url string, retry RetryPolicy, images *bool, prices Prices) Provider {
			return NewAnthropic(&AnthropicOptions{BaseURL: url, APIKey: "test", Model: "claude-sonnet-4-5", Retry: retry, Images: images, Prices: prices})
		},
	},
}

// setup starts a server for the fixture and a provider whose retries do not wait.
func (f fixture) setup(t *testing.T, script llmtest.Script) (*llmtest.Server, Provider, *sleeps) {
	t.Helper()
	srv := f.server(t, script)
	sl := &sleeps{}
	p := f.provider(srv.URL, RetryPolicy{sleep: sl.sleep}, nil, nil)
	return srv, p, sl
}

var userHello = []Message{{Role: RoleSystem, Text: "You are terse."}, {Role: RoleUser, Text: "Say hello."}}

func forEach(t *testing.T, fn func(t *testing.T, f fixture, stream bool)) {
	for _, f := range fixtures {
		for _, stream := range []bool{true, false} {
			name := f.name + "/json"
			if stream {
				name = f.name + "/stream"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				fn(t, f, stream)
			})
		}
	}
}

// request returns a Request that streams into deltas when stream is set.
func request(msgs []Message, stream bool, deltas *[]string) Request {
	r := Request{Messages: msgs}
	if stream {
		r.OnText = func(d string) { *deltas = append(*deltas, d) }
	}
	return r
}

func TestText(t *testing.T) {
	const text = "Hello, world! Ünïcode survives chunking: 👋"
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv, p, _ := f.setup(t, llmtest.Script{{Text: text, ChunkSize: 3}})
		var deltas []string
		resp, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Message.Text != text || resp.Message.Role != RoleAssistant {
			t.Errorf("message = %+v, want assistant text %q", resp.Message, text)
		}
		if resp.StopReason != StopEnd {
			t.Errorf("stop = %q, want %q", resp.StopReason, StopEnd)
		}
		if stream {
			if len(deltas) < 5 || strings.Join(deltas, "") != text {
				t.Errorf("deltas = %q, want many pieces of %q", deltas, text)
			}
		} else if deltas != nil {
			t.Errorf("non-streaming call produced deltas %q", deltas)
		}
		reqs := srv.Requests()
		if len(reqs) != 1 || reqs[0].Stream() != stream || reqs[0].Model() != f.model {
			t.Fatalf("requests = %d, stream=%v model=%q; want 1, %v, %q", len(reqs), reqs[0].Stream(), reqs[0].Model(), stream, f.model)
		}
		if resp.Attempts != 1 || resp.Model != f.model {
			t.Errorf("attempts = %d, model = %q", resp.Attempts, resp.Model)
		}
	})
}

func TestToolCalls(t *testing.T) {
	code := `{"code": "import math\nprint(math.sqrt(2))\nfor i in range(3):\n    print(i)"}`
	calls := []llmtest.ToolCall{
		{ID: "call_a", Name: "execute_python", Arguments: code},
		{ID: "call_b", Name: "write_file", Arguments: `{"path": "a.py", "content": "x = 1\n"}`},
	}
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv, p, _ := f.setup(t, llmtest.Script{{Text: "Running two tools.", ToolCalls: calls, ChunkSize: 5}})
		tools := []Tool{
			{Name: "execute_python", Description: "Run Python code.", Parameters: json.RawMessage(`{"type":"object","properties":{"code":{"type":"string"}},"required":["code"],"additionalProperties":false}`)},
			{Name: "write_file", Description: "Write a file."},
		}
		var deltas []string
		req := request(userHello, stream, &deltas)
		req.Tools = tools
		resp, err := p.Complete(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		want := []ToolCall{
			{ID: "call_a", Name: "execute_python", Arguments: code},
			{ID: "call_b", Name: "write_file", Arguments: calls[1].Arguments},
		}
		if !equalCalls(resp.Message.ToolCalls, want, f.name == "anthropic" && !stream) {
			t.Errorf("tool calls =\n%+v\nwant\n%+v", resp.Message.ToolCalls, want)
		}
		if resp.StopReason != StopToolUse || resp.Message.Text != "Running two tools." {
			t.Errorf("stop = %q, text = %q", resp.StopReason, resp.Message.Text)
		}
		// The tool definitions reached the server in the provider's shape.
		var body map[string]any
		if err := srv.Requests()[0].Decode(&body); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(body["tools"])
		for _, s := range []string{`"execute_python"`, `"Run Python code."`, `"required":["code"]`, `"additionalProperties":false`} {
			if !strings.Contains(string(got), s) {
				t.Errorf("tools sent = %s; missing %s", got, s)
			}
		}
	})
}

// equalCalls compares tool calls; semantic compares arguments as JSON values, for
// a server that re-encodes them (Anthropic's non-streamed input is parsed JSON).
func equalCalls(got, want []ToolCall, semantic bool) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Name != w.Name {
			return false
		}
		if semantic {
			var a, b any
			if json.Unmarshal([]byte(g.Arguments), &a) != nil || json.Unmarshal([]byte(w.Arguments), &b) != nil {
				return false
			}
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if string(ja) != string(jb) {
				return false
			}
		} else if g.Arguments != w.Arguments {
			return false
		}
	}
	return true
}

func TestUsageAndCost(t *testing.T) {
	usage := llmtest.Usage{InputTokens: 1_000_000, OutputTokens: 100_000, CacheReadTokens: 200_000}
	// gpt-4o-mini: 800k plain at 0.15, 200k cached at 0.075, 100k out at 0.60.
	// claude-sonnet-4-5: 800k plain at 3, 200k cached at 0.30, 100k out at 15.
	wantCost := map[string]float64{"openai": 0.12 + 0.015 + 0.06, "anthropic": 2.4 + 0.06 + 1.5}
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		_, p, _ := f.setup(t, llmtest.Script{{Text: "ok", Usage: usage}})
		var deltas []string
		resp, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		if err != nil {
			t.Fatal(err)
		}
		u := resp.Usage
		if u.InputTokens != 1_000_000 || u.OutputTokens != 100_000 || u.CacheReadTokens != 200_000 {
			t.Errorf("usage = %+v", u)
		}
		if u.CostUnknown || math.Abs(u.Cost-wantCost[f.name]) > 1e-9 {
			t.Errorf("cost = %v (unknown %v), want %v", u.Cost, u.CostUnknown, wantCost[f.name])
		}
	})
}

func TestCostFromOverriddenPrices(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			srv := f.server(t, llmtest.Script{{Text: "ok", Usage: llmtest.Usage{InputTokens: 2_000_000, OutputTokens: 1_000_000}}, {Text: "ok"}})
			prices := Prices{f.model: {Input: 1, Output: 10}}
			p := f.provider(srv.URL, RetryPolicy{}, nil, prices)
			resp, err := p.Complete(t.Context(), Request{Messages: userHello, OnText: func(string) {}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Usage.Cost != 12 {
				t.Errorf("cost = %v, want 12 from the overriding table", resp.Usage.Cost)
			}
			// A model missing from the table has an unknown cost, not a zero one.
			p = f.provider(srv.URL, RetryPolicy{}, nil, Prices{})
			resp, err = p.Complete(t.Context(), Request{Messages: userHello})
			if err != nil {
				t.Fatal(err)
			}
			if !resp.Usage.CostUnknown || resp.Usage.Cost != 0 {
				t.Errorf("usage = %+v, want unknown cost", resp.Usage)
			}
		})
	}
}

func TestRetryThenSuccess(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		retryAfter string
		wantSleep  time.Duration // exact, from Retry-After; zero means backoff in (0, 1s]
	}{
		{"429 retry-after 0", http.StatusTooManyRequests, "0", 0},
		{"429 retry-after 2", http.StatusTooManyRequests, "2", 2 * time.Second},
		{"500 backoff", http.StatusInternalServerError, "", -1},
		{"503 backoff", http.StatusServiceUnavailable, "", -1},
		{"529 overloaded", 529, "1", time.Second},
	}
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				srv, p, sl := f.setup(t, llmtest.Script{{Status: tc.status, RetryAfter: tc.retryAfter}, {Text: "second time lucky"}})
				var deltas []string
				resp, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
				if err != nil {
					t.Fatal(err)
				}
				if resp.Message.Text != "second time lucky" || resp.Attempts != 2 || len(srv.Requests()) != 2 {
					t.Errorf("text %q, attempts %d, requests %d; want the retried reply after 2", resp.Message.Text, resp.Attempts, len(srv.Requests()))
				}
				if stream && strings.Join(deltas, "") != "second time lucky" {
					t.Errorf("deltas = %q: text must not repeat across attempts", deltas)
				}
				got := sl.got()
				if len(got) != 1 {
					t.Fatalf("slept %v, want once", got)
				}
				if tc.wantSleep >= 0 && got[0] != tc.wantSleep {
					t.Errorf("slept %v, want Retry-After's %v", got[0], tc.wantSleep)
				}
				if tc.wantSleep < 0 && (got[0] < 500*time.Millisecond || got[0] > time.Second) {
					t.Errorf("slept %v, want a first backoff in [0.5s, 1s]", got[0])
				}
			})
		}
	})
}

func TestRetryGivesUp(t *testing.T) {
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv := f.server(t, llmtest.Script{{Status: 500}, {Status: 502}, {Status: 500}})
		sl := &sleeps{}
		p := f.provider(srv.URL, RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: 3 * time.Second, sleep: sl.sleep}, nil, nil)
		var deltas []string
		_, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		var apiErr *APIError
		var retryErr *RetryError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 || !errors.As(err, &retryErr) || retryErr.Attempts != 3 {
			t.Fatalf("err = %v, want a 500 APIError after 3 attempts", err)
		}
		got := sl.got()
		// Backoff doubles, with jitter in the upper half, capped by MaxDelay.
		if len(got) != 2 || got[0] < 500*time.Millisecond || got[0] > time.Second || got[1] < time.Second || got[1] > 2*time.Second {
			t.Errorf("sleeps = %v, want ~1s then ~2s", got)
		}
		if len(srv.Requests()) != 3 {
			t.Errorf("requests = %d, want 3", len(srv.Requests()))
		}
	})
}

func TestRetryAfterBeyondLimitFailsFast(t *testing.T) {
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv, p, sl := f.setup(t, llmtest.Script{{Status: 429, RetryAfter: "3600"}, {Text: "never"}})
		var deltas []string
		_, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		var apiErr *APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.RetryAfter != time.Hour {
			t.Fatalf("err = %v, want a 429 asking for an hour", err)
		}
		if len(sl.got()) != 0 || len(srv.Requests()) != 1 {
			t.Errorf("slept %v over %d requests; want no retry", sl.got(), len(srv.Requests()))
		}
		if !strings.Contains(err.Error(), "retry after 1h0m0s") {
			t.Errorf("error %q does not say when to retry", err)
		}
	})
}

func TestAuthError(t *testing.T) {
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv, p, _ := f.setup(t, llmtest.Script{{Status: 401}, {Text: "never"}})
		var deltas []string
		_, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		var authErr *AuthError
		if !errors.As(err, &authErr) || authErr.EnvVar != f.envVar {
			t.Fatalf("err = %#v, want an AuthError naming %s", err, f.envVar)
		}
		if !strings.Contains(err.Error(), f.envVar) || !strings.Contains(err.Error(), "401") {
			t.Errorf("message %q should name %s and the status", err, f.envVar)
		}
		if len(srv.Requests()) != 1 {
			t.Errorf("a 401 was retried: %d requests", len(srv.Requests()))
		}
		// The key we configured is the one that was sent.
		h := srv.Requests()[0].Header
		if h.Get("Authorization") != "Bearer test" && h.Get("X-Api-Key") != "test" {
			t.Errorf("no key sent: %v", h)
		}
	})
}

func TestUnknownModel(t *testing.T) {
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		srv, p, _ := f.setup(t, llmtest.Script{{Status: 404}})
		var deltas []string
		_, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
		var nf *ModelNotFoundError
		if !errors.As(err, &nf) || nf.Model != f.model {
			t.Fatalf("err = %v, want ModelNotFoundError for %s", err, f.model)
		}
		if !strings.Contains(err.Error(), `"`+f.model+`"`) {
			t.Errorf("message %q does not name the model", err)
		}
		if len(srv.Requests()) != 1 {
			t.Errorf("a 404 was retried")
		}
	})
}

func TestMalformedToolArguments(t *testing.T) {
	broken := `{"code": "print('unterminated)` // cut off mid-string, as models do
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			srv, p, _ := f.setup(t, llmtest.Script{
				{ToolCalls: []llmtest.ToolCall{{ID: "c1", Name: "execute_python", Arguments: broken}}},
				{Text: "Sorry, let me fix that."},
			})
			resp, err := p.Complete(t.Context(), Request{Messages: userHello, OnText: func(string) {}})
			if err != nil {
				t.Fatal(err)
			}
			calls := resp.Message.ToolCalls
			if len(calls) != 1 || calls[0].Arguments != broken || calls[0].ValidArguments() {
				t.Fatalf("calls = %+v, want the broken arguments verbatim", calls)
			}
			// The agent answers with an error result; the conversation must still go through.
			history := append(append([]Message{}, userHello...), resp.Message,
				Message{Role: RoleTool, ToolCallID: "c1", IsError: true, Text: "invalid JSON arguments: " + broken})
			resp, err = p.Complete(t.Context(), Request{Messages: history})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Message.Text != "Sorry, let me fix that." {
				t.Errorf("text = %q", resp.Message.Text)
			}
			res := srv.Requests()[1].ToolResults()
			if len(res) != 1 || res[0].CallID != "c1" || !strings.Contains(res[0].Text, broken) {
				t.Errorf("tool results sent = %+v", res)
			}
			var body struct {
				Messages []json.RawMessage `json:"messages"`
			}
			_ = srv.Requests()[1].Decode(&body)
			all := string(srv.Requests()[1].Body)
			switch f.name {
			case "openai":
				// Chat Completions takes arguments as a string: the model sees what it sent.
				if !strings.Contains(all, `"arguments":`+jsonString(broken)) {
					t.Errorf("assistant message lacks the verbatim arguments: %s", all)
				}
			case "anthropic":
				// Messages requires an object: an empty one stands in.
				if !strings.Contains(all, `"input":{}`) {
					t.Errorf("tool_use input is not {}: %s", all)
				}
			}
		})
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A tool result carrying a plot, and what each wire format makes of it.
var plotHistory = []Message{
	{Role: RoleUser, Text: "Plot it."},
	{Role: RoleAssistant, ToolCalls: []ToolCall{
		{ID: "c1", Name: "execute_python", Arguments: `{"code":"plot()"}`},
		{ID: "c2", Name: "execute_python", Arguments: `{"code":"print(2)"}`},
	}},
	{Role: RoleTool, ToolCallID: "c1", Text: "status: ok", Images: []Image{{MediaType: "image/png", Data: "iVBORw0KGgo="}}},
	{Role: RoleTool, ToolCallID: "c2", Text: "2"},
}

func TestImagesInToolResults(t *testing.T) {
	t.Run("openai", func(t *testing.T) {
		t.Parallel()
		srv, p, _ := fixtures[0].setup(t, llmtest.Script{{Text: "ok"}})
		if _, err := p.Complete(t.Context(), Request{Messages: plotHistory}); err != nil {
			t.Fatal(err)
		}
		var body struct {
			Messages []struct {
				Role       string          `json:"role"`
				Content    json.RawMessage `json:"content"`
				ToolCallID string          `json:"tool_call_id"`
			} `json:"messages"`
		}
		if err := srv.Requests()[0].Decode(&body); err != nil {
			t.Fatal(err)
		}
		var roles []string
		for _, m := range body.Messages {
			roles = append(roles, m.Role)
		}
		// Tool messages stay together right after the calls; the image follows in a user message.
		if got := strings.Join(roles, ","); got != "user,assistant,tool,tool,user" {
			t.Fatalf("roles = %s", got)
		}
		last := string(body.Messages[4].Content)
		if !strings.Contains(last, `"type":"image_url"`) || !strings.Contains(last, `"url":"data:image/png;base64,iVBORw0KGgo="`) || !strings.Contains(last, "c1") {
			t.Errorf("image message = %s", last)
		}
		if string(body.Messages[2].Content) != `"status: ok"` {
			t.Errorf("tool message content = %s", body.Messages[2].Content)
		}
	})
	t.Run("anthropic", func(t *testing.T) {
		t.Parallel()
		srv, p, _ := fixtures[1].setup(t, llmtest.Script{{Text: "ok"}})
		if _, err := p.Complete(t.Context(), Request{Messages: plotHistory}); err != nil {
			t.Fatal(err)
		}
		var body struct {
			Messages []struct {
				Role    string `json:"role"`
				Content []struct {
					Type      string `json:"type"`
					ToolUseID string `json:"tool_use_id"`
					Content   []struct {
						Type   string `json:"type"`
						Text   string `json:"text"`
						Source struct {
							Type      string `json:"type"`
							MediaType string `json:"media_type"`
							Data      string `json:"data"`
						} `json:"source"`
					} `json:"content"`
				} `json:"content"`
			} `json:"messages"`
		}
		if err := srv.Requests()[0].Decode(&body); err != nil {
			t.Fatal(err)
		}
		// Both results in one user turn, the image inside its tool_result.
		if len(body.Messages) != 3 || body.Messages[2].Role != "user" || len(body.Messages[2].Content) != 2 {
			t.Fatalf("messages = %s", srv.Requests()[0].Body)
		}
		tr := body.Messages[2].Content[0]
		if tr.Type != "tool_result" || tr.ToolUseID != "c1" || len(tr.Content) != 2 {
			t.Fatalf("tool result = %+v", tr)
		}
		img := tr.Content[1]
		if img.Type != "image" || img.Source.Type != "base64" || img.Source.MediaType != "image/png" || img.Source.Data != "iVBORw0KGgo=" {
			t.Errorf("image block = %+v", img)
		}
		if res := srv.Requests()[0].ToolResults(); len(res) != 2 || res[0].Images != 1 || res[1].Text != "2" {
			t.Errorf("tool results = %+v", res)
		}
	})
	// A text-only model gets a note instead of the image.
	for _, f := range fixtures {
		t.Run(f.name+"/text-only", func(t *testing.T) {
			t.Parallel()
			srv := f.server(t, llmtest.Script{{Text: "ok"}})
			no := false
			p := f.provider(srv.URL, RetryPolicy{}, &no, nil)
			if p.Info().Images {
				t.Fatal("Images option ignored")
			}
			if _, err := p.Complete(t.Context(), Request{Messages: plotHistory}); err != nil {
				t.Fatal(err)
			}
			body := string(srv.Requests()[0].Body)
			if strings.Contains(body, "iVBORw0KGgo=") || !strings.Contains(body, "does not accept images") {
				t.Errorf("body = %s", body)
			}
		})
	}
}

func TestAnthropicConversationShape(t *testing.T) {
	srv, p, _ := fixtures[1].setup(t, llmtest.Script{{Text: "ok"}})
	msgs := []Message{
		{Role: RoleSystem, Text: "Be brief."},
		{Role: RoleUser, Text: "Run it."},
		{Role: RoleAssistant, Text: "Running.", ToolCalls: []ToolCall{{ID: "c1", Name: "run", Arguments: `{"x": 1}`}}},
		{Role: RoleTool, ToolCallID: "c1", Text: "Traceback (most recent call last):\nZeroDivisionError", IsError: true},
		{Role: RoleUser, Text: "Keep going."},
	}
	if _, err := p.Complete(t.Context(), Request{Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	var body struct {
		System   []struct{ Text string } `json:"system"`
		Messages []struct {
			Role    string            `json:"role"`
			Content []json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := srv.Requests()[0].Decode(&body); err != nil {
		t.Fatal(err)
	}
	if len(body.System) != 1 || body.System[0].Text != "Be brief." {
		t.Errorf("system = %+v", body.System)
	}
	var roles []string
	for _, m := range body.Messages {
		roles = append(roles, m.Role)
	}
	// The tool result and the next user words share one user turn, result first.
	if strings.Join(roles, ",") != "user,assistant,user" || len(body.Messages[2].Content) != 2 ||
		!strings.Contains(string(body.Messages[2].Content[0]), `"type":"tool_result"`) {
		t.Fatalf("messages = %s", srv.Requests()[0].Body)
	}
	res := srv.Requests()[0].ToolResults()
	if len(res) != 1 || !res[0].IsError || !strings.Contains(res[0].Text, "ZeroDivisionError") {
		t.Errorf("tool results = %+v", res)
	}
	if !strings.Contains(string(body.Messages[1].Content[1]), `"input":{"x":1}`) {
		t.Errorf("tool_use = %s", body.Messages[1].Content[1])
	}
}

func TestCancelMidStream(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			srv, p, sl := f.setup(t, llmtest.Script{{Text: "partial answer", Hang: true}})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var got []string
			_, err := p.Complete(ctx, Request{Messages: userHello, OnText: func(d string) {
				got = append(got, d)
				cancel() // the user pressed Ctrl-C while text was arriving
			}})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if len(got) == 0 || len(srv.Requests()) != 1 || len(sl.got()) != 0 {
				t.Errorf("deltas %q, requests %d, sleeps %v; want one cancelled request", got, len(srv.Requests()), sl.got())
			}
		})
	}
}

func TestCancelDuringBackoff(t *testing.T) {
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{{Status: 503}, {Text: "never"}})
	ctx, cancel := context.WithCancel(t.Context())
	p := NewOpenAI(&OpenAIOptions{BaseURL: srv.URL, Model: "gpt-4o-mini", Retry: RetryPolicy{sleep: func(ctx context.Context, d time.Duration) error {
		cancel()
		return sleepCtx(ctx, d)
	}}})

	_, err := p.Complete(ctx, Request{Messages: userHello})
	if !errors.Is(err, context.Canceled) || len(srv.Requests()) != 1 {
		t.Errorf("err = %v after %d requests; want Canceled after 1", err, len(srv.Requests()))
	}
}

func TestOpenAICompatibleDetails(t *testing.T) {
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{{Text: "ok"}, {Status: 404}, {Status: 401}})
	p := NewOpenAI(&OpenAIOptions{BaseURL: srv.URL, Model: "qwen2.5-coder", MaxTokens: 100})
	if info := p.Info(); info.Provider != "openai-compatible" || info.Images || info.String() != "openai-compatible/qwen2.5-coder" {
		t.Errorf("info = %+v", info)
	}
	if _, err := p.Complete(t.Context(), Request{Messages: userHello}); err != nil {
		t.Fatal(err)
	}
	r := srv.Requests()[0]
	// No key configured: no Authorization header (never one from the environment).
	if h := r.Header.Get("Authorization"); h != "" {
		t.Errorf("Authorization = %q", h)
	}
	if !strings.Contains(string(r.Body), `"max_tokens":100`) {
		t.Errorf("compatible servers get max_tokens: %s", r.Body)
	}
	_, err := p.Complete(t.Context(), Request{Messages: userHello})
	if err == nil || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), "/v1") {
		t.Errorf("404 from a compatible server should mention its base URL: %v", err)
	}
	_, err = p.Complete(t.Context(), Request{Messages: userHello})
	var authErr *AuthError
	if !errors.As(err, &authErr) || !strings.Contains(err.Error(), "OPENAI_API_KEY") {
		t.Errorf("err = %v", err)
	}
}

func TestInvalidInput(t *testing.T) {
	cases := []struct {
		name string
		req  Request
	}{
		{"tool message without id", Request{Messages: []Message{{Role: RoleTool, Text: "x"}}}},
		{"unknown role", Request{Messages: []Message{{Role: "robot", Text: "x"}}}},
		{"bad schema", Request{Messages: userHello, Tools: []Tool{{Name: "t", Parameters: json.RawMessage(`[1]`)}}}},
	}
	for _, f := range fixtures {
		for _, tc := range cases {
			t.Run(f.name+"/"+tc.name, func(t *testing.T) {
				srv := f.server(t, nil)
				p := f.provider(srv.URL, RetryPolicy{}, nil, nil)
				if _, err := p.Complete(t.Context(), tc.req); err == nil {
					t.Error("no error")
				}
				if n := len(srv.Requests()); n != 0 {
					t.Errorf("%d requests sent for invalid input", n)
				}
			})
		}
	}
	if _, err := NewOpenAI(&OpenAIOptions{}).Complete(t.Context(), Request{Messages: userHello}); err == nil {
		t.Error("OpenAI without a model: no error")
	}
	if _, err := NewAnthropic(&AnthropicOptions{}).Complete(t.Context(), Request{Messages: userHello}); err == nil {
		t.Error("Anthropic without a model: no error")
	}
}

func TestErrorInsideStream(t *testing.T) {
	errType := map[string]string{"openai": "server_error", "anthropic": "overloaded_error"}
	for _, f := range fixtures {
		t.Run(f.name+"/before any text: retried", func(t *testing.T) {
			t.Parallel()
			srv, p, _ := f.setup(t, llmtest.Script{{StreamError: errType[f.name]}, {Text: "recovered"}})
			var deltas []string
			resp, err := p.Complete(t.Context(), request(userHello, true, &deltas))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Attempts != 2 || strings.Join(deltas, "") != "recovered" || len(srv.Requests()) != 2 {
				t.Errorf("attempts %d, deltas %q, requests %d", resp.Attempts, deltas, len(srv.Requests()))
			}
		})
		t.Run(f.name+"/after text: not retried", func(t *testing.T) {
			t.Parallel()
			srv, p, _ := f.setup(t, llmtest.Script{{Text: "half an ans", StreamError: errType[f.name]}, {Text: "never"}})
			var deltas []string
			_, err := p.Complete(t.Context(), request(userHello, true, &deltas))
			var apiErr *APIError
			if !errors.As(err, &apiErr) || !apiErr.InStream || !strings.Contains(err.Error(), errType[f.name]) {
				t.Fatalf("err = %v, want an in-stream APIError", err)
			}
			// Retrying would show the caller "half an ans" twice.
			if strings.Join(deltas, "") != "half an ans" || len(srv.Requests()) != 1 {
				t.Errorf("deltas %q, requests %d", deltas, len(srv.Requests()))
			}
		})
	}
	t.Run("anthropic/invalid request in stream: not retried", func(t *testing.T) {
		t.Parallel()
		srv, p, _ := fixtures[1].setup(t, llmtest.Script{{StreamError: "invalid_request_error"}, {Text: "never"}})
		_, err := p.Complete(t.Context(), Request{Messages: userHello, OnText: func(string) {}})
		var apiErr *APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || len(srv.Requests()) != 1 {
			t.Errorf("err = %v after %d requests", err, len(srv.Requests()))
		}
	})
}

// TestScriptedConversation is the pattern agent tests follow: the script plays the
// model, the test plays the loop, and the recorded requests show what the model saw.
func TestScriptedConversation(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			srv, p, _ := f.setup(t, llmtest.Script{
				{Text: "Let me try.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"print(1/0)"}`}}},
				{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"print(1/1)"}`}}},
				{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"fixed the division"}`}}},
			})
			results := []string{
				"status: error\nTraceback (most recent call last):\n  File \"<cell>\", line 1\nZeroDivisionError: division by zero",
				"status: ok\nstdout: 1.0",
			}
			history := []Message{{Role: RoleSystem, Text: "You write Python."}, {Role: RoleUser, Text: "Print 1/0, then fix it."}}
			var total Usage
			for turn := 0; ; turn++ {
				resp, err := p.Complete(t.Context(), Request{Messages: history, OnText: func(string) {}})
				if err != nil {
					t.Fatal(err)
				}
				total = total.Add(resp.Usage)
				history = append(history, resp.Message)
				call := resp.Message.ToolCalls[0]
				if call.Name == "finish" {
					break
				}
				history = append(history, Message{Role: RoleTool, ToolCallID: call.ID, Text: results[turn], IsError: turn == 0})
			}
			reqs := srv.Requests()
			if len(reqs) != 3 || srv.Remaining() != 0 {
				t.Fatalf("%d requests, %d turns left", len(reqs), srv.Remaining())
			}
			// The traceback of the first attempt reached the model whole.
			res := reqs[1].ToolResults()
			if len(res) != 1 || !strings.Contains(res[0].Text, "Traceback (most recent call last):") || !strings.Contains(res[0].Text, "ZeroDivisionError: division by zero") {
				t.Errorf("second request's tool results = %+v", res)
			}
			if res := reqs[2].ToolResults(); len(res) != 2 || res[1].Text != results[1] {
				t.Errorf("third request's tool results = %+v", res)
			}
			if total.InputTokens != 300 || total.OutputTokens != 60 || total.CostUnknown {
				t.Errorf("run usage = %+v", total)
			}
		})
	}
}

// The SDKs read OPENAI_* and ANTHROPIC_* on their own; the providers must not, or a
// key would travel to whatever server BaseURL names.
func TestEnvironmentDoesNotLeak(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	t.Setenv("OPENAI_ORG_ID", "org-env")
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
	t.Setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Leak: yes")
	oa := llmtest.NewOpenAIServer(t, llmtest.Script{{Text: "ok"}})
	if _, err := NewOpenAI(&OpenAIOptions{BaseURL: oa.URL, Model: "m"}).Complete(t.Context(), Request{Messages: userHello}); err != nil {
		t.Fatal(err)
	}
	an := llmtest.NewAnthropicServer(t, llmtest.Script{{Text: "ok"}})
	if _, err := NewAnthropic(&AnthropicOptions{BaseURL: an.URL, APIKey: "given", Model: "m"}).Complete(t.Context(), Request{Messages: userHello}); err != nil {
		t.Fatal(err)
	}
	for _, r := range append(oa.Requests(), an.Requests()...) {
		for name, vals := range r.Header {
			for _, v := range vals {
				if strings.Contains(v, "from-env") || strings.Contains(v, "org-env") || name == "X-Leak" {
					t.Errorf("%s: header %s: %s came from the environment", r.Path, name, v)
				}
			}
		}
	}
	// This SDK version sends the key as a bearer token; older ones used x-api-key.
	if h := an.Requests()[0].Header; h.Get("X-Api-Key") != "given" && h.Get("Authorization") != "Bearer given" {
		t.Errorf("headers %v lack the configured key", h)
	}
}

// TestRetryHooks checks what a caller is told of retries: OnAttempt before each
// request, OnRetry with the reason, the status and the sentence a person reads.
func TestRetryHooks(t *testing.T) {
	cases := []struct {
		name       string
		first      llmtest.Turn
		streamOnly bool
		reason     RetryReason
		status     int
		sentence   string // the start of Retry.String()
	}{
		{"429", llmtest.Turn{Status: 429, RetryAfter: "2"}, false, RetryRateLimited, 429, "rate limited by the model server, retrying in 2s (attempt 2/4)"},
		{"503", llmtest.Turn{Status: 503}, false, RetryServerError, 503, "the model server answered 503, retrying in "},
		{"dropped", llmtest.Turn{Drop: true}, false, RetryConnection, 0, "the connection to the model server was lost, retrying in "},
	}
	forEach(t, func(t *testing.T, f fixture, stream bool) {
		for _, tc := range cases {
			if tc.streamOnly && !stream {
				continue
			}
			t.Run(tc.name, func(t *testing.T) {
				_, p, _ := f.setup(t, llmtest.Script{tc.first, {Text: "second time lucky"}})
				var attempts []int
				var retries []Retry
				var deltas []string
				req := request(userHello, stream, &deltas)
				req.OnAttempt = func(n int) { attempts = append(attempts, n) }
				req.OnRetry = func(r Retry) { retries = append(retries, r) }
				resp, err := p.Complete(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Message.Text != "second time lucky" || fmt.Sprint(attempts) != "[1 2]" || len(retries) != 1 {
					t.Fatalf("text %q, attempts %v, retries %+v", resp.Message.Text, attempts, retries)
				}
				r := retries[0]
				if r.Attempt != 2 || r.MaxAttempts != 4 || r.Reason != tc.reason || r.Status != tc.status || r.Err == nil {
					t.Errorf("retry %+v, want attempt 2/4, %s, status %d", r, tc.reason, tc.status)
				}
				if s := r.String(); !strings.HasPrefix(s, tc.sentence) || !strings.HasSuffix(s, "(attempt 2/4)") {
					t.Errorf("sentence %q, want %q...", s, tc.sentence)
				}
			})
		}
	})
}

// TestRetryOnTimeout: a model server that does not answer within the HTTP
// client's timeout is retried, and the caller is told it timed out.
func TestRetryOnTimeout(t *testing.T) {
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{{Delay: time.Minute}, {Text: "in time"}})
	sl := &sleeps{}
	p := NewOpenAI(&OpenAIOptions{BaseURL: srv.URL, APIKey: "test", Model: "gpt-4o-mini", Retry: RetryPolicy{sleep: sl.sleep},
		HTTPClient: &http.Client{Timeout: 300 * time.Millisecond}})

	var retries []Retry
	resp, err := p.Complete(t.Context(), Request{Messages: userHello, OnRetry: func(r Retry) { retries = append(retries, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Text != "in time" || len(retries) != 1 || retries[0].Reason != RetryTimeout || retries[0].Status != 0 {
		t.Fatalf("text %q, retries %+v", resp.Message.Text, retries)
	}
	if s := retries[0].String(); !strings.HasPrefix(s, "the model server did not answer in time, retrying in ") {
		t.Errorf("sentence %q", s)
	}
}

func TestRetrySentence(t *testing.T) {
	cases := []struct {
		r    Retry
		want string
	}{
		{Retry{Attempt: 2, MaxAttempts: 5, Delay: 2 * time.Second, Reason: RetryRateLimited, Status: 429}, "rate limited by the model server, retrying in 2s (attempt 2/5)"},
		{Retry{Attempt: 3, MaxAttempts: 5, Delay: 1734 * time.Millisecond, Reason: RetryServerError, Status: 503}, "the model server answered 503, retrying in 1.7s (attempt 3/5)"},
		{Retry{Attempt: 2, MaxAttempts: 4, Delay: 734 * time.Millisecond, Reason: RetryServerError}, "the model server failed in the middle of its answer, retrying in 730ms (attempt 2/4)"},
		{Retry{Attempt: 2, MaxAttempts: 4, Reason: RetryTimeout, Status: 408}, "the model server timed out (HTTP 408), retrying now (attempt 2/4)"},
		{Retry{Attempt: 4, MaxAttempts: 4, Delay: 4 * time.Second, Reason: RetryConnection}, "the connection to the model server was lost, retrying in 4s (attempt 4/4)"},
	}
	for _, tc := range cases {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}

// A refused connection names the setting and the address, says what to check, and
// is not retried.
func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	base := "http://" + addr
	for _, tc := range []struct {
		p    Provider
		want string
	}{
		{NewOpenAI(&OpenAIOptions{BaseURL: base + "/v1", Model: "m"}), "openai-compatible: nothing is listening at OPENAI_BASE_URL (" + addr + "): is the model server running?"},
		{NewOpenAI(&OpenAIOptions{BaseURL: base + "/v1", Model: "m", Provider: "ollama"}), "ollama: nothing is listening at OLLAMA_HOST (" + addr + "): is Ollama running (ollama serve)?"},
		{NewAnthropic(&AnthropicOptions{BaseURL: base, APIKey: "k", Model: "m"}), "anthropic: nothing is listening at ANTHROPIC_BASE_URL (" + addr + "): is the model server running?"},
	} {
		var attempts int
		_, err := tc.p.Complete(t.Context(), Request{Messages: userHello, OnAttempt: func(int) { attempts++ }})
		var ce *ConnectError
		if !errors.As(err, &ce) || err.Error() != tc.want {
			t.Errorf("err = %v\nwant %s", err, tc.want)
		}
		if attempts != 1 {
			t.Errorf("%s: %d attempts, want 1 (a refused connection is not retried)", tc.want, attempts)
		}
	}
}

// A 501 or 405 from a compatible server means a wrong path, not an outage: it is not
// retried, and the message says to check the base URL.
func TestNotImplementedHintsAtBaseURL(t *testing.T) {
	for _, status := range []int{501, 405} {
		forEach(t, func(t *testing.T, f fixture, stream bool) {
			srv, p, _ := f.setup(t, llmtest.Script{{Status: status}, {Text: "hello"}})
			var deltas []string
			_, err := p.Complete(t.Context(), request(userHello, stream, &deltas))
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != status {
				t.Fatalf("err = %v, want an APIError with HTTP %d", err, status)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("HTTP %d: %d requests, want 1 (not retried)", status, n)
			}
			want := "check the base URL " + srv.URL
			if f.name == "openai" {
				want += " (it usually ends in /v1)"
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q lacks %q", err, want)
			}
		})
	}
}
