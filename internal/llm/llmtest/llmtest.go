// Package llmtest runs local HTTP servers that speak the OpenAI Chat Completions and
// Anthropic Messages wire formats, so tests can drive the real SDK clients through a
// scripted conversation and then check what reached the "model".
//
// A test writes the model's side as a Script, one Turn per request, and gives the
// server's URL to the provider:
//
//	srv := llmtest.NewOpenAIServer(t, llmtest.Script{
//		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"1/0"}`}}},
//		{Text: "Fixed it."},
//	})
//	p := llm.NewOpenAI(llm.OpenAIOptions{BaseURL: srv.URL, APIKey: "test", Model: "gpt-4o-mini"})
//	... run the agent ...
//	res := srv.Requests()[1].ToolResults() // what the tool told the model
//
// The servers stream exactly as the real APIs do when the request asks for a stream
// (data: chunks with tool-call deltas, a usage chunk and [DONE]; or Anthropic's named
// events) and answer with one JSON body otherwise. The package does not import llm,
// so llm's own tests can use it.
package llmtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Script is the model's side of a conversation: the i-th request gets the i-th Turn.
type Script []Turn

// Turn is one reply of the model, or an HTTP error in its place.
type Turn struct {
	// Text is the assistant's text.
	Text string
	// ToolCalls are the calls the assistant makes, in order (parallel calls if several).
	ToolCalls []ToolCall
	// Status, if set, answers with this HTTP status and the provider's error body
	// instead of a reply (401, 404, 429, 500, 529, ...).
	Status int
	// RetryAfter, if set, is sent as the Retry-After header with Status ("0", "2").
	RetryAfter string
	// Error is the message in the error body. If empty, one like the real API's.
	Error string
	// Usage is reported for the turn. If zero, 100 input and 20 output tokens.
	Usage Usage
	// StopReason overrides the finish reason (OpenAI "stop", "length"...; Anthropic
	// "end_turn", "max_tokens"...). If empty, it follows from ToolCalls.
	StopReason string
	// ChunkSize is how many bytes of text or arguments go in one streamed delta,
	// so that arguments arrive split as they do from real models. If zero, 4.
	ChunkSize int
	// Hang makes a streamed reply stop after its text, holding the connection open
	// until the client goes away: for testing cancellation mid-stream.
	Hang bool
	// StreamError, if set, ends a streamed reply after its text with an error inside
	// the stream, of this type ("overloaded_error", "server_error"), as the real APIs
	// do when they fail after the 200 status has gone out.
	StreamError string
	// Delay holds the reply back this long before anything is sent (a slow
	// model, or with a client timeout a model that does not answer in time).
	// The wait ends early if the client goes away.
	Delay time.Duration
	// Drop closes the connection without answering, as a proxy that resets it.
	Drop bool
}

// ToolCall is a scripted tool call.
type ToolCall struct {
	// ID is the call's id. If empty, one is made up ("call_1_0", "toolu_1_0").
	ID   string
	Name string
	// Arguments is the JSON text of the arguments, sent verbatim, so it may be
	// malformed on purpose. If empty, "{}".
	Arguments string
}

// Usage is a token count reported by the server.
type Usage struct {
	InputTokens      int // total prompt tokens, cached ones included (as in llm.Usage)
	OutputTokens     int
	CacheReadTokens  int
	CacheWriteTokens int // Anthropic only
}

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	format format
}

// Decode unmarshals the body into v.
func (r Request) Decode(v any) error { return json.Unmarshal(r.Body, v) }

// Stream reports whether the request asked for a streamed reply.
func (r Request) Stream() bool {
	var b struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(r.Body, &b)
	return b.Stream
}

// Model is the model the request named.
func (r Request) Model() string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(r.Body, &b)
	return b.Model
}

// ToolResult is a tool's result as the request carried it to the model.
type ToolResult struct {
	CallID  string
	Text    string
	IsError bool // Anthropic's is_error; always false in the OpenAI format
	Images  int  // images inside the result (Anthropic); OpenAI carries them in a user message
}

// ToolResults returns every tool result in the request's conversation, in order.
func (r Request) ToolResults() []ToolResult {
	var out []ToolResult
	switch r.format {
	case formatOpenAI:
		var b struct {
			Messages []struct {
				Role       string          `json:"role"`
				Content    json.RawMessage `json:"content"`
				ToolCallID string          `json:"tool_call_id"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(r.Body, &b)
		for _, m := range b.Messages {
			if m.Role == "tool" {
				text, _ := contentText(m.Content)
				out = append(out, ToolResult{CallID: m.ToolCallID, Text: text})
			}
		}
	case formatAnthropic:
		var b struct {
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(r.Body, &b)
		for _, m := range b.Messages {
			var blocks []struct {
				Type      string          `json:"type"`
				ToolUseID string          `json:"tool_use_id"`
				IsError   bool            `json:"is_error"`
				Content   json.RawMessage `json:"content"`
			}
			if json.Unmarshal(m.Content, &blocks) != nil {
				continue
			}
			for _, bl := range blocks {
				if bl.Type == "tool_result" {
					text, images := contentText(bl.Content)
					out = append(out, ToolResult{CallID: bl.ToolUseID, Text: text, IsError: bl.IsError, Images: images})
				}
			}
		}
	}
	return out
}

// contentText joins the text of a content field that is a string or a list of
// blocks, and counts the images among the blocks.
func contentText(raw json.RawMessage) (string, int) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, 0
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var texts []string
	images := 0
	for _, p := range parts {
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "image", "image_url":
			images++
		}
	}
	return strings.Join(texts, "\n"), images
}

type format int

const (
	formatOpenAI format = iota + 1
	formatAnthropic
)

// Server is a running fake provider. Its URL goes to the provider's BaseURL option.
type Server struct {
	// URL is the base URL to configure the SDK with: it ends in /v1 for OpenAI (as
	// OpenAI's own does) and is the bare root for Anthropic (as the SDK expects).
	URL string

	t       testing.TB
	srv     *httptest.Server
	format  format
	script  Script
	respond func(Request) Turn
	closing chan struct{}

	mu       sync.Mutex
	next     int
	requests []Request
}

// NewOpenAIServer starts a server speaking Chat Completions at URL/chat/completions.
// It is closed when the test ends.
func NewOpenAIServer(t testing.TB, script Script) *Server {
	t.Helper()
	s := newServer(t, script, formatOpenAI)
	s.URL = s.srv.URL + "/v1"
	return s
}

// NewAnthropicServer starts a server speaking the Messages API at URL/v1/messages.
// It is closed when the test ends.
func NewAnthropicServer(t testing.TB, script Script) *Server {
	t.Helper()
	s := newServer(t, script, formatAnthropic)
	s.URL = s.srv.URL
	return s
}

// NewOpenAIServerFunc starts a server speaking Chat Completions whose
// every reply is respond's answer to the request: a model that reacts to
// what it is shown (an error, a hint in the system prompt) as a real one
// would, for as many turns as the conversation takes.
func NewOpenAIServerFunc(t testing.TB, respond func(Request) Turn) *Server {
	t.Helper()
	s := newServer(t, nil, formatOpenAI)
	s.respond = respond
	s.URL = s.srv.URL + "/v1"
	return s
}

// System returns the request's system prompt.
func (r Request) System() string {
	var b struct {
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(r.Body, &b)
	if len(b.System) > 0 {
		s, _ := contentText(b.System)
		return s
	}
	var parts []string
	for _, m := range b.Messages {
		if m.Role == "system" || m.Role == "developer" {
			s, _ := contentText(m.Content)
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "\n")
}

// UserTexts returns the text of the request's user messages, in order
// (tool results excluded).
func (r Request) UserTexts() []string {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(r.Body, &b)
	var out []string
	for _, m := range b.Messages {
		if m.Role == "user" {
			if s, _ := contentText(m.Content); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

func newServer(t testing.TB, script Script, f format) *Server {
	s := &Server{t: t, format: f, script: script, closing: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(func() {
		close(s.closing) // release hanging streams first: Close waits for handlers
		s.srv.Close()
	})
	return s
}

// Requests returns the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Remaining returns how many turns of the script have not been played.
func (s *Server) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.script) - s.next
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client went away
	}
	wantPath := "/v1/chat/completions"
	if s.format == formatAnthropic {
		wantPath = "/v1/messages"
	}
	if r.Method != http.MethodPost || r.URL.Path != wantPath {
		s.t.Errorf("llmtest: unexpected %s %s (want POST %s)", r.Method, r.URL.Path, wantPath)
		s.writeError(w, Turn{Status: http.StatusNotFound, Error: "llmtest: no such endpoint " + r.URL.Path}, "")
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, format: s.format})
	turnNo := s.next
	if turnNo < len(s.script) {
		s.next++
	}
	if s.respond != nil {
		// Each reply has its own number, so its own completion and call ids:
		// clients (LangGraph's message list) merge messages by id.
		turnNo = len(s.requests) - 1
	}
	s.mu.Unlock()

	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		MaxTokens     *int   `json:"max_tokens"`
		Messages      []any  `json:"messages"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || len(req.Messages) == 0 ||
		(s.format == formatAnthropic && req.MaxTokens == nil) {
		s.t.Errorf("llmtest: request %d is not a valid request (model, messages%s): %v\n%s",
			turnNo+1, map[bool]string{true: ", max_tokens"}[s.format == formatAnthropic], err, body)
		s.writeError(w, Turn{Status: http.StatusBadRequest, Error: "llmtest: invalid request"}, req.Model)
		return
	}
	if s.respond != nil {
		turn := s.respond(Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, format: s.format})
		s.play(w, r, turn, turnNo, req.Model, req.Stream, req.StreamOptions.IncludeUsage)
		return
	}
	if turnNo >= len(s.script) {
		// 400, not 5xx: a client would retry a 5xx and repeat the complaint.
		s.t.Errorf("llmtest: request %d, but the script has only %d turns", turnNo+1, len(s.script))
		s.writeError(w, Turn{Status: http.StatusBadRequest, Error: "llmtest: script exhausted"}, req.Model)
		return
	}
	s.play(w, r, s.script[turnNo], turnNo, req.Model, req.Stream, req.StreamOptions.IncludeUsage)
}

// play answers with turn, the reply to request turnNo+1.
func (s *Server) play(w http.ResponseWriter, r *http.Request, turn Turn, turnNo int, model string, stream, includeUsage bool) {
	if turn.Delay > 0 {
		t := time.NewTimer(turn.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		}
	}
	if turn.Drop {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		s.t.Errorf("llmtest: cannot drop the connection")
		return
	}
	if turn.Status != 0 {
		s.writeError(w, turn, model)
		return
	}
	if turn.Usage == (Usage{}) {
		turn.Usage = Usage{InputTokens: 100, OutputTokens: 20}
	}
	if turn.ChunkSize <= 0 {
		turn.ChunkSize = 4
	}
	rp := reply{turn: turn, n: turnNo + 1, model: model, includeUsage: includeUsage}
	switch {
	case s.format == formatOpenAI && stream:
		s.streamOpenAI(w, r, rp)
	case s.format == formatOpenAI:
		writeJSON(w, rp.openAICompletion())
	case stream:
		s.streamAnthropic(w, r, rp)
	default:
		writeJSON(w, rp.anthropicMessage(s.t))
	}
}

// reply is a turn being played for one request.
type reply struct {
	turn         Turn
	n            int // 1-based request number, for ids
	model        string
	includeUsage bool
}

func (rp reply) callID(i int, prefix string) string {
	if id := rp.turn.ToolCalls[i].ID; id != "" {
		return id
	}
	return fmt.Sprintf("%s_%d_%d", prefix, rp.n, i)
}

func (tc ToolCall) args() string {
	if tc.Arguments == "" {
		return "{}"
	}
	return tc.Arguments
}

// writeError answers with the provider's error body for the status.
func (s *Server) writeError(w http.ResponseWriter, turn Turn, model string) {
	msg, oaType, oaCode, anType := turn.Error, "invalid_request_error", "", "invalid_request_error"
	switch turn.Status {
	case http.StatusUnauthorized:
		oaCode, anType = "invalid_api_key", "authentication_error"
		if msg == "" {
			msg = "Incorrect API key provided."
		}
	case http.StatusForbidden:
		anType = "permission_error"
		if msg == "" {
			msg = "You do not have access to this resource."
		}
	case http.StatusNotFound:
		oaCode, anType = "model_not_found", "not_found_error"
		if msg == "" {
			msg = fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)
			if s.format == formatAnthropic {
				msg = "model: " + model
			}
		}
	case http.StatusTooManyRequests:
		oaType, oaCode, anType = "requests", "rate_limit_exceeded", "rate_limit_error"
		if msg == "" {
			msg = "Rate limit reached. Please try again later."
		}
	case 529:
		oaType, anType = "server_error", "overloaded_error"
		if msg == "" {
			msg = "Overloaded"
		}
	default:
		if turn.Status >= 500 {
			oaType, anType = "server_error", "api_error"
			if msg == "" {
				msg = "The server had an error while processing your request."
			}
		}
	}
	if msg == "" {
		msg = http.StatusText(turn.Status)
	}
	if turn.RetryAfter != "" {
		w.Header().Set("Retry-After", turn.RetryAfter)
	}
	var body any
	if s.format == formatOpenAI {
		var code any
		if oaCode != "" {
			code = oaCode
		}
		body = map[string]any{"error": map[string]any{"message": msg, "type": oaType, "param": nil, "code": code}}
	} else {
		w.Header().Set("request-id", "req_llmtest")
		body = map[string]any{"type": "error", "error": map[string]any{"type": anType, "message": msg}}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(turn.Status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// sse writes server-sent events and flushes each, as the real APIs do.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &sse{w: w, f: f}
}

func (s *sse) send(event string, data any) {
	if event != "" {
		fmt.Fprintf(s.w, "event: %s\n", event)
	}
	switch d := data.(type) {
	case string:
		fmt.Fprintf(s.w, "data: %s\n\n", d)
	default:
		b, _ := json.Marshal(d)
		fmt.Fprintf(s.w, "data: %s\n\n", b)
	}
	if s.f != nil {
		s.f.Flush()
	}
}

// hang waits until the client goes away or the test ends.
func (s *Server) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.closing:
	}
}

// chunks cuts s into pieces of at most n bytes without splitting a UTF-8 sequence.
func chunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		i := n
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		if i == 0 {
			_, i = utf8.DecodeRuneInString(s)
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}
