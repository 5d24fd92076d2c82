package server

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

// stream runs exec, writing each event as it comes (NDJSON lines or SSE
// data events) and a keepalive event while nothing happens. The response
// headers are sent with the first event, so an error before any event is
// still a proper JSON error. Once closed is closed (the session is being
// killed), a write blocked on a client that does not read fails at once,
// so the kill never waits on the client.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, kind string, closed <-chan struct{}, exec func(kernel.EventFunc) (*kernel.Result, error)) (*kernel.Result, error) {
	flusher, _ := w.(http.Flusher)
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	started := false
	var killed atomic.Bool
	write := func(v any) {
		b, err := json.Marshal(v)
		if err != nil || killed.Load() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !started {
			started = true
			if kind == "sse" {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Cache-Control", "no-cache")
			} else {
				w.Header().Set("Content-Type", "application/x-ndjson")
			}
			w.Header().Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
		}
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if killed.Load() { // killed since the check above: fail at once
			_ = rc.SetWriteDeadline(time.Now())
		}
		if kind == "sse" {
			fmt.Fprintf(w, "data: %s\n\n", b)
		} else {
			w.Write(b)
			w.Write([]byte("\n"))
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		select {
		case <-closed: // (not under mu: a blocked write holds it)
			killed.Store(true)
			_ = rc.SetWriteDeadline(time.Now())
		case <-done:
		}
	}()
	go func() {
		defer close(stopped)
		t := time.NewTicker(s.opts.Keepalive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				write(map[string]string{"type": "keepalive"})
			}
		}
	}()
	res, err := exec(func(e kernel.Event) { write(e) })
	close(done)
	<-stopped // a keepalive must not be written once the handler has returned
	mu.Lock()
	wasStarted := started
	mu.Unlock()
	if err != nil && wasStarted {
		ae := toAPIError(err)
		write(map[string]string{"type": "fatal", "code": ae.Code, "message": ae.Message})
		return nil, nil
	}
	return res, err
}
