package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPty opens a pseudo-terminal: the master (the test's side, as the
// person typing) and the slave (the program's terminal).
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatalf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatalf("open pts: %v", err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	// A terminal of 0 columns is no terminal to line editors.
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 100}); err != nil {
		t.Fatalf("set window size: %v", err)
	}
	return m, s
}

// ptyOutput collects what a program writes to its terminal.
type ptyOutput struct {
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{} // closed when the master reads EOF/EIO: no one holds the terminal
}

func readPty(master *os.File) *ptyOutput {
	o := &ptyOutput{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

func (o *ptyOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// drained waits (bounded) until everything written to the terminal has
// been read: once the program has exited, its last output may still be in
// the terminal's buffer.
func (o *ptyOutput) drained() {
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
	}
}

// waitFor waits until the output holds n occurrences of s.
func (o *ptyOutput) waitFor(t *testing.T, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(o.String(), s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %d× %q; the terminal shows:\n%s", n, s, o.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
