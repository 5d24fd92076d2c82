package host

import (
	"bytes"
	"log/slog"
	"strings"
	"syscall"
	"testing"
)

// A hard limit on open files too low for --max-sessions is raised where
// the process may (CAP_SYS_RESOURCE); where it may not, a warning says
// what to raise. A limit already high enough is left alone.
func TestRaiseFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	low := syscall.Rlimit{Cur: 2048, Max: 2048}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	want := uint64(filesBase + filesPerSession*2000)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 2048, Max: 2049}) != nil {
		// Not allowed to raise it (no CAP_SYS_RESOURCE, as in many containers).
		var log bytes.Buffer
		if got := raiseFileLimit(2000, slog.New(slog.NewTextHandler(&log, nil))); got != 2048 {
			t.Errorf("limit %d, want 2048 kept", got)
		}
		if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "max_sessions=2000") || !strings.Contains(log.String(), "needs=25024") {
			t.Errorf("no warning naming the limit: %q", log.String())
		}
		return
	}
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low)
	if got := raiseFileLimit(2000, slog.New(slog.DiscardHandler)); got != want {
		t.Errorf("for 2000 sessions under a hard limit of 2048: limit %d, want %d", got, want)
	}
	var now syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now)
	if now.Cur != want || now.Max != want {
		t.Errorf("the process's limit is %+v, want %d", now, want)
	}
	if got := raiseFileLimit(10, slog.New(slog.DiscardHandler)); got != want {
		t.Errorf("a limit high enough was changed to %d", got)
	}
}
