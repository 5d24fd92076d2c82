package zygote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"golang.org/x/sys/unix"
)

// Process is a forked kernel: the session's PID 1 (the reaper) and the
// kernel (PID 2), in the session's cgroup.
type Process struct {
	group     *jail.Group
	limits    jail.Limits
	rep       *net.UnixConn
	reaperPid int
	kernelPid int
	listener  net.Listener // see Listener

	mu       sync.Mutex
	reaperFD int // pidfds: signals cannot reach a recycled PID
	kernelFD int
	closed   bool

	once    sync.Once
	waitErr error
}

// Usage is what the session's group uses now.
func (p *Process) Usage() (jail.LiveUsage, error) { return p.group.Usage() }

// Freeze stops every process of the session (its cgroup: the reaper, the
// kernel and what the kernel started) until Thaw; see jail.FreezeMethod.
func (p *Process) Freeze() error { return p.group.Freeze() }

// Thaw lets a frozen session run again.
func (p *Process) Thaw() error { return p.group.Thaw() }

// Listener is the listener on the session's loopback that Fork's
// listenPort asked for (nil if none); it is closed when the session ends.
func (p *Process) Listener() net.Listener { return p.listener }

// HostPids returns the host PIDs of the session's reaper and kernel.
func (p *Process) HostPids() []int { return []int{p.reaperPid, p.kernelPid} }

// Signal delivers sig to the kernel.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("unsupported signal %v", sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.kernelFD < 0 {
		return os.ErrProcessDone
	}
	return unix.PidfdSendSignal(p.kernelFD, s, nil, 0)
}

// Kill kills every process of the session: the reaper is PID 1 of the
// PID namespace the session's processes live in (the kernel's children,
// its checkpoint copies, joined commands: none can leave it, and seccomp
// forbids new namespaces), and when it dies the kernel kills the rest.
// The group is thawed if it was ever frozen, so the signals are not left
// pending. The cgroup's process list is not read here (on v1 a list per
// hierarchy, built and sorted by the kernel: a large share of a session's
// host CPU in issue 26's profile): Wait removes the group, and kills
// whatever it still holds then, such as a joined command's launcher on
// the host's side of the namespace (package jail's join), which ends by
// itself once its child in the namespace has died.
func (p *Process) Kill() error {
	p.mu.Lock()
	if !p.closed {
		for _, fd := range []int{p.reaperFD, p.kernelFD} {
			if fd >= 0 {
				_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
		}
	}
	p.mu.Unlock()
	p.group.ThawForKill()
	return nil
}

func (p *Process) closeFDs() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, fd := range []*int{&p.reaperFD, &p.kernelFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	if p.rep != nil {
		p.rep.Close()
	}
}

// Wait blocks until the session's reaper has exited (and with it every
// process of the session), removes the session's cgroup and says why the
// kernel ended. After the reaper's socket closes it waits (bounded) for
// the reaper's pidfd to say it has ended: the kernel reports a PID
// namespace's init ended only once every other process of the namespace
// has been reaped, so the group is empty then and its removal succeeds at
// the first rmdir, with no process list read and no retry.
func (p *Process) Wait() error {
	p.once.Do(func() {
		var st struct {
			Exited bool
			Code   int
			Signal int
		}
		exited := false
		for {
			msg, _, err := readMsg(p.rep)
			if err != nil {
				break
			}
			if json.Unmarshal(msg, &st) == nil && st.Exited {
				exited = true
			}
		}
		if fd, err := p.dupReaper(); err == nil {
			if err := awaitPidfd(fd, reaperExitWait); err != nil {
				// Remove kills what is left, and retries.
				p.group.Kill()
			}
		}
		oom := p.group.OOMKilled()
		if endedHook != nil {
			endedHook(p)
		}
		rmErr := p.group.Remove()
		p.closeFDs()
		if p.listener != nil {
			p.listener.Close()
		}
		switch {
		case oom:
			p.waitErr = fmt.Errorf("killed by the out-of-memory killer: the session's memory limit is %d MiB", p.limits.Memory>>20)
		case !exited:
			p.waitErr = errors.New("killed by signal SIGKILL")
		case st.Signal != 0:
			p.waitErr = fmt.Errorf("killed by signal %s", unix.SignalName(syscall.Signal(st.Signal)))
		case st.Code != 0:
			p.waitErr = fmt.Errorf("exited with status %d", st.Code)
		default:
			p.waitErr = rmErr
		}
	})
	return p.waitErr
}

// endedHook, if set (benchmarks), is called by Wait once the session's
// processes have ended, before their group is removed.
var endedHook func(*Process)

// reaperExitWait bounds Wait's wait for the reaper's end after its socket
// closed (its namespaces' teardown: the kernel process's memory, mounts).
const reaperExitWait = 10 * time.Second

// awaitPidfd waits until the process of pidfd has ended (a pidfd polls
// readable then), at most d, and closes pidfd. It waits in Go's poller,
// not in a blocked thread: hundreds of sessions may close at once.
func awaitPidfd(pidfd int, d time.Duration) error {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return err
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	if err := f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err // not in the poller
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return err != unix.EINTR && (err != nil || n > 0)
	})
}

// reaperFD returns a duplicate of the reaper's pidfd (the caller closes
// it), or an error once the session has ended.
func (p *Process) dupReaper() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.reaperFD < 0 {
		return -1, os.ErrProcessDone
	}
	return unix.FcntlInt(uintptr(p.reaperFD), unix.F_DUPFD_CLOEXEC, 0)
}

// DialLoopback connects to port on the session's own loopback.
func (p *Process) DialLoopback(ctx context.Context, port int) (net.Conn, error) {
	fd, err := p.dupReaper()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return jail.DialLoopback(ctx, fd, port)
}

// ListeningPorts lists the TCP ports listening on the session's loopback.
func (p *Process) ListeningPorts() ([]int, error) {
	fd, err := p.dupReaper()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return jail.PortsOf(fd, p.reaperPid)
}

// JoinTarget returns a target of the session's jail (jail.Config.Join):
// its reaper, PID 1 of the session's namespaces, in the session's group.
// The caller closes it.
func (p *Process) JoinTarget() (*jail.JoinTarget, error) {
	fd, err := p.dupReaper()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return jail.NewJoinTarget(fd, p.reaperPid, p.limits, p.group)
}
