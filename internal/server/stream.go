package server

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/sandloop/sandloop/internal/eventstream"
	"github.com/sandloop/sandloop/internal/kernel"
)

// streamKind picks the response format from Accept.
func streamKind(r *http.Request) string {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part))
		switch mt {
		case "application/x-ndjson", "application/jsonl":
			return "ndjson"
		case "text/event-stream":
			return "sse"
		}
	}
	return ""
}

// streamHeader sets a stream's headers for kind ("sse" or "ndjson").
func streamHeader(kind string) func(http.Header) {
	return func(h http.Header) {
		if kind == "sse" {
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
		} else {
			h.Set("Content-Type", "application/x-ndjson")
		}
		h.Set("X-Accel-Buffering", "no")
	}
}

// stream runs exec, writing each event as it comes (NDJSON lines or SSE
// data events) and a keepalive event while nothing happens. The response
// headers are sent with the first event, so an error before any event is
// still a proper JSON error. Once closed is closed (the session is being
// killed), a write blocked on a client that does not read fails at once,
// so the kill never waits on the client.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, kind string, closed <-chan struct{}, exec func(kernel.EventFunc) (*kernel.Result, error)) (*kernel.Result, error) {
	out := eventstream.New(w, streamHeader(kind))
	frame := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			return nil
		}
		if kind == "sse" {
			return fmt.Appendf(nil, "data: %s\n\n", b)
		}
		return append(b, '\n')
	}
	write := func(v any) {
		if b := frame(v); b != nil {
			out.Write(b)
		}
	}
	out.AbortOn(closed)
	out.Keepalive(s.opts.Keepalive, frame(map[string]string{"type": "keepalive"}))
	res, err := exec(func(e kernel.Event) { write(e) })
	out.Close() // no keepalive once the handler has returned
	if err != nil && out.Started() {
		ae := toAPIError(err)
		write(map[string]string{"type": "fatal", "code": ae.Code, "message": ae.Message})
		return nil, nil
	}
	return res, err
}
