package llmtest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
)

func (rp reply) anthropicStop() string {
	if rp.turn.StopReason != "" {
		return rp.turn.StopReason
	}
	if len(rp.turn.ToolCalls) > 0 {
		return "tool_use"
	}
	return "end_turn"
}

// anthropicInput splits Usage.InputTokens the way Anthropic reports it: input_tokens
// excludes the cached tokens.
func (rp reply) anthropicInput() (input, read, write int) {
	u := rp.turn.Usage
	return max(u.InputTokens-u.CacheReadTokens-u.CacheWriteTokens, 0), u.CacheReadTokens, u.CacheWriteTokens
}

func (rp reply) msgID() string { return "msg_llmtest" + strconv.Itoa(rp.n) }

// anthropicMessage is the non-streamed reply body.
func (rp reply) anthropicMessage(t testing.TB) map[string]any {
	content := []any{}
	if rp.turn.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": rp.turn.Text})
	}
	for i, tc := range rp.turn.ToolCalls {
		input := json.RawMessage(tc.args())
		if !json.Valid(input) {
			// A complete message always holds parsed input; only a stream can carry
			// broken JSON, so a script asking for it here is a mistake in the test.
			t.Errorf("llmtest: malformed tool arguments can only be streamed in the Anthropic format: %s", tc.Arguments)
			input = json.RawMessage("{}")
		}
		content = append(content, map[string]any{"type": "tool_use", "id": rp.callID(i, "toolu"), "name": tc.Name, "input": input})
	}
	in, read, write := rp.anthropicInput()
	return map[string]any{
		"id": rp.msgID(), "type": "message", "role": "assistant", "model": rp.model,
		"content": content, "stop_reason": rp.anthropicStop(), "stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens": in, "output_tokens": rp.turn.Usage.OutputTokens,
			"cache_read_input_tokens": read, "cache_creation_input_tokens": write,
			"service_tier": "standard",
		},
	}
}

// streamAnthropic plays the turn as Messages API events: message_start, ping, for each
// content block content_block_start / content_block_delta (text_delta or
// input_json_delta) / content_block_stop, then message_delta with the stop reason and
// output usage, and message_stop.
func (s *Server) streamAnthropic(w http.ResponseWriter, r *http.Request, rp reply) {
	ev := startSSE(w)
	in, read, write := rp.anthropicInput()
	ev.send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": rp.msgID(), "type": "message", "role": "assistant", "model": rp.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens": in, "output_tokens": 1,
			"cache_read_input_tokens": read, "cache_creation_input_tokens": write,
			"service_tier": "standard",
		},
	}})
	ev.send("ping", map[string]any{"type": "ping"})
	index := 0
	if rp.turn.Text != "" {
		ev.send("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "text", "text": ""}})
		for _, piece := range chunks(rp.turn.Text, rp.turn.ChunkSize) {
			ev.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "text_delta", "text": piece}})
		}
		if rp.turn.Hang {
			s.hang(r)
			return
		}
		if rp.streamError(ev) {
			return
		}
		ev.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	} else if rp.turn.Hang {
		s.hang(r)
		return
	} else if rp.streamError(ev) {
		return
	}
	for i, tc := range rp.turn.ToolCalls {
		ev.send("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "tool_use", "id": rp.callID(i, "toolu"), "name": tc.Name, "input": map[string]any{}}})
		// The real API opens every tool input with an empty fragment.
		pieces := append([]string{""}, chunks(tc.args(), rp.turn.ChunkSize)...)
		for _, piece := range pieces {
			ev.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": piece}})
		}
		ev.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	ev.send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": rp.anthropicStop(), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": rp.turn.Usage.OutputTokens}})
	ev.send("message_stop", map[string]any{"type": "message_stop"})
}

// streamError sends the turn's in-stream error, if it has one.
func (rp reply) streamError(ev *sse) bool {
	if rp.turn.StreamError == "" {
		return false
	}
	ev.send("error", map[string]any{"type": "error", "error": map[string]any{
		"type": rp.turn.StreamError, "message": "llmtest: injected " + rp.turn.StreamError,
	}})
	return true
}
