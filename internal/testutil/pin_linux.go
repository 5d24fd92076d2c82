package testutil

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Pinned is a process held by a pidfd: what is sent through it reaches
// that process or nothing, never one that took its number after it ended.
// A test that kills a process by its number at its end (a cleanup), when
// the process may have ended and been reaped long before (the test killed
// it), kills whoever has the number then: on a busy host, another test's
// sandbox (PIDs wrap at 32768).
type Pinned struct {
	fd  int
	Pid int
}

// Pin pins process pid, which must be running now (it has just answered,
// or it is a child not yet waited for). The pidfd is closed at tb's end.
func Pin(tb testing.TB, pid int) *Pinned {
	tb.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		tb.Fatalf("pin process %d: %v", pid, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return &Pinned{fd: fd, Pid: pid}
}

// Kill sends SIGKILL to the process, if it has not ended.
func (p *Pinned) Kill() { _ = unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0) }

// Ended says whether the process has ended (a zombie has).
func (p *Pinned) Ended() bool {
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}, 0)
	return err == nil && n > 0
}
