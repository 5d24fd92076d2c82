package jail

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Signalling a process by its number is a race: once it has ended and
// been reaped, the number is free, and the kernel may hand it to any new
// process at once (PIDs wrap at 32768 here, every few minutes under a
// burst of sandboxes). A signal meant for a sandbox's process would then
// reach another sandbox's, or the host's. So processes are signalled
// through pidfds, taken while the number is known to be the process's
// (it has not been reaped, and something that only the expected process
// can show is checked after the pidfd was opened): a pidfd keeps naming
// the same process, and signalling it once that process has ended fails
// (ESRCH) instead of reaching whoever took the number. Only where pidfds
// are refused (kernels before 5.3) do signals still go by number.

// pinned is a process held by a pidfd (nil: none, or gone before it could
// be pinned). Its methods are safe to call at any time, from any
// goroutine, and do nothing once it is released.
type pinned struct {
	mu  sync.Mutex
	fd  int // -1 once released
	pid int
	// byNumber: pidfds are refused here; signals go by number.
	byNumber bool
}

// pinChildOf pins process pid if it is now a child of parent (which has
// not reaped it: the number is its own until then). It returns nil if
// the number is no longer that child's.
func pinChildOf(pid, parent int) *pinned {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return &pinned{fd: -1, pid: pid, byNumber: true}
		}
		return nil
	}
	// Checked after the pidfd is open: if the process with that number is
	// still parent's child, the pidfd names it.
	if parentPid(pid) != parent {
		unix.Close(fd)
		return nil
	}
	return &pinned{fd: fd, pid: pid}
}

// pinOwn pins our own child pid, not yet waited for (its number is its
// own until we reap it).
func pinOwn(pid int) *pinned {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return &pinned{fd: -1, pid: pid, byNumber: true}
		}
		return nil
	}
	return &pinned{fd: fd, pid: pid}
}

// signal sends sig to the pinned process; os.ErrProcessDone if it has
// ended (or was never pinned, or is released).
func (c *pinned) signal(sig unix.Signal) error {
	if c == nil {
		return os.ErrProcessDone
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	switch {
	case c.byNumber:
		err = unix.Kill(c.pid, sig)
	case c.fd < 0:
		return os.ErrProcessDone
	default:
		err = unix.PidfdSendSignal(c.fd, sig, nil, 0)
	}
	if errors.Is(err, unix.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// alive says whether the pinned process has not been reaped yet (a
// zombie is alive here: its number is still its own).
func (c *pinned) alive() bool {
	return c.signal(0) == nil
}

// signalGroup sends sig to the process group that the pinned process
// leads (or led: a group outlives its leader while a member is left).
// From kernel 6.9 the pidfd names the group itself
// (PIDFD_SIGNAL_PROCESS_GROUP), however long ago the leader ended;
// before, the group goes by number, and only while the leader is alive
// (its number, and so its group's, is then its own), which leaves a few
// instructions between the check and the kill.
func (c *pinned) signalGroup(sig unix.Signal) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.byNumber:
		_ = unix.Kill(-c.pid, sig)
	case c.fd < 0:
	default:
		err := unix.PidfdSendSignal(c.fd, sig, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP)
		if errors.Is(err, unix.EINVAL) && unix.PidfdSendSignal(c.fd, 0, nil, 0) == nil {
			_ = unix.Kill(-c.pid, sig)
		}
	}
}

// release closes the pidfd: nothing is signalled through c from then on.
func (c *pinned) release() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	c.byNumber = false
}

// signalListed sends sig to each process that list names at two
// readings, if want (nil: every one) says so at the first: each is
// pinned by a pidfd, the list is read again, and only a process still
// listed is signalled, through its pidfd. A process that ended meanwhile
// gets nothing (ESRCH), and one that took its number but is not what the
// list names (not in the group, not in the tree) is not listed. Where
// pidfds are refused (kernels before 5.3) it signals by number. It
// returns how many processes it signalled.
func signalListed(list func() []int, sig unix.Signal, want func(pid int) bool) int {
	fds := map[int]int{}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	sent := 0
	for _, pid := range list() {
		if _, dup := fds[pid]; dup || want != nil && !want(pid) {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case err == nil:
			fds[pid] = fd
		case errors.Is(err, unix.ENOSYS):
			if unix.Kill(pid, sig) == nil {
				sent++
			}
		}
	}
	if len(fds) == 0 {
		return sent
	}
	done := map[int]bool{}
	for _, pid := range list() {
		if fd, ok := fds[pid]; ok && !done[pid] {
			done[pid] = true
			if unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
				sent++
			}
		}
	}
	return sent
}
