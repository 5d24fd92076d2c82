package jail

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"bufio"

	"golang.org/x/sys/unix"
)

// Jails that outlive the server (package keeper).
//
// A jail started with Config.Spawn is started by another process, the
// keeper, whose child it is (its Pdeathsig is relative to the keeper, so
// it dies with the keeper, never with the server). The server holds it by
// a pidfd the keeper sends back: it signals it through the pidfd and
// learns of its end by polling it; the exit status comes, as for any
// jail, from the init's status pipe. Handoff gives what another server
// needs to take the jail over (its pidfd, status pipe and listener, its
// cgroup's name, its network namespace) and Attach takes it over: the
// same Process, with Wait, Kill, Freeze, Usage and DialLoopback working as
// they did for the server that started it.

// SpawnFunc starts cmd in another process (a keeper), which must not use
// cmd.SysProcAttr.Pdeathsig of this process: the child's parent is that
// process. It returns the child's PID and a pidfd of it.
type SpawnFunc func(cmd *exec.Cmd) (pid int, pidfd *os.File, err error)

// hostProcess is the jail's init as the server holds it.
type hostProcess interface {
	Signal(os.Signal) error
	Kill() error
	pid() int
	// ended says whether it has ended (before it is waited for).
	ended() bool
}

// osProcess is an init that is our child.
type osProcess struct{ *os.Process }

func (p osProcess) pid() int { return p.Pid }

// ended: a zombie. Not yet waited for, the number is still our child's.
func (p osProcess) ended() bool {
	st := procState(p.Pid)
	return st == 'Z' || st == 'X'
}

// pidfdProcess is an init held by a pidfd (a keeper's child).
type pidfdProcess struct {
	fd  *os.File
	pnr int
}

func (p pidfdProcess) pid() int { return p.pnr }

func (p pidfdProcess) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("unsupported signal")
	}
	if err := unix.PidfdSendSignal(int(p.fd.Fd()), s, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	return nil
}

func (p pidfdProcess) Kill() error { return p.Signal(syscall.SIGKILL) }

// ended: a pidfd polls readable once its process has ended.
func (p pidfdProcess) ended() bool {
	pfd := []unix.PollFd{{Fd: int32(p.fd.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0
}

// waitPidfd returns a function that waits for the process of fd to end
// (a pidfd polls readable then), or for cancel to be readable (Detach).
// It cannot learn the exit status: that comes from the status pipe.
func waitPidfd(fd, cancel *os.File) func() (*os.ProcessState, error) {
	return func() (*os.ProcessState, error) {
		pfd := []unix.PollFd{{Fd: int32(fd.Fd()), Events: unix.POLLIN}, {Fd: int32(cancel.Fd()), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(pfd, -1)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("poll the jail's pidfd: %w", err)
			}
			if pfd[0].Revents != 0 || pfd[1].Revents != 0 {
				return nil, nil
			}
		}
	}
}

// held prepares p, whose init fd holds, to be waited for by its pidfd.
func (p *Process) held(fd *os.File, pid int) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	p.pid, p.pidfd, p.proc = pid, fd, pidfdProcess{fd: fd, pnr: pid}
	p.cancelR, p.cancelW = r, w
	p.waitProc = waitPidfd(fd, r)
	return nil
}

// spawnBy starts the init command by spawn.
func (p *Process) spawnBy(spawn SpawnFunc, cmd *exec.Cmd) error {
	pid, fd, err := spawn(cmd)
	if err != nil {
		return err
	}
	if err := p.held(fd, pid); err != nil {
		unix.PidfdSendSignal(int(fd.Fd()), unix.SIGKILL, nil, 0)
		fd.Close()
		return err
	}
	return nil
}

// Handoff is what a server needs, besides the files HandoffFiles lists,
// to take over a jail another one started (Attach).
type Handoff struct {
	Pid      int       `json:"pid"`
	Cgroup   string    `json:"cgroup,omitempty"` // the group's name, "" if none
	Start    time.Time `json:"start"`
	Network  Network   `json:"network,omitempty"`
	Netns    uint64    `json:"netns,omitempty"`
	Enforce  string    `json:"enforce"`
	Warn     []string  `json:"warn,omitempty"`
	Listener bool      `json:"listener,omitempty"` // a third file: the listener
	// Limits are the jail's: a command joined into it after a takeover
	// (JoinTarget) gets them, as one joined before did.
	Limits Limits `json:"limits"`
}

// Handoff returns how another server takes the jail over, and copies of
// its files: the pidfd, the status pipe and, if any, the listener. Only a
// jail started with Config.Spawn, without a terminal or stdin, can be
// handed over.
func (p *Process) Handoff() (Handoff, []*os.File, error) {
	if p.pidfd == nil || p.tty != nil || p.stdin != nil {
		return Handoff{}, nil, errors.New("this jail was not started by a keeper")
	}
	h := Handoff{Pid: p.pid, Cgroup: p.cgName, Start: p.start, Network: p.network, Netns: p.netns, Enforce: p.enforce, Warn: p.warn, Limits: p.limits}
	var files []*os.File
	for _, f := range []*os.File{p.pidfd, p.statusF} {
		d, err := dupFile(f)
		if err != nil {
			closeAll(files)
			return Handoff{}, nil, err
		}
		files = append(files, d)
	}
	if p.listener != nil {
		fl, ok := p.listener.(interface{ File() (*os.File, error) })
		if !ok {
			closeAll(files)
			return Handoff{}, nil, errors.New("the jail's listener has no descriptor")
		}
		f, err := fl.File()
		switch {
		case errors.Is(err, net.ErrClosed):
			// Closed by its user (a pooled kernel's unused standby
			// listener): nothing to hand over.
		case err != nil:
			closeAll(files)
			return Handoff{}, nil, err
		default:
			files = append(files, f)
			h.Listener = true
		}
	}
	return h, files, nil
}

// Attach takes over the jail h describes, with the files Handoff gave
// (which it owns from now on, closing them on failure).
func Attach(h Handoff, files []*os.File) (*Process, error) {
	want := 2
	if h.Listener {
		want = 3
	}
	if len(files) != want {
		closeAll(files)
		return nil, fmt.Errorf("attach jail %d: want %d descriptors, got %d", h.Pid, want, len(files))
	}
	// A record written before Limits was: the defaults, not zero (a
	// joined command under NPROC 0 could not start).
	p := &Process{done: make(chan struct{}), cgName: h.Cgroup, start: h.Start, limits: h.Limits.WithDefaults(),
		network: h.Network, netns: h.Netns, enforce: h.Enforce, warn: h.Warn, statusF: files[1]}
	if err := p.held(files[0], h.Pid); err != nil {
		closeAll(files)
		return nil, err
	}
	p.status = bufio.NewReader(io.LimitReader(files[1], 1<<20))
	if h.Listener {
		ln, err := net.FileListener(files[2])
		files[2].Close()
		if err != nil {
			files[0].Close()
			files[1].Close()
			return nil, fmt.Errorf("attach jail %d: its listener: %w", h.Pid, err)
		}
		p.listener = ln
	}
	if h.Cgroup != "" {
		cg, err := attachCgroup(detectCgroups(), h.Cgroup)
		if err != nil {
			p.closeAttached()
			return nil, fmt.Errorf("attach jail %d: %w", h.Pid, err)
		}
		p.cg = cg
	}
	return p, nil
}

func (p *Process) closeAttached() {
	p.cancelR.Close()
	p.cancelW.Close()
	p.pidfd.Close()
	p.statusF.Close()
	if p.listener != nil {
		p.listener.Close()
	}
}

// Detach lets go of a jail a keeper holds without ending it: a Wait in
// progress returns (with an error) without having waited for the jail,
// and this process's descriptors of it are closed.
func (p *Process) Detach() {
	if p.cancelW == nil {
		return
	}
	p.detached.Store(true)
	p.cancelW.Close()
	p.Wait()
}

// detach is wait's end for a detached jail.
func (p *Process) detach() (*Result, error) {
	p.cancelR.Close()
	p.pidfd.Close()
	p.statusF.Close()
	if p.listener != nil {
		p.listener.Close()
	}
	if p.cg != nil {
		for _, d := range p.cg.dirs {
			liveGroups.Delete(d)
		}
	}
	return nil, errors.New("detached from the jail")
}

// attachCgroup is the existing group name of a jail another server
// started.
func attachCgroup(h cgroupHost, name string) (*cgroup, error) {
	cg := &cgroup{mode: h.mode, byC: map[string]string{}}
	add := func(c, d string) error {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("the jail's cgroup %s is gone", d)
		}
		if c != "" {
			cg.byC[c] = d
		}
		if !contains(cg.dirs, d) {
			cg.dirs = append(cg.dirs, d)
			liveGroups.Store(d, true)
		}
		return nil
	}
	switch h.mode {
	case "cgroup v1":
		for _, c := range v1Controllers {
			if err := add(c, filepath.Join(h.v1[c], name)); err != nil {
				return nil, err
			}
		}
		if h.freezer != "" {
			if err := add("freezer", filepath.Join(h.freezer, name)); err != nil {
				return nil, err
			}
		}
	case "cgroup v2":
		if err := add("", filepath.Join(h.v2, name)); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("no cgroups")
	}
	return cg, nil
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
