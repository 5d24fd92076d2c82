package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SessionEvent is one transition in a session's life (GET
// /v1/sessions/{id}/events): how it was created, a pause, resume,
// hibernation or wake, a checkpoint, undo, fork or snapshot, a restart, a
// kernel that died, a loss of its processes, its close.
type SessionEvent struct {
	// Seq numbers the session's events from 1, in order.
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	// Type is "created", "paused", "resumed", "hibernated", "woken",
	// "checkpoint", "checkpoint_restored", "undone", "forked", "snapshot",
	// "kernel_restarted", "kernel_died", "taken_over" (the server
	// restarted, the kernel lived on in its keeper), "lost" or "closed"
	// (the last).
	Type string `json:"type"`
	// State is the session's state after it.
	State string `json:"state"`
	// How, for "created": "new", "pool", "template", "snapshot" or
	// "fork".
	How string `json:"how,omitempty"`
	// Reason says why, in words.
	Reason     string   `json:"reason,omitempty"`
	Checkpoint string   `json:"checkpoint,omitempty"`
	Snapshot   string   `json:"snapshot,omitempty"`
	Template   string   `json:"template,omitempty"`
	Parent     string   `json:"parent,omitempty"`
	Children   []string `json:"children,omitempty"`
	// Restored is what came back, for the events that restore.
	Restored *Restored `json:"restored,omitempty"`
}

// SessionEvents returns session id's events after seq since (0: all the
// server keeps, its latest 256), and whether the session has closed (no
// event follows). A session closed within the last hour still answers.
func (c *Client) SessionEvents(ctx context.Context, id string, since int64) ([]SessionEvent, bool, error) {
	var out struct {
		Events []SessionEvent `json:"events"`
		Ended  bool           `json:"ended"`
	}
	q := url.Values{"since": {strconv.FormatInt(since, 10)}}
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, "/events"), q, nil, &out); err != nil {
		return nil, false, err
	}
	return out.Events, out.Ended, nil
}

// WatchSessionEvents calls fn with each of session id's events after seq
// since, those recorded so far then each as it comes, on the calling
// goroutine, until the session closes (it returns nil after the "closed"
// event), ctx is canceled, or fn returns an error (which it returns).
// Watching is no use of the session: it neither wakes it nor keeps it
// open.
func (c *Client) WatchSessionEvents(ctx context.Context, id string, since int64, fn func(SessionEvent) error) error {
	q := url.Values{"since": {strconv.FormatInt(since, 10)}}
	hdr := http.Header{"Accept": {"application/x-ndjson"}}
	resp, err := c.request(ctx, http.MethodGet, c.sessionPath(id, "/events"), q, nil, "", hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-ndjson") {
		return fmt.Errorf("sandloop: session events: the server answered %q, not NDJSON", ct)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		if len(strings.TrimSpace(string(line))) > 0 {
			var e SessionEvent
			if jerr := json.Unmarshal(line, &e); jerr != nil {
				return fmt.Errorf("sandloop: session events: bad event %.200q: %w", line, jerr)
			}
			if e.Type == "keepalive" {
				continue
			}
			if ferr := fn(e); ferr != nil {
				return ferr
			}
			if e.Type == "closed" {
				return nil
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("sandloop: session events: the stream ended before the session closed: %w", err)
		}
	}
}
