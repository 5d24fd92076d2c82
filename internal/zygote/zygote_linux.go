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
	"slices"
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
	// errDead: the template died while a fork waited for a spare.
	errDead = errors.New("zygote template died")
)

// startTimeout bounds the template's start (imports included) and one fork
// when the caller's context has no deadline.
const startTimeout = 2 * time.Minute

// Zygote is a running template and the sessions' kernels it forks. Its
// methods are safe for concurrent use; concurrent forks each take a spare.
type Zygote struct {
	opts   Options
	log    *slog.Logger
	config []byte // the template's first message
	// shared is, without root, the host directory the template sees at
	// jail.ZygoteWorkspacesDir (the temporary directory, where sessions'
	// workspaces are made): the only workspaces it can fork for. "" as
	// root, where the host clones each workspace's mount for it.
	shared string

	mu      sync.Mutex // the template's control socket and restarts
	cur     *instance  // nil while none runs
	retired map[*instance]bool
	closed  bool
	wg      sync.WaitGroup // background restarts, spares being armed
}

// instance is one template process in its own jail.
type instance struct {
	proc    *jail.Process
	ws      string
	ctl     *net.UnixConn
	pid     int             // host PID of the template
	spares  chan spareOrErr // armed spares, ready for a session
	dead    chan struct{}   // the control socket ended
	ended   chan struct{}   // the jail (and every fork left in it) ended
	retired chan struct{}   // closed by retireLocked

	moreMu  sync.Mutex    // writes of "more" on ctl, and pending
	pending []*time.Timer // "more"s delayed by RefillDelay
}

type spareOrErr struct {
	sp  *spare
	err error
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
	if z.opts.Spares <= 0 {
		z.opts.Spares = 1
	}
	if z.opts.RefillDelay == 0 {
		z.opts.RefillDelay = 200 * time.Millisecond
	}
	z.log = z.opts.Logger
	if z.log == nil {
		z.log = slog.New(slog.DiscardHandler)
	}
	// Where a layer the forks need is missing, fail at once (sessions
	// then start cold) rather than with every fork.
	if err := Supported(); err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	filter, err := jail.SeccompFilter()
	if err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	masked, ro := jail.ProcMasks()
	config := map[string]any{"modules": z.opts.Modules, "filter": filter, "masked": masked, "readonly": ro, "spares": z.opts.Spares}
	if os.Geteuid() != 0 {
		if z.shared, err = filepath.EvalSymlinks(os.TempDir()); err != nil {
			return nil, fmt.Errorf("zygote: the temporary directory: %w", err)
		}
		config["workspaces"] = jail.ZygoteWorkspacesDir
	}
	if z.config, err = json.Marshal(config); err != nil {
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
	ws, err := jail.OwnedTempDir("zygote")
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
		Stdout: logw, Stderr: logw, ExtraFiles: []*os.File{theirs}, Zygote: true, ZygoteWorkspaces: z.shared,
	})
	if err != nil {
		ctl.Close()
		os.RemoveAll(ws)
		return nil, fmt.Errorf("zygote: %w", err)
	}
	theirs.Close()
	inst := &instance{proc: p, ws: ws, ctl: ctl, spares: make(chan spareOrErr, z.opts.Spares),
		dead: make(chan struct{}), ended: make(chan struct{}), retired: make(chan struct{})}
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
	go z.read(inst)
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

// read takes the spares the template sends until its control socket
// ends, and arms each in the background.
func (z *Zygote) read(inst *instance) {
	defer close(inst.dead)
	for {
		msg, _, fds, err := readMsgFDs(inst.ctl)
		if err != nil {
			closeAll(fds)
			return
		}
		var m struct {
			Spare int
			Error string
		}
		_ = json.Unmarshal(msg, &m)
		switch {
		case m.Spare > 0 && len(fds) == 1:
			z.wg.Add(1)
			go func() {
				defer z.wg.Done()
				inst.offer(z.arm(fds[0]))
			}()
		default:
			closeAll(fds)
			if m.Error == "" {
				m.Error = fmt.Sprintf("unexpected message from the template: %q", msg)
			}
			z.log.Warn("zygote spare", "err", m.Error)
			inst.offer(spareOrErr{err: errors.New(m.Error)})
		}
	}
}

// offer hands an armed spare (or why none could be made) to Fork, or
// destroys it if the template was retired meanwhile.
func (inst *instance) offer(r spareOrErr) {
	select {
	case inst.spares <- r:
	case <-inst.retired:
		if r.sp != nil {
			r.sp.destroy()
		}
	}
}

// moreLater asks the template for one more spare after delay (at once if
// delay is negative).
func (inst *instance) moreLater(delay time.Duration) {
	inst.moreMu.Lock()
	defer inst.moreMu.Unlock()
	if delay < 0 {
		inst.moreLocked()
		return
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		inst.moreMu.Lock()
		defer inst.moreMu.Unlock()
		if i := slices.Index(inst.pending, t); i >= 0 {
			inst.pending = slices.Delete(inst.pending, i, i+1)
			inst.moreLocked()
		}
	})
	inst.pending = append(inst.pending, t)
}

// moreNow sends the delayed requests at once (a fork is waiting).
func (inst *instance) moreNow() {
	inst.moreMu.Lock()
	defer inst.moreMu.Unlock()
	for _, t := range inst.pending {
		if t.Stop() {
			inst.moreLocked()
		}
	}
	inst.pending = nil
}

// moreLocked asks for one more spare; inst.moreMu is held.
func (inst *instance) moreLocked() { _, _ = inst.ctl.Write([]byte("more")) }

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
	select {
	case <-inst.retired:
	default:
		close(inst.retired)
		go inst.drain()
	}
	inst.ctl.Close()
	select {
	case <-inst.ended:
	default:
		z.retired[inst] = true
	}
}

// drain destroys the spares of a retired template (the one in arming
// destroy themselves).
func (inst *instance) drain() {
	for {
		select {
		case r := <-inst.spares:
			if r.sp != nil {
				r.sp.destroy()
			}
		default:
			return
		}
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
	if cur := z.cur; cur != nil {
		all = append(all, cur)
		z.retireLocked(cur) // (into z.retired too, unless it has ended)
		delete(z.retired, cur)
	}
	for inst := range z.retired {
		all = append(all, inst)
	}
	z.mu.Unlock()
	for _, inst := range all {
		inst.proc.Kill()
		<-inst.ended
	}
	z.wg.Wait() // restarts, and spares being armed (they end with their template)
	for _, inst := range all {
		inst.drain()
	}
	return nil
}

// Launcher returns a kernel.Launcher that forks a kernel for a session
// whose workspace, limits and environment (kernel variables on top of the
// jail's base, as a cold session has) are given. A nonzero listenPort asks
// for a listener on the session's loopback, as jail.Config.ListenPort.
// Without root it returns nil (the session starts cold) for a workspace
// the template cannot reach: one outside the temporary directory.
func (z *Zygote) Launcher(workspace string, limits jail.Limits, env []string, listenPort int) kernel.Launcher {
	if z.shared != "" {
		if err := z.reachable(workspace); err != nil {
			z.log.Info("zygote: this session starts cold", "reason", err)
			return nil
		}
	}
	return func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		return z.Fork(ctx, workspace, limits, env, listenPort, f)
	}
}

// reachable says why, without root, the template cannot reach
// workspace, or nil: a workspace made in a user namespace (a tmpfs the
// host holds by a descriptor, which a spare clones) or one in z.shared.
func (z *Zygote) reachable(workspace string) error {
	if dir, ok := jail.HolderWorkspace(workspace); ok {
		_, err := z.sharedRel(dir)
		return err
	}
	m, _, ok, err := jail.UserNSWorkspace(workspace)
	if ok {
		m.Close()
		return nil
	}
	if err != nil {
		return err
	}
	_, err = z.sharedPath(workspace)
	return err
}

// sharedPath returns workspace's path relative to z.shared, or why the
// template cannot reach it.
func (z *Zygote) sharedPath(workspace string) (string, error) {
	ws, err := filepath.Abs(workspace)
	if err == nil {
		ws, err = filepath.EvalSymlinks(ws)
	}
	if err != nil {
		return "", err
	}
	return z.sharedRel(ws)
}

// sharedRel returns ws (resolved) relative to z.shared, or why the
// template cannot reach it.
func (z *Zygote) sharedRel(ws string) (string, error) {
	rel, err := filepath.Rel(z.shared, ws)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("without root the zygote forks only for workspaces in %s, not %s", z.shared, ws)
	}
	return rel, nil
}

type forkRequest struct {
	// Workspace, without root, is the workspace's path under the
	// template's view of the temporary directory; WorkspaceSub instead
	// says that the descriptor sent is a tmpfs made in a user namespace
	// (jail.UserNSWorkspace), whose directory WorkspaceSub is the
	// workspace.
	Workspace    string   `json:"workspace,omitempty"`
	WorkspaceSub string   `json:"workspace_sub,omitempty"`
	Env          []string `json:"env"`
	TmpSize      int64    `json:"tmp_size"`
	NoFile       int      `json:"nofile"`
	FSize        int64    `json:"fsize"`
	Stack        int64    `json:"stack"`
	Listen       int      `json:"listen,omitempty"`
}

// spareLimits are the cgroup limits a spare is armed with; a session with
// other limits has them set when it takes the spare.
var spareLimits = jail.Limits{}.WithDefaults()

// spare is a child of the template, armed ahead of any session: its
// reaper (PID 1 of its own PID namespace) and its kernel (PID 2, no
// capabilities, seccomp filter loaded) are in a cgroup of their own.
type spare struct {
	sock      *net.UnixConn
	group     *jail.Group // with spareLimits until a session takes it
	reaperPid int
	kernelPid int
	reaperFD  int // pidfds: signals cannot reach a recycled PID
	kernelFD  int
}

// arm takes a spare the template just forked (its socket), moves its two
// processes into a new cgroup and lets them arm themselves.
func (z *Zygote) arm(fd int) spareOrErr {
	f := os.NewFile(uintptr(fd), "zygote-spare")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return spareOrErr{err: fmt.Errorf("spare socket: %w", err)}
	}
	sp := &spare{sock: c.(*net.UnixConn), reaperFD: -1, kernelFD: -1}
	fail := func(err error) spareOrErr {
		sp.destroy()
		return spareOrErr{err: fmt.Errorf("arm a spare: %w", err)}
	}
	sp.sock.SetDeadline(time.Now().Add(startTimeout))
	for sp.reaperPid == 0 || sp.kernelPid == 0 {
		msg, pid, err := readReport(sp.sock)
		if err != nil {
			return fail(err)
		}
		var m struct{ Hello string }
		_ = json.Unmarshal(msg, &m)
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fail(fmt.Errorf("pidfd_open %d: %w", pid, err))
		}
		switch {
		case m.Hello == "reaper" && sp.reaperPid == 0:
			sp.reaperPid, sp.reaperFD = pid, fd
		case m.Hello == "kernel" && sp.kernelPid == 0:
			sp.kernelPid, sp.kernelFD = pid, fd
		default:
			unix.Close(fd)
			return fail(fmt.Errorf("unexpected report %q", msg))
		}
	}
	if sp.group, err = jail.NewGroup(spareLimits); err != nil {
		return fail(fmt.Errorf("cgroup: %w", err))
	}
	for _, pid := range []int{sp.reaperPid, sp.kernelPid} {
		if err := sp.group.Add(pid); err != nil {
			return fail(err)
		}
	}
	if _, err := sp.sock.Write([]byte("arm")); err != nil {
		return fail(err)
	}
	msg, _, err := readReport(sp.sock)
	if err != nil {
		return fail(err)
	}
	if !strings.Contains(string(msg), `"armed"`) {
		return fail(fmt.Errorf("unexpected report %q", msg))
	}
	sp.sock.SetDeadline(time.Time{})
	return spareOrErr{sp: sp}
}

// alive reports whether the spare's reaper still runs (a pidfd becomes
// readable when its process ends).
func (sp *spare) alive() bool {
	if sp.reaperFD < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(sp.reaperFD), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

// destroy kills the spare's processes and removes its cgroup.
func (sp *spare) destroy() {
	if sp.reaperFD >= 0 {
		_ = unix.PidfdSendSignal(sp.reaperFD, unix.SIGKILL, nil, 0)
	}
	if sp.kernelFD >= 0 {
		_ = unix.PidfdSendSignal(sp.kernelFD, unix.SIGKILL, nil, 0)
	}
	if sp.group != nil {
		_ = sp.group.Remove()
	}
	for _, fd := range []int{sp.reaperFD, sp.kernelFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	sp.reaperFD, sp.kernelFD = -1, -1
	sp.sock.Close()
}

// take returns an armed spare, starting a template if none runs and
// asking the template for another in its place.
func (z *Zygote) take(ctx context.Context) (*spare, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		inst, err := z.current(ctx)
		if err != nil {
			return nil, err
		}
		var r spareOrErr
		select {
		case r = <-inst.spares:
		default:
			inst.moreNow() // none ready: nobody should wait for the delay
			select {
			case r = <-inst.spares:
			case <-inst.dead:
				lastErr = errDead // current retires it and starts another
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		inst.moreLater(z.opts.RefillDelay)
		if r.err != nil {
			lastErr = r.err
			continue
		}
		if !r.sp.alive() {
			r.sp.destroy()
			lastErr = errors.New("the spare child died")
			continue
		}
		return r.sp, nil
	}
	return nil, lastErr
}

// current returns the running template, starting one if none runs (or
// the one running has died).
func (z *Zygote) current(ctx context.Context) (*instance, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.closed {
		return nil, ErrClosed
	}
	if z.cur != nil {
		select {
		case <-z.cur.dead:
			z.retireLocked(z.cur)
		default:
			return z.cur, nil
		}
	}
	inst, err := z.start(ctx)
	if err != nil {
		return nil, err
	}
	z.cur = inst
	return inst, nil
}

// Fork starts kernel.py for one session: it takes an armed spare, gives
// its cgroup the session's limits, hands it the workspace and the
// kernel's descriptors, and waits until the reaper has dropped its
// capabilities and the kernel is about to run.
func (z *Zygote) Fork(ctx context.Context, workspace string, limits jail.Limits, env []string, listenPort int, f kernel.Files) (*Process, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	limits = limits.WithDefaults()
	if listenPort < 0 || listenPort > 65535 {
		return nil, &jail.ArgumentError{Name: "listen port", Err: fmt.Errorf("%d: must be 1-65535", listenPort)}
	}
	if workspace == "" {
		// Never the current directory: the session would own it.
		return nil, &jail.ArgumentError{Name: "workspace", Err: errors.New("empty")}
	}
	fr := forkRequest{Env: jail.Environ(env), TmpSize: limits.TmpSize, NoFile: limits.NoFile, FSize: limits.FileSize, Stack: limits.Stack, Listen: listenPort}
	if dir, ok := jail.HolderWorkspace(workspace); ok && z.shared != "" {
		var err error
		// Mounted by the holder, which started the template: the spare
		// clones it from its view of z.shared (where the mount
		// propagated) and compares it with this directory.
		if fr.Workspace, err = z.sharedRel(dir); err != nil {
			return nil, &jail.ArgumentError{Name: "workspace", Err: err}
		}
		tree, err := unix.Open(workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &jail.ArgumentError{Name: "workspace", Err: err}
		}
		defer unix.Close(tree)
		return z.fork(ctx, limits, fr, f, tree)
	}
	mount, sub, inUserNS, err := jail.UserNSWorkspace(workspace)
	if err != nil {
		return nil, &jail.ArgumentError{Name: "workspace", Err: err}
	}
	if inUserNS {
		// The spare clones the workspace's directory from the mount.
		defer mount.Close()
		fr.WorkspaceSub = sub
		return z.fork(ctx, limits, fr, f, int(mount.Fd()))
	}
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
	// The workspace's mount, cloned (as root), or (without root) the
	// directory, which the spare clones from its view of z.shared and
	// compares with this one.
	var tree int
	if z.shared == "" {
		tree, err = unix.OpenTree(unix.AT_FDCWD, ws, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("clone the workspace's mount: %w", err)
		}
	} else {
		if fr.Workspace, err = z.sharedPath(ws); err != nil {
			return nil, &jail.ArgumentError{Name: "workspace", Err: err}
		}
		if tree, err = unix.Open(ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return nil, &jail.ArgumentError{Name: "workspace", Err: err}
		}
	}
	defer unix.Close(tree)
	return z.fork(ctx, limits, fr, f, tree)
}

// fork hands a spare the session: fr, the kernel's descriptors and tree,
// the workspace's mount or directory (see forkRequest).
func (z *Zygote) fork(ctx context.Context, limits jail.Limits, fr forkRequest, f kernel.Files, tree int) (*Process, error) {
	listenPort := fr.Listen
	req, _ := json.Marshal(fr)
	fds := []int{int(f.Requests.Fd()), int(f.Events.Fd()), int(f.Stdout.Fd()), int(f.Stderr.Fd()), tree}
	for attempt := 0; ; attempt++ {
		sp, err := z.take(ctx)
		if err != nil {
			return nil, fmt.Errorf("zygote: %w", err)
		}
		ln, answered, err := sp.start(ctx, limits, req, fds, listenPort != 0)
		if err == nil {
			return &Process{group: sp.group, limits: limits, rep: sp.sock, reaperPid: sp.reaperPid, kernelPid: sp.kernelPid,
				reaperFD: sp.reaperFD, kernelFD: sp.kernelFD, listener: ln}, nil
		}
		sp.destroy()
		// A spare that died while it waited never answers: the
		// descriptors it was sent died with it; take another.
		if answered || attempt == 2 || ctx.Err() != nil {
			return nil, fmt.Errorf("zygote: fork: %w", err)
		}
		z.log.Warn("zygote: a spare died before its session started; taking another", "err", err)
	}
}

// start gives the spare's cgroup the session's limits, hands the spare the
// session (req and fds) and waits until its reaper has locked itself down
// and its kernel is about to run. answered says whether the spare said
// anything before it failed. With listen, the reaper's "locked" report
// carries a listener on the session's loopback (as jail.Config.ListenPort).
func (sp *spare) start(ctx context.Context, limits jail.Limits, req []byte, fds []int, listen bool) (ln net.Listener, answered bool, err error) {
	if limits.Memory != spareLimits.Memory || limits.Pids != spareLimits.Pids || limits.CPUs != spareLimits.CPUs {
		if err := sp.group.SetLimits(limits); err != nil {
			return nil, true, fmt.Errorf("session cgroup: %w", err)
		}
	}
	if _, _, err := sp.sock.WriteMsgUnix(req, unix.UnixRights(fds...), nil); err != nil {
		return nil, false, err
	}
	dl, _ := ctx.Deadline()
	sp.sock.SetDeadline(dl)
	fail := func(err error) (net.Listener, bool, error) {
		if ln != nil {
			ln.Close()
		}
		return nil, true, err
	}
	for locked, started := false, false; !locked || !started; answered = true {
		msg, _, got, err := readReportFDs(sp.sock)
		if err != nil {
			if ln != nil {
				ln.Close()
			}
			return nil, answered || ctx.Err() != nil, err
		}
		switch {
		case strings.Contains(string(msg), `"locked"`):
			locked = true
			if listen {
				if len(got) != 1 {
					closeAll(got)
					return fail(errors.New("the reaper sent no listener"))
				}
				if ln, err = jail.FileListener(got[0]); err != nil {
					return fail(err)
				}
				got = nil
			}
			closeAll(got)
		case strings.Contains(string(msg), `"kernel"`):
			closeAll(got)
			started = true
		default:
			closeAll(got)
			return fail(fmt.Errorf("unexpected report %q", msg))
		}
	}
	sp.sock.SetDeadline(time.Time{})
	return ln, true, nil
}

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

// readReport reads one message from a child, failing on {"error": ...}.
func readReport(c *net.UnixConn) ([]byte, int, error) {
	msg, pid, fds, err := readReportFDs(c)
	closeAll(fds)
	return msg, pid, err
}

// readReportFDs is readReport, keeping the descriptors that came with the
// message (the caller closes them).
func readReportFDs(c *net.UnixConn) ([]byte, int, []int, error) {
	msg, pid, fds, err := readMsgFDs(c)
	fail := func(err error) ([]byte, int, []int, error) {
		closeAll(fds)
		return nil, 0, nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("the child ended before it started the kernel: %w", err))
	}
	var r struct{ Error string }
	if json.Unmarshal(msg, &r) == nil && r.Error != "" {
		return fail(fmt.Errorf("build the session's jail: %s", r.Error))
	}
	if pid <= 0 {
		return fail(errors.New("no credentials on the report socket"))
	}
	return msg, pid, fds, nil
}

// readMsg reads one message and the sender's host PID (SO_PASSCRED),
// closing any descriptor that came with it.
func readMsg(c *net.UnixConn) ([]byte, int, error) {
	msg, pid, fds, err := readMsgFDs(c)
	closeAll(fds)
	return msg, pid, err
}

// readMsgFDs reads one message, the sender's host PID (SO_PASSCRED) and the
// descriptors it carries (close-on-exec).
func readMsgFDs(c *net.UnixConn) (msg []byte, pid int, fds []int, err error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, 0, nil, err
	}
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for i := range msgs {
			if uc, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
				pid = int(uc.Pid)
			} else if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	if n == 0 {
		err = io.EOF
	}
	return buf[:n], pid, fds, err
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
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
