package main

import (
	"fmt"
	"io"
	"sync"

	"github.com/sandloop/sandloop/internal/jail"
)

// outputLimit bounds what `run` and `exec` pass on of a program's stdout
// and stderr: both stream live until together they reach max bytes; after
// that each keeps only its last bytes (tail), which Finish writes out, so
// the traceback at the end still reaches the user, with a note on stderr
// saying how much was dropped.
type outputLimit struct {
	mu      sync.Mutex
	max     int64
	left    int64 // bytes that may still pass straight through
	streams [2]*limitedStream
}

type limitedStream struct {
	l    *outputLimit
	name string
	w    io.Writer
	tail *jail.Capture // what came after the budget ran out, its end kept
}

// newOutputLimit bounds stdout and stderr to max bytes together, of which
// up to 64 KiB per stream (a quarter of max at most) is kept for the tails.
func newOutputLimit(limit int64, stdout, stderr io.Writer) *outputLimit {
	tail := max(min(64<<10, limit/4), 1)
	l := &outputLimit{max: limit, left: limit - 2*tail}
	for i, s := range []struct {
		name string
		w    io.Writer
	}{{"stdout", stdout}, {"stderr", stderr}} {
		l.streams[i] = &limitedStream{l: l, name: s.name, w: s.w, tail: jail.NewCapture(0, int(tail))}
	}
	return l
}

func (l *outputLimit) Stdout() io.Writer { return l.streams[0] }
func (l *outputLimit) Stderr() io.Writer { return l.streams[1] }

// Write passes p on while the budget lasts and keeps the rest's tail. It
// never fails: a caller that stopped reading must not stop the program.
func (s *limitedStream) Write(p []byte) (int, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	n := len(p)
	if s.l.left > 0 {
		k := min(int64(len(p)), s.l.left)
		s.l.left -= k
		_, _ = s.w.Write(p[:k])
		p = p[k:]
	}
	if len(p) > 0 {
		_, _ = s.tail.Write(p)
	}
	return n, nil
}

// Finish writes each stream's kept tail after a note on stderr saying how
// many bytes were dropped. It writes nothing if nothing was held back.
func (l *outputLimit) Finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.streams {
		if s.tail.Total() == 0 {
			continue
		}
		tail := s.tail.Tail()
		if dropped := s.tail.Total() - int64(len(tail)); dropped > 0 {
			fmt.Fprintf(l.streams[1].w, "\nsandloop: %d bytes of %s dropped (--max-output %s); its last %d bytes follow\n",
				dropped, s.name, formatSize(l.max), len(tail))
		}
		_, _ = s.w.Write(tail)
	}
}
