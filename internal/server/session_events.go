package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sandloop/sandloop/internal/eventstream"
	"github.com/sandloop/sandloop/internal/session"
)

// sessionEvents answers GET /v1/sessions/{id}/events: the session's
// lifecycle events (session.Event) after ?since= (or Last-Event-ID), as
// one JSON list, or, with Accept text/event-stream or
// application/x-ndjson, those and then each new one as it comes until the
// session closes. Reading them is no use of the session: it does not
// wake a hibernated one nor keep an idle one open. A session closed
// within the last hour still answers (its last event says why).
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	since := int64(0)
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("since")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, &apiError{http.StatusBadRequest, "bad_request", fmt.Sprintf("since %q: give the seq of the last event seen (a whole number, 0 for all)", v), 0})
			return
		}
		since = n
	}
	evs, err := s.opts.Manager.SessionEvents(owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	kind := streamKind(r)
	if kind == "" {
		list, ended, _ := evs.Since(since)
		if list == nil {
			list = []session.Event{}
		}
		WriteJSON(w, http.StatusOK, map[string]any{"events": list, "ended": ended})
		return
	}
	out := eventstream.New(w, streamHeader(kind))
	defer out.Close()
	keepalive := []byte(": keepalive\n\n")
	if kind != "sse" {
		keepalive = []byte(`{"type":"keepalive"}` + "\n")
	}
	out.Write(nil) // the headers now: the client knows it is subscribed
	out.Keepalive(s.opts.Keepalive, keepalive)
	for {
		list, ended, next := evs.Since(since)
		for _, e := range list {
			b, err := json.Marshal(e)
			if err != nil {
				continue
			}
			if kind == "sse" {
				out.Write(fmt.Appendf(nil, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, b))
			} else {
				out.Write(append(b, '\n'))
			}
			since = e.Seq
		}
		if ended {
			if kind == "sse" {
				out.Write([]byte("event: end\ndata: {}\n\n"))
			}
			return
		}
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
	}
}
