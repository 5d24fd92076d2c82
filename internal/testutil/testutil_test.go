package testutil

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalRecorder records Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// waitFor runs WaitFor on a goroutine of its own, for Goexit to end.
func waitFor(d time.Duration, try func() error) string {
	rec := &fatalRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(rec, d, try)
	}()
	<-done
	return rec.msg
}

func TestWaitForReturnsOnceTryDoes(t *testing.T) {
	t.Parallel()
	calls := 0
	msg := waitFor(10*time.Second, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if msg != "" || calls != 3 {
		t.Fatalf("after %d calls: %q", calls, msg)
	}
}

func TestWaitForFailsWithTheLastError(t *testing.T) {
	t.Parallel()
	calls := 0
	msg := waitFor(30*time.Millisecond, func() error {
		calls++
		return fmt.Errorf("attempt %d", calls)
	})
	if want := fmt.Sprintf("attempt %d", calls); calls < 2 || !strings.HasSuffix(msg, want) {
		t.Fatalf("after %d calls: %q, want it to end with %q", calls, msg, want)
	}
}
