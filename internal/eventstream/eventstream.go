// Package eventstream writes a stream of events (NDJSON lines, SSE data
// events) to an HTTP client that may stop reading: each write has a
// deadline, keepalives fill the silences, and Abort fails a write blocked
// on such a client at once, so that killing the session behind the stream
// never waits on the client.
package eventstream

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// WriteTimeout bounds one write to a client that does not read.
const WriteTimeout = 30 * time.Second

// Writer writes events to one response, one at a time, from any goroutine.
type Writer struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	header func(http.Header) // sets the response's headers before the first write

	mu      sync.Mutex
	started bool
	aborted atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// New returns a Writer on w; header, if not nil, sets the response's headers
// (Content-Type...) just before the first event is written with status 200.
func New(w http.ResponseWriter, header func(http.Header)) *Writer {
	return &Writer{w: w, rc: http.NewResponseController(w), header: header, stop: make(chan struct{})}
}

// Started says whether the response's headers have been sent.
func (s *Writer) Started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// Write writes one event (b, already framed) and flushes it. After Abort it
// writes nothing.
func (s *Writer) Write(b []byte) {
	if s.aborted.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		if s.header != nil {
			s.header(s.w.Header())
		}
		s.w.WriteHeader(http.StatusOK)
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if s.aborted.Load() { // aborted since the check above: fail at once
		_ = s.rc.SetWriteDeadline(time.Now())
	}
	_, _ = s.w.Write(b)
	_ = s.rc.Flush()
}

// Abort fails a write blocked on the client at once, and every later one.
// It does not wait for the lock a blocked write holds.
func (s *Writer) Abort() {
	s.aborted.Store(true)
	_ = s.rc.SetWriteDeadline(time.Now())
}

// AbortOn aborts the stream when done is closed (the session behind it is
// being killed), until Close.
func (s *Writer) AbortOn(done <-chan struct{}) {
	s.wg.Go(func() {
		select {
		case <-done:
			s.Abort()
		case <-s.stop:
		}
	})
}

// Keepalive writes event every interval while the stream is open, until Close.
func (s *Writer) Keepalive(interval time.Duration, event []byte) {
	s.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.Write(event)
			}
		}
	})
}

// Close stops the keepalives and the abort watch, and waits for them: no
// keepalive is written once Close has returned. The Writer may still
// write the stream's last events.
func (s *Writer) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
}
