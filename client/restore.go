package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A session whose host was lost comes back through a gateway under a new
// id, restored from its latest durable snapshot: the gateway answers the
// old id's requests with 307 Temporary Redirect to the same path under the
// new id, with these headers. The client follows it (every method; a
// request's body is sent again), maps the old id to the new one for its
// later calls, and tells Options.OnRestored.
const (
	// HeaderRestoredFrom is the old id of a redirect to a restored session.
	HeaderRestoredFrom = "Sandloop-Restored-From"
	// HeaderSessionID is the new id.
	HeaderSessionID = "Sandloop-Session-Id"
	// HeaderRestored says what came back (Restore.Summary). The gateway
	// sends it on the answer that made the restore; on later redirects of
	// the same id the client reads it from the new session.
	HeaderRestored = "Sandloop-Restored"
)

// maxReplay bounds what the client keeps of a request body it cannot
// rewind (an io.Reader that is not an io.Seeker) to send it again after a
// redirect. A gateway answers the redirect without reading the body, so
// only what the connection buffered was taken from the reader; past this
// bound the request fails with an error that says to send it again.
const maxReplay = 8 << 20

// SessionID returns the id the client now uses for session id: the id it
// was restored as if a gateway redirected one of its requests to a
// restored session (Options.OnRestored), else id itself.
func (c *Client) SessionID(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range 16 { // a restored session's host may be lost in turn
		to, ok := c.restored[id]
		if !ok {
			break
		}
		id = to
	}
	return id
}

// checkRedirect notes the restores a request is redirected to, then
// applies next (the caller's http.Client's policy; nil: Go's default of
// at most 10 redirects).
func (c *Client) checkRedirect(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if r := req.Response; r != nil && (r.StatusCode == http.StatusTemporaryRedirect || r.StatusCode == http.StatusPermanentRedirect) {
			from, to := r.Header.Get(HeaderRestoredFrom), r.Header.Get(HeaderSessionID)
			if from != "" && to != "" && from != to {
				c.noteRestore(req.Context(), from, to, r.Header.Get(HeaderRestored))
			}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// noteRestore maps from to to and tells OnRestored, once per restore.
func (c *Client) noteRestore(ctx context.Context, from, to, summary string) {
	c.mu.Lock()
	known := c.restored[from] == to
	c.restored[from] = to
	c.mu.Unlock()
	if known || c.onRestored == nil {
		return
	}
	if summary == "" {
		summary = c.restoredSummary(ctx, to)
	}
	c.onRestored(Restore{From: from, To: to, Summary: summary})
}

// restoredSummary reads what came back from session id itself (a later
// redirect of a restored id does not carry it).
func (c *Client) restoredSummary(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint(c.sessionPath(id, ""), nil), nil)
	if err != nil {
		return ""
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var s Session
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s) != nil {
		return ""
	}
	return s.Restored.Summary()
}

// Summary says in one line what came back, as the server's
// Sandloop-Restored header does.
func (r *Restored) Summary() string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "from %s: files exact (%d files)", r.From, r.Files)
	if len(r.Variables) > 0 {
		b.WriteString("; variables restored: " + strings.Join(r.Variables, ", "))
	} else {
		b.WriteString("; no variables restored")
	}
	if len(r.NotRestored) > 0 {
		b.WriteString("; not restorable: " + strings.Join(r.NotRestored, "; "))
	}
	return b.String()
}

// replayable makes req's body (read from body, which http.NewRequest
// could not rewind itself) one a redirect can send again: an io.Seeker
// is sought back to where it started; another reader's bytes are kept as
// they are read, up to maxReplay.
func replayable(req *http.Request, body io.Reader) {
	var cur *replayBody
	if s, ok := body.(io.Seeker); ok {
		if off, err := s.Seek(0, io.SeekCurrent); err == nil {
			cur = &replayBody{r: body, seeker: s, start: off, closed: make(chan struct{})}
		}
	}
	if cur == nil {
		cur = &replayBody{r: body, closed: make(chan struct{})}
	}
	req.Body = cur
	ctx := req.Context()
	var mu sync.Mutex
	// The client calls GetBody of the first request at every redirect.
	req.GetBody = func() (io.ReadCloser, error) {
		mu.Lock()
		defer mu.Unlock()
		// The transport may still be writing the last body (a server may
		// answer before reading it): it closes it when done.
		select {
		case <-cur.closed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		next := &replayBody{closed: make(chan struct{})}
		switch {
		case cur.seeker != nil:
			if _, err := cur.seeker.Seek(cur.start, io.SeekStart); err != nil {
				return nil, fmt.Errorf("sandloop: rewind the request body to send it again: %w", err)
			}
			next.r, next.seeker, next.start = cur.r, cur.seeker, cur.start
		case cur.over:
			return nil, fmt.Errorf("sandloop: the server redirected the request (a restored session) after more than %d MiB of its body was read, which cannot be sent again: send it again (an io.Seeker body, such as a file, is sent again by itself)", maxReplay>>20)
		default:
			next.r = io.MultiReader(bytes.NewReader(cur.buf), cur.r)
		}
		cur = next
		return next, nil
	}
}

// replayBody is a request body that keeps what was read of it (unless it
// can seek), and says when the transport is done with it.
type replayBody struct {
	r      io.Reader
	seeker io.Seeker
	start  int64
	buf    []byte
	over   bool // more than maxReplay was read: buf dropped
	closed chan struct{}
	once   sync.Once
}

func (b *replayBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.seeker == nil && !b.over && n > 0 {
		if len(b.buf)+n > maxReplay {
			b.over, b.buf = true, nil
		} else {
			b.buf = append(b.buf, p[:n]...)
		}
	}
	return n, err
}

func (b *replayBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
