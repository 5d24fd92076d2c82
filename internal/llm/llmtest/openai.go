package llmtest

import (
	"net/http"
	"strconv"
)

// created is a fixed timestamp so that recorded replies are reproducible.
const created = 1700000000

func (rp reply) openAIFinish() string {
	if rp.turn.StopReason != "" {
		return rp.turn.StopReason
	}
	if len(rp.turn.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

func (rp reply) openAIUsage() map[string]any {
	u := rp.turn.Usage
	return map[string]any{
		"prompt_tokens":     u.InputTokens,
		"completion_tokens": u.OutputTokens,
		"total_tokens":      u.InputTokens + u.OutputTokens,
		"prompt_tokens_details": map[string]any{
			"cached_tokens": u.CacheReadTokens, "audio_tokens": 0,
		},
		"completion_tokens_details": map[string]any{
			"reasoning_tokens": 0, "audio_tokens": 0,
			"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
		},
	}
}

// openAICompletion is the non-streamed reply body.
func (rp reply) openAICompletion() map[string]any {
	msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil, "annotations": []any{}}
	if rp.turn.Text != "" || len(rp.turn.ToolCalls) == 0 {
		msg["content"] = rp.turn.Text
	}
	if len(rp.turn.ToolCalls) > 0 {
		var calls []any
		for i, tc := range rp.turn.ToolCalls {
			calls = append(calls, map[string]any{
				"id": rp.callID(i, "call"), "type": "function",
				"function": map[string]any{"name": tc.Name, "arguments": tc.args()},
			})
		}
		msg["tool_calls"] = calls
	}
	return map[string]any{
		"id": rp.id(), "object": "chat.completion", "created": created, "model": rp.model,
		"choices": []any{map[string]any{
			"index": 0, "message": msg, "logprobs": nil, "finish_reason": rp.openAIFinish(),
		}},
		"usage":              rp.openAIUsage(),
		"service_tier":       "default",
		"system_fingerprint": "fp_llmtest",
	}
}

func (rp reply) id() string { return "chatcmpl-llmtest" + strconv.Itoa(rp.n) }

// streamOpenAI plays the turn as Chat Completions chunks: a role chunk, content
// deltas, for each tool call a chunk with its id and name followed by argument
// fragments, a finish chunk, a usage chunk (when asked for) and [DONE].
func (s *Server) streamOpenAI(w http.ResponseWriter, r *http.Request, rp reply) {
	ev := startSSE(w)
	chunk := func(delta map[string]any, finish any) {
		c := map[string]any{
			"id": rp.id(), "object": "chat.completion.chunk", "created": created, "model": rp.model,
			"system_fingerprint": "fp_llmtest",
			"choices": []any{map[string]any{
				"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish,
			}},
		}
		if rp.includeUsage {
			c["usage"] = nil // the real API sends an explicit null until the last chunk
		}
		ev.send("", c)
	}
	chunk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil)
	for _, piece := range chunks(rp.turn.Text, rp.turn.ChunkSize) {
		chunk(map[string]any{"content": piece}, nil)
	}
	if rp.turn.Hang {
		s.hang(r)
		return
	}
	if rp.turn.StreamError != "" {
		ev.send("", map[string]any{"error": map[string]any{
			"message": "llmtest: injected " + rp.turn.StreamError, "type": rp.turn.StreamError, "param": nil, "code": nil,
		}})
		return
	}
	for i, tc := range rp.turn.ToolCalls {
		chunk(map[string]any{"tool_calls": []any{map[string]any{
			"index": i, "id": rp.callID(i, "call"), "type": "function",
			"function": map[string]any{"name": tc.Name, "arguments": ""},
		}}}, nil)
		for _, piece := range chunks(tc.args(), rp.turn.ChunkSize) {
			chunk(map[string]any{"tool_calls": []any{map[string]any{
				"index": i, "function": map[string]any{"arguments": piece},
			}}}, nil)
		}
	}
	chunk(map[string]any{}, rp.openAIFinish())
	if rp.includeUsage {
		ev.send("", map[string]any{
			"id": rp.id(), "object": "chat.completion.chunk", "created": created, "model": rp.model,
			"system_fingerprint": "fp_llmtest", "choices": []any{}, "usage": rp.openAIUsage(),
		})
	}
	ev.send("", "[DONE]")
}
