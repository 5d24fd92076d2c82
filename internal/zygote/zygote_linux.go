package zygote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"golang.org/x/sys/unix"
)

// Errors callers may branch on.
var (
	// ErrClosed means the Zygote was closed.
	ErrClosed = errors.New("zygote closed")
	// errDead: the template died before it took the request.
	errDead = errors.New("zygote template died")
)

// startTimeout bounds the template's start (imports included) and one fork
// when the caller's context has no deadline.
const startTimeout = 2 * time.Minute

// Zygote is a running template and the sessions' kernels it forks. Its
// methods are safe for concurrent use; forks are taken one at a time.
type Zygote struct {
	opts   Options
	log    *slog.Logger
	config []byte // the template's first message

	mu      sync.Mutex // the template's control socket and restarts
	cur     *instance  // nil while none runs
	retired map[*instance]bool
	nextID  int
	closed  bool
	wg      sync.WaitGroup // background restarts
}

// instance is one template process in its own jail.
type instance struct {
	proc    *jail.Process
	ws      string
	ctl     *net.UnixConn
	pid     int         // host PID of the template
	replies chan []byte // from read
	dead    chan struct{}
	ended   chan struct{} // the jail (and every fork left in it) ended
}

// New starts a template and waits until it has imported its modules.
func New(ctx context.Context, opts *Options) (*Zygote, error) {
	z := &Zygote{retired: map[*instance]bool{}}
	if opts != nil {
		z.opts = *opts
	}
	if z.opts.Modules == nil {
		z.opts.Modules = DefaultModules
	}
	if z.opts.Limits.Memory == 0 {
		z.opts.Limits.Memory = 2 << 30
	}
	if z.opts.Limits.Pids == 0 {
		z.opts.Limits.Pids = 64
	}
	z.log = z.opts.Logger
	if z.log == nil {
		z.log = slog.New(slog.DiscardHandler)
	}
	filter, err := jail.SeccompFilter()
	if err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	masked, ro := jail.ProcMasks()
	z.config, err = json.Marshal(map[string]any{"modules": z.opts.Modules, "filter": filter, "masked": masked, "readonly": ro})
	if err != nil {
		return nil, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	inst, err := z.start(ctx)
	if err != nil {
		return nil, err
	}
	z.cur = inst
	return z, nil
}

// Pid returns the host PID of the running template, or 0 if none runs.
func (z *Zygote) Pid() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.cur == nil {
		return 0
	}
	return z.cur.pid
}

// start starts a template; z.mu is held.
func (z *Zygote) start(ctx context.Context) (*instance, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	ws, err := os.MkdirTemp("", "sandloop-zygote-*")
	if err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	ctl, theirs, err := seqpacketPair()
	if err != nil {
		os.RemoveAll(ws)
		return nil, fmt.Errorf("zygote: %w", err)
	}
	defer theirs.Close()
	env := append(append([]string(nil), z.opts.Env...),
		// No thread may exist when the template forks.
		"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "NUMEXPR_NUM_THREADS=1")
	logw := logWriter{z.log}
	p, err := jail.Start(context.WithoutCancel(ctx), &jail.Config{
		Path: jail.DefaultPython, Args: []string{"python3", ZygotePath}, Env: env, Workspace: ws,
		Limits: z.opts.Limits,
		Files: []jail.File{
			{Path: KernelPath, Data: kernel.Source, Mode: 0o444},
			{Path: ZygotePath, Data: Source, Mode: 0o444},
		},
		Stdout: logw, Stderr: logw, ExtraFiles: []*os.File{theirs}, Zygote: true,
	})
	if err != nil {
		ctl.Close()
		os.RemoveAll(ws)
		return nil, fmt.Errorf("zygote: %w", err)
	}
	theirs.Close()
	inst := &instance{proc: p, ws: ws, ctl: ctl, replies: make(chan []byte, 16), dead: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		_, _ = p.Wait()
		os.RemoveAll(ws)
		close(inst.ended)
		z.mu.Lock()
		delete(z.retired, inst)
		z.mu.Unlock()
	}()
	fail := func(err error) (*instance, error) {
		ctl.Close()
		p.Kill()
		<-inst.ended
		return nil, fmt.Errorf("zygote: %w", err)
	}
	dl, _ := ctx.Deadline()
	ctl.SetDeadline(dl)
	if _, err := ctl.Write(z.config); err != nil {
		return fail(err)
	}
	msg, pid, err := readMsg(ctl)
	if err != nil {
		return fail(fmt.Errorf("template did not start: %w", err))
	}
	var ready struct {
		Ready  bool
		Errors []string
	}
	if err := json.Unmarshal(msg, &ready); err != nil {
		return fail(err)
	}
	if !ready.Ready {
		return fail(errors.New(strings.Join(ready.Errors, "; ")))
	}
	ctl.SetDeadline(time.Time{})
	inst.pid = pid
	go inst.read()
	z.wg.Add(1)
	go func() {
		defer z.wg.Done()
		select {
		case <-inst.dead:
			z.died(inst)
		case <-inst.ended:
		}
	}()
	z.log.Info("zygote ready", "pid", pid, "modules", z.opts.Modules)
	return inst, nil
}

// read passes the template's replies on until its control socket ends.
func (inst *instance) read() {
	defer close(inst.dead)
	for {
		msg, _, err := readMsg(inst.ctl)
		if err != nil {
			return
		}
		select {
		case inst.replies <- msg:
		default: // nobody waits for it any more
		}
	}
}

// died retires a template whose control socket ended and starts another
// in the background. The sessions it forked live on.
func (z *Zygote) died(inst *instance) {
	z.mu.Lock()
	if z.cur != inst {
		z.mu.Unlock()
		return
	}
	z.log.Warn("zygote template died; starting another", "pid", inst.pid)
	z.retireLocked(inst)
	if z.closed {
		z.mu.Unlock()
		return
	}
	z.wg.Add(1)
	z.mu.Unlock()
	go func() {
		defer z.wg.Done()
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.closed || z.cur != nil {
			return
		}
		inst, err := z.start(context.Background())
		if err != nil {
			z.log.Error("zygote restart", "err", err) // the next fork tries again
			return
		}
		z.cur = inst
	}()
}

func (z *Zygote) retireLocked(inst *instance) {
	if z.cur == inst {
		z.cur = nil
	}
	inst.ctl.Close()
	select {
	case <-inst.ended:
	default:
		z.retired[inst] = true
	}
}

// Close kills the template and every session it forked.
func (z *Zygote) Close() error {
	z.mu.Lock()
	if z.closed {
		z.mu.Unlock()
		return nil
	}
	z.closed = true
	var all []*instance
	if z.cur != nil {
		all = append(all, z.cur)
		z.cur.ctl.Close()
		z.cur = nil
	}
	for inst := range z.retired {
		all = append(all, inst)
	}
	z.mu.Unlock()
	z.wg.Wait()
	for _, inst := range all {
		inst.proc.Kill()
		<-inst.ended
	}
	return nil
}

// Launcher returns a kernel.Launcher that forks a kernel for a session
// whose workspace, limits and environment (kernel variables on top of the
// jail's base, as a cold session has) are given.
func (z *Zygote) Launcher(workspace string, limits jail.Limits, env []string) kernel.Launcher {
	return func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		return z.Fork(ctx, workspace, limits, env, f)
	}
}

type forkRequest struct {
	ID      int      `json:"id"`
	Env     []string `json:"env"`
	TmpSize int64    `json:"tmp_size"`
	NoFile  int      `json:"nofile"`
	FSize   int64    `json:"fsize"`
	Stack   int64    `json:"stack"`
}

// Fork starts kernel.py for one session from the template.
func (z *Zygote) Fork(ctx context.Context, workspace string, limits jail.Limits, env []string, f kernel.Files) (*Process, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	limits = limits.WithDefaults()
	ws, err := filepath.Abs(workspace)
	if err == nil {
		ws, err = filepath.EvalSymlinks(ws)
	}
	if err != nil {
		return nil, &jail.ArgumentError{Name: "workspace", Err: err}
	}
	if os.Getuid() == 0 {
		// As jail.Start does: the sandbox user maps to jail.HostID.
		if err := chownTree(ws, jail.HostID, jail.HostID); err != nil {
			return nil, fmt.Errorf("prepare workspace: %w", err)
		}
	}
	group, err := jail.NewGroup(limits)
	if err != nil {
		return nil, fmt.Errorf("zygote: session cgroup: %w", err)
	}
	p := &Process{group: group, limits: limits, reaperFD: -1, kernelFD: -1}
	fail := func(err error) (*Process, error) {
		p.Kill()
		_ = group.Remove()
		p.closeFDs()
		return nil, fmt.Errorf("zygote: fork: %w", err)
	}
	req := forkRequest{Env: jail.Environ(env), TmpSize: limits.TmpSize, NoFile: limits.NoFile, FSize: limits.FileSize, Stack: limits.Stack}
	for attempt := 0; ; attempt++ {
		p.rep, err = z.send(ctx, &req, ws, f)
		if errors.Is(err, errDead) && attempt == 0 {
			continue // a fresh template, a fresh report socket
		}
		if err != nil {
			return fail(err)
		}
		break
	}
	dl, _ := ctx.Deadline()
	p.rep.SetDeadline(dl)
	// The child's PID 1 says hello before it does anything: move it into
	// the session's cgroup, then let it build its jail.
	msg, pid, err := readReport(p.rep)
	if err != nil {
		return fail(err)
	}
	if p.reaperFD, err = unix.PidfdOpen(pid, 0); err != nil {
		return fail(fmt.Errorf("pidfd_open %d: %w", pid, err))
	}
	p.reaperPid = pid
	if err := group.Add(pid); err != nil {
		return fail(err)
	}
	if _, err := p.rep.Write([]byte("go")); err != nil {
		return fail(err)
	}
	if msg, pid, err = readReport(p.rep); err != nil {
		return fail(err)
	}
	if !strings.Contains(string(msg), `"kernel"`) {
		return fail(fmt.Errorf("unexpected report %q", msg))
	}
	if p.kernelFD, err = unix.PidfdOpen(pid, 0); err != nil {
		return fail(fmt.Errorf("pidfd_open %d: %w", pid, err))
	}
	p.kernelPid = pid
	p.rep.SetDeadline(time.Time{})
	return p, nil
}

// send hands one fork request to the template, starting one if none runs,
// and returns the host end of the child's report socket.
func (z *Zygote) send(ctx context.Context, req *forkRequest, ws string, f kernel.Files) (*net.UnixConn, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, ws, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("clone the workspace's mount (the zygote needs root): %w", err)
	}
	defer unix.Close(tree)
	rep, theirs, err := seqpacketPair()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	fds := []int{int(f.Requests.Fd()), int(f.Events.Fd()), int(f.Stdout.Fd()), int(f.Stderr.Fd()), tree, int(theirs.Fd())}

	z.mu.Lock()
	defer z.mu.Unlock()
	if z.closed {
		rep.Close()
		return nil, ErrClosed
	}
	if z.cur != nil {
		select {
		case <-z.cur.dead:
			z.retireLocked(z.cur)
		default:
		}
	}
	if z.cur == nil {
		inst, err := z.start(ctx)
		if err != nil {
			rep.Close()
			return nil, err
		}
		z.cur = inst
	}
	inst := z.cur
	z.nextID++
	req.ID = z.nextID
	b, _ := json.Marshal(req)
	if _, _, err := inst.ctl.WriteMsgUnix(b, unix.UnixRights(fds...), nil); err != nil {
		rep.Close()
		z.retireLocked(inst)
		return nil, fmt.Errorf("%w: %v", errDead, err)
	}
	for {
		select {
		case msg := <-inst.replies:
			var r struct {
				ID     int    `json:"id"`
				Forked int    `json:"forked"`
				Error  string `json:"error"`
			}
			if json.Unmarshal(msg, &r) != nil || r.ID != req.ID {
				continue // a reply to an abandoned request
			}
			if r.Error != "" {
				rep.Close()
				return nil, errors.New(r.Error)
			}
			return rep, nil
		case <-inst.dead:
			rep.Close()
			z.retireLocked(inst)
			return nil, errDead
		case <-ctx.Done():
			rep.Close()
			return nil, ctx.Err()
		}
	}
}

// Process is a forked kernel: the session's PID 1 (the reaper) and the
// kernel (PID 2), in the session's cgroup.
type Process struct {
	group     *jail.Group
	limits    jail.Limits
	rep       *net.UnixConn
	reaperPid int
	kernelPid int

	mu       sync.Mutex
	reaperFD int // pidfds: signals cannot reach a recycled PID
	kernelFD int
	closed   bool

	once    sync.Once
	waitErr error
}

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

// Kill kills every process of the session (the reaper is PID 1 of its
// PID namespace: when it dies, the kernel kills the rest).
func (p *Process) Kill() error {
	p.mu.Lock()
	if !p.closed && p.reaperFD >= 0 {
		_ = unix.PidfdSendSignal(p.reaperFD, unix.SIGKILL, nil, 0)
	}
	p.mu.Unlock()
	p.group.Kill()
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
// kernel ended.
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
		_, _, oom := p.group.Stats()
		rmErr := p.group.Remove()
		p.closeFDs()
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

// readReport reads one message from a child, failing on {"error": ...}.
func readReport(c *net.UnixConn) ([]byte, int, error) {
	msg, pid, err := readMsg(c)
	if err != nil {
		return nil, 0, fmt.Errorf("the child ended before it started the kernel: %w", err)
	}
	var r struct{ Error string }
	if json.Unmarshal(msg, &r) == nil && r.Error != "" {
		return nil, 0, fmt.Errorf("build the session's jail: %s", r.Error)
	}
	if pid <= 0 {
		return nil, 0, errors.New("no credentials on the report socket")
	}
	return msg, pid, nil
}

// readMsg reads one message and the sender's host PID (SO_PASSCRED).
func readMsg(c *net.UnixConn) ([]byte, int, error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, 2*unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, 0, io.EOF
	}
	pid := 0
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range msgs {
			if uc, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
				pid = int(uc.Pid)
			}
		}
	}
	return buf[:n], pid, nil
}

// seqpacketPair returns a connected pair: ours (with SO_PASSCRED, so every
// message carries its sender's PID) and theirs, to hand over.
func seqpacketPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	ours := os.NewFile(uintptr(fds[0]), "zygote-host")
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "zygote-child"), nil
}

// chownTree gives the workspace to the sandbox user's host id without
// following symlinks.
func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// logWriter logs what the template says on stdout and stderr.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("zygote output", "text", string(p))
	return len(p), nil
}
