package llmtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// The SDK-level behaviour is tested in package llm; these tests pin the raw wire
// format and the server's own bookkeeping.

// recordingTB captures Errorf so tests can check the server's complaints.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// sseData returns the data lines of an event stream, and the event names.
func sseData(body string) (data, events []string) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
		}
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, e)
		}
	}
	return data, events
}

func TestOpenAIStreamWireFormat(t *testing.T) {
	srv := NewOpenAIServer(t, Script{{
		Text:      "hi there",
		ToolCalls: []ToolCall{{Name: "f", Arguments: `{"a":1}`}, {ID: "x", Name: "g"}},
		ChunkSize: 3,
		Usage:     Usage{InputTokens: 7, OutputTokens: 3},
	}})
	resp, body := post(t, srv.URL+"/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"q"}]}`)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	data, events := sseData(body)
	if len(events) != 0 {
		t.Errorf("OpenAI streams have no event names: %v", events)
	}
	if data[len(data)-1] != "[DONE]" {
		t.Errorf("last data %q, want [DONE]", data[len(data)-1])
	}
	for _, want := range []string{
		`"delta":{"content":"hi "}`,
		`"delta":{"tool_calls":[{"function":{"arguments":"","name":"f"},"id":"call_1_0","index":0,"type":"function"}]}`,
		`"delta":{"tool_calls":[{"function":{"arguments":"{\"a"},"index":0}]}`,
		`"id":"x","index":1`,
		`"finish_reason":"tool_calls"`,
		`"choices":[],"created":1700000000,"id":"chatcmpl-llmtest1","model":"m","object":"chat.completion.chunk","system_fingerprint":"fp_llmtest","usage":{"completion_tokens":3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("stream lacks %s:\n%s", want, body)
		}
	}
}

func TestAnthropicStreamWireFormat(t *testing.T) {
	srv := NewAnthropicServer(t, Script{{Text: "hi", ToolCalls: []ToolCall{{Name: "f", Arguments: `{"a":1}`}}}})
	_, body := post(t, srv.URL+"/v1/messages", `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"q"}]}`)
	_, events := sseData(body)
	want := "message_start ping content_block_start content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(events, " "); got != want {
		t.Errorf("events =\n%s\nwant\n%s", got, want)
	}
	for _, s := range []string{`"type":"input_json_delta"`, `"partial_json":"{\"a\""`, `"stop_reason":"tool_use"`, `"id":"toolu_1_0"`} {
		if !strings.Contains(body, s) {
			t.Errorf("stream lacks %s", s)
		}
	}
}

func TestErrorTurns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		new    func(testing.TB, Script) *Server
		path   string
		status int
		want   string
	}{
		{"openai 429", NewOpenAIServer, "/chat/completions", 429, `"code":"rate_limit_exceeded"`},
		{"anthropic 401", NewAnthropicServer, "/v1/messages", 401, `"type":"authentication_error"`},
		{"anthropic 529", NewAnthropicServer, "/v1/messages", 529, `"type":"overloaded_error"`},
		{"openai 404", NewOpenAIServer, "/chat/completions", 404, "The model `m` does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.new(t, Script{{Status: tc.status, RetryAfter: "3"}})
			resp, body := post(t, srv.URL+tc.path, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"}]}`)
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != "3" || !strings.Contains(body, tc.want) {
				t.Errorf("status %d, Retry-After %q, body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			if srv.Remaining() != 0 || len(srv.Requests()) != 1 {
				t.Errorf("remaining %d, requests %d", srv.Remaining(), len(srv.Requests()))
			}
		})
	}
}

func TestServerComplains(t *testing.T) {
	cases := []struct {
		name, path, body, want string
	}{
		{"script exhausted", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"q"}]}`, "only 0 turns"},
		{"wrong path", "/v1/completions", `{}`, "unexpected POST /v1/completions"},
		{"not a request", "/v1/chat/completions", `{"messages":[]}`, "not a valid request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingTB{TB: t}
			srv := NewOpenAIServer(rec, nil)
			resp, _ := post(t, strings.TrimSuffix(srv.URL, "/v1")+tc.path, tc.body)
			if resp.StatusCode < 400 || resp.StatusCode >= 500 {
				t.Errorf("status %d, want a 4xx that clients do not retry", resp.StatusCode)
			}
			errs := rec.errors()
			if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
				t.Errorf("complaints = %q, want one about %q", errs, tc.want)
			}
		})
	}
}

func TestToolResultsParsing(t *testing.T) {
	oa := Request{format: formatOpenAI, Body: []byte(`{"messages":[
		{"role":"assistant","tool_calls":[{"id":"a"}]},
		{"role":"tool","tool_call_id":"a","content":"Traceback: boom"},
		{"role":"tool","tool_call_id":"b","content":[{"type":"text","text":"part1"},{"type":"text","text":"part2"}]}]}`)}
	got := oa.ToolResults()
	if len(got) != 2 || got[0] != (ToolResult{CallID: "a", Text: "Traceback: boom"}) || got[1].Text != "part1\npart2" {
		t.Errorf("openai = %+v", got)
	}
	an := Request{format: formatAnthropic, Body: []byte(`{"messages":[
		{"role":"user","content":"plain"},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":[{"type":"text","text":"err"},{"type":"image","source":{}}]},{"type":"text","text":"more"}]}]}`)}
	got = an.ToolResults()
	if len(got) != 1 || got[0] != (ToolResult{CallID: "t", Text: "err", IsError: true, Images: 1}) {
		t.Errorf("anthropic = %+v", got)
	}
}

func TestChunks(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want []string
	}{
		{"abcdefg", 3, []string{"abc", "def", "g"}},
		{"", 3, nil},
		{"héllo", 2, []string{"h", "é", "ll", "o"}},
		{"👋x", 1, []string{"👋", "x"}},
	} {
		got := chunks(tc.in, tc.n)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("chunks(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// A server whose replies come from a function numbers each reply, so
// completion and call ids differ from one request to the next (LangGraph
// merges messages that share an id).
func TestFuncRepliesHaveTheirOwnIDs(t *testing.T) {
	srv := NewOpenAIServerFunc(t, func(Request) Turn {
		return Turn{ToolCalls: []ToolCall{{Name: "f"}}}
	})
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		_, body := post(t, srv.URL+"/chat/completions", `{"model":"m","messages":[{"role":"user","content":"q"}]}`)
		var r struct {
			ID      string `json:"id"`
			Choices []struct {
				Message struct {
					ToolCalls []struct {
						ID string `json:"id"`
					} `json:"tool_calls"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) != 1 || len(r.Choices[0].Message.ToolCalls) != 1 {
			t.Fatalf("reply %d: %v %s", i, err, body)
		}
		for _, id := range []string{r.ID, r.Choices[0].Message.ToolCalls[0].ID} {
			if seen[id] {
				t.Errorf("reply %d reuses id %q", i, id)
			}
			seen[id] = true
		}
	}
}
