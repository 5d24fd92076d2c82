// Package llm talks to language models (OpenAI, OpenAI-compatible servers, Anthropic)
// through one small, provider-neutral interface.
//
// The neutral model is deliberately close to the Chat Completions shape (one message per
// tool result) because that shape converts to Anthropic's (tool results grouped into one
// user turn) without loss, while the reverse needs the grouping logic anyway.
package llm

import (
	"context"
	"encoding/json"
	"strings"
)

// Provider is one configured model. Implementations are safe for concurrent use.
type Provider interface {
	// Complete sends the conversation and returns the model's next message.
	// When req.OnText is set the call streams and OnText sees the text as it arrives.
	Complete(ctx context.Context, req Request) (*Response, error)
	// Info describes the model behind the provider.
	Info() ModelInfo
}

// ModelInfo describes a configured model.
type ModelInfo struct {
	Provider string // "openai", "anthropic", "ollama", "openai-compatible", "openrouter"
	Model    string // as the provider names it, e.g. "gpt-4o-mini"
	// Images reports whether the model accepts images (plots from tool results).
	Images bool
}

// String returns the "provider/model" form used by --model and SANDLOOP_MODEL.
func (m ModelInfo) String() string { return m.Provider + "/" + m.Model }

// Role is who wrote a message.
type Role string

const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	// RoleTool carries the result of one tool call (ToolCallID says which).
	RoleTool Role = "tool"
)

// Message is one entry of a conversation.
type Message struct {
	Role Role `json:"role"`
	// Text is the system prompt, the user's words, the assistant's words, or a tool's output.
	Text string `json:"text,omitempty"`
	// Images go with user and tool messages. They are dropped (with a note in the text)
	// for models that do not accept images.
	Images []Image `json:"images,omitempty"`
	// ToolCalls are the calls an assistant message makes.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID names the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// IsError marks a tool message whose tool failed (Anthropic tells the model so).
	IsError bool `json:"is_error,omitempty"`
}

// Image is an image given to the model, base64-encoded.
type Image struct {
	MediaType string `json:"media_type"` // e.g. "image/png"
	Data      string `json:"data"`       // standard base64, no data: prefix
}

// ToolCall is the model asking for a tool to run.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON text exactly as the model produced it. It may be malformed:
	// models do that, and the agent answers with an error result instead of failing,
	// so it is a string and not a json.RawMessage (which refuses to marshal bad JSON).
	Arguments string `json:"arguments"`
}

// ValidArguments reports whether Arguments is a JSON object, as tools expect.
func (c ToolCall) ValidArguments() bool {
	s := strings.TrimSpace(c.Arguments)
	return strings.HasPrefix(s, "{") && json.Valid([]byte(s))
}

// Tool is a tool the model may call.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Parameters is the JSON Schema of the arguments, an object schema.
	// If empty, the tool takes no arguments.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// TextFunc receives streamed text as it arrives.
type TextFunc func(delta string)

// Request is one call to the model.
type Request struct {
	Messages []Message
	Tools    []Tool
	// MaxTokens caps the reply. If zero, the provider's option applies
	// (for Anthropic, which requires a value, 8192).
	MaxTokens int
	// Temperature, if set, is passed through; nil leaves the server default.
	Temperature *float64
	// OnText, if set, makes the call stream and receives the text deltas in order,
	// on the caller's goroutine. The final Response holds the whole text regardless.
	OnText TextFunc
	// OnAttempt, if set, is called just before each HTTP request the call makes
	// (attempt 1, then 2, ... after retries): the caller starts waiting for the model.
	OnAttempt func(attempt int)
	// OnRetry, if set, is told of each failed attempt that will be tried again,
	// before the wait, so a person watching knows why nothing is happening.
	OnRetry func(Retry)
}

// StopReason says why the model stopped.
type StopReason string

const (
	StopEnd       StopReason = "end"        // a natural end of the turn
	StopToolUse   StopReason = "tool_use"   // the model wants its tool calls run
	StopMaxTokens StopReason = "max_tokens" // the reply hit MaxTokens
	// Other values are passed through as the provider reported them.
)

// Response is the model's reply to one Request.
type Response struct {
	// Message is the assistant message: text and/or tool calls.
	Message    Message
	StopReason StopReason
	Usage      Usage
	// Model is the model as the server reported it (often a dated snapshot).
	Model string
	// Attempts is how many HTTP requests the call took (more than one after retries).
	Attempts int
}

// Usage counts tokens and cost of one call (or, summed with Add, of a run).
type Usage struct {
	// InputTokens counts every prompt token, including those read from or written to a cache.
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty"`
	// Cost is in US dollars, from the price table.
	Cost float64 `json:"cost_usd"`
	// CostUnknown is set when the model is not in the price table, so Cost is 0 only
	// because nobody knows better (a local model is known, at zero). It is a negative
	// flag so that the zero Usage is a valid starting total for Add.
	CostUnknown bool `json:"cost_unknown,omitempty"`
}

// Add returns the sum of u and v. The sum's cost is unknown if either is.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:      u.InputTokens + v.InputTokens,
		OutputTokens:     u.OutputTokens + v.OutputTokens,
		CacheReadTokens:  u.CacheReadTokens + v.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens + v.CacheWriteTokens,
		Cost:             u.Cost + v.Cost,
		CostUnknown:      u.CostUnknown || v.CostUnknown,
	}
}
