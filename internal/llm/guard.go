package llm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// InvalidJSONError is a reply from the model server that is not the JSON
// its API promises: a proxy's HTML page, a truncated or garbled chunk.
type InvalidJSONError struct {
	Provider string
	Snippet  string // the start of what it sent
}

func (e *InvalidJSONError) Error() string {
	return fmt.Sprintf("%s: the model server sent invalid JSON: %q", e.Provider, e.Snippet)
}

// maxGuardedBody bounds how much of a non-streamed reply is read to check it.
const maxGuardedBody = 64 << 20

// guardJSON is an SDK middleware that checks what the model server sends
// is JSON — each data line of a stream, or the whole of another reply —
// so a broken reply is reported as such, with what it held, instead of as
// a decoder's message or, worse, as an empty answer.
func guardJSON(provider string, req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	resp, err := next(req)
	if err != nil || resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return resp, err
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "text/event-stream" {
		resp.Body = &sseGuard{provider: provider, br: bufio.NewReader(resp.Body), body: resp.Body}
		return resp, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxGuardedBody))
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, &InvalidJSONError{Provider: provider, Snippet: snippet(b)}
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func snippet(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// sseGuard passes a server-sent event stream on line by line, failing at
// the first data line that is not JSON.
type sseGuard struct {
	provider string
	br       *bufio.Reader
	body     io.Closer
	pending  []byte
	err      error
}

func (g *sseGuard) Read(p []byte) (int, error) {
	for len(g.pending) == 0 {
		if g.err != nil {
			return 0, g.err
		}
		line, err := g.br.ReadBytes('\n')
		g.err = err
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if len(data) > 0 && string(data) != "[DONE]" && !json.Valid(data) {
				g.err = &InvalidJSONError{Provider: g.provider, Snippet: snippet(data)}
				return 0, g.err
			}
		}
		g.pending = line
	}
	n := copy(p, g.pending)
	g.pending = g.pending[n:]
	return n, nil
}

func (g *sseGuard) Close() error { return g.body.Close() }
