package jail

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process is a running jail.
type Process struct {
	proc hostProcess
	pid  int
	// pidfd holds the init when a keeper started it (Config.Spawn): the
	// handoff passes it on. nil otherwise.
	pidfd *os.File
	// cgName is the name of the jail's cgroup (the same in every
	// hierarchy), "" if none.
	cgName string
	// With a pidfd: a pipe whose write end Detach closes, ending a wait
	// without ending the jail.
	cancelR, cancelW *os.File
	detached         atomic.Bool
	// waitProc waits for proc (and for the copying of its output), as
	// exec.Cmd.Wait.
	waitProc func() (*os.ProcessState, error)
	cg       *cgroup
	start    time.Time
	status   *bufio.Reader
	statusF  *os.File
	warn     []string
	// listener: Config.ListenPort's, closed when the jail has ended.
	listener net.Listener
	enforce  string
	// network and netns (the inode of the init's network namespace, 0 if
	// unknown) let DialLoopback check it enters this jail's namespace.
	network Network
	netns   uint64
	// stdin is our end of the pipe Config.Stdin is copied into (nil if
	// none): closed when the jail has ended, so the end is never held up
	// by a caller's reader that has nothing more to say.
	stdin *os.File
	// tty is the host's end of Config.Terminal's pseudo-terminal (nil if
	// none); ttyDone is closed when its output has been copied.
	tty     *os.File
	ttyDone chan struct{}
	// joinPid is the host PID of a joined program (Config.Join), which
	// leads a process group of its own; 0 for a jail of its own. It is
	// signalled through joinChild, never by this number: the program is
	// reaped by the join's host-side process, not by us, and its number
	// may be another's from then on.
	joinPid   int
	joinChild *pinned
	// joinGroup: the joined jail has a cgroup, which freezes the program
	// with the jail (Freeze and Thaw leave it to that).
	joinGroup bool
	// limits are the jail's (a JoinTarget's).
	limits Limits

	mu       sync.Mutex
	timedOut bool
	done     chan struct{}
	timer    *time.Timer
	result   *Result
	waitErr  error
	waitOnce sync.Once
}

// Start starts cfg in a new jail. The returned Process must be waited for.
func Start(ctx context.Context, cfg *Config) (*Process, error) {
	if cfg.Path == "" {
		return nil, &ArgumentError{"path", errors.New("empty")}
	}
	limits := cfg.Limits.WithDefaults()
	if err := limits.validate(); err != nil {
		return nil, err
	}
	for _, f := range cfg.Files {
		if err := validFilePath(f.Path); err != nil {
			return nil, &ArgumentError{"file path", err}
		}
	}
	if err := validMounts(cfg); err != nil {
		return nil, &ArgumentError{"mount", err}
	}
	switch cfg.Network {
	case "", NetworkNone, NetworkHost:
	default:
		return nil, &ArgumentError{"network", fmt.Errorf("%q is not none or host", cfg.Network)}
	}
	if cfg.ListenPort != 0 && (cfg.Network == NetworkHost || cfg.ListenPort < 1 || cfg.ListenPort > 65535) {
		return nil, &ArgumentError{"listen port", fmt.Errorf("%d: must be 1-65535, and only with a network of the jail's own", cfg.ListenPort)}
	}
	if cfg.Terminal != nil {
		if err := cfg.Terminal.validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Join != nil {
		return startJoined(ctx, cfg, limits.Timeout)
	}
	if cfg.Workspace == "" {
		// Never the current directory: the jail would own it.
		return nil, &ArgumentError{"workspace", errors.New("empty")}
	}
	zygoteWS := ""
	if cfg.ZygoteWorkspaces != "" {
		var err error
		if !cfg.Zygote {
			return nil, &ArgumentError{"zygote workspaces", errors.New("only for a zygote")}
		}
		if zygoteWS, err = filepath.EvalSymlinks(cfg.ZygoteWorkspaces); err != nil {
			return nil, &ArgumentError{"zygote workspaces", err}
		}
		if zygoteWS, err = filepath.Abs(zygoteWS); err != nil {
			return nil, &ArgumentError{"zygote workspaces", err}
		}
	}
	// A workspace made in a user namespace is reached through a
	// descriptor, never by resolving its path (which names the
	// descriptor, not a host directory).
	if dir, ok := holderWorkspace(cfg.Workspace); ok {
		// The holder starts the jail, in a copy of its mount namespace,
		// where the workspace is a mount the init binds by path.
		devNull, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		return start(ctx, cfg, limits, workspaceMount{path: dir, fd: devNull, holder: true, zygote: zygoteWS})
	}
	wsMount, wsSub, inUserNS, err := usernsWorkspace(cfg.Workspace)
	if err != nil {
		return nil, &ArgumentError{"workspace", err}
	}
	// A zygote template whose sessions' workspaces the holder mounts: the
	// holder starts it too, so that it sees them (each mounted later
	// propagates into its view of the temporary directory).
	byHolder := zygoteWS != "" && !inUserNS && hostQuotaUnsupported() != "" && rootlessQuota() == quotaHeld
	if inUserNS {
		return start(ctx, cfg, limits, workspaceMount{path: cfg.Workspace, fd: wsMount, sub: wsSub, zygote: zygoteWS})
	}
	wsPath, err := filepath.Abs(cfg.Workspace)
	if err == nil {
		wsPath, err = filepath.EvalSymlinks(wsPath)
	}
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(wsPath); err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	}
	if err != nil {
		return nil, &ArgumentError{"workspace", err}
	}
	// As root, hand the jail a detached clone of the workspace's mount: the
	// jail's user may not traverse the path's parents. Without root the
	// jail's user is the caller, who can.
	ws, wsTree := openWorkspaceTree(wsPath)
	return start(ctx, cfg, limits, workspaceMount{path: wsPath, fd: ws, tree: wsTree, zygote: zygoteWS, holder: byHolder})
}

// workspaceMount is how a jail gets its workspace.
type workspaceMount struct {
	path string   // the host path (resolved)
	fd   *os.File // a clone of its mount (tree), a tmpfs made in a user namespace (sub), or /dev/null (bind path)
	tree bool
	sub  string // the workspace's directory in that tmpfs
	// holder: path is in the holder's mount namespace, whose copy the
	// jail must get (quota_holder_linux.go).
	holder bool
	// zygote: Config.ZygoteWorkspaces, resolved.
	zygote string
}

// start starts the jail of cfg (checked) with the workspace ws. It
// closes ws.fd.
func start(ctx context.Context, cfg *Config, limits Limits, ws workspaceMount) (*Process, error) {
	defer ws.fd.Close()
	wsPath := ws.path

	p := &Process{done: make(chan struct{}), limits: limits}
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = HostID, HostID
		if err := chownTree(wsPath, uid, gid); err != nil {
			return nil, fmt.Errorf("prepare workspace: %w", err)
		}
	}

	h := detectCgroups()
	initCfg := initConfig{
		Path: cfg.Path, Args: cfg.Args, Env: buildEnv(cfg.Env), Dir: cfg.Dir,
		Limits: limits, Network: cfg.Network, Files: cfg.Files, ExtraFiles: len(cfg.ExtraFiles),
		Workspace: wsPath, WorkspaceTree: ws.tree, WorkspaceSub: ws.sub, Zygote: cfg.Zygote, ZygoteWorkspaces: ws.zygote, ListenPort: cfg.ListenPort,
		ReceiveMounts: ws.holder && ws.zygote != "", Terminal: cfg.Terminal != nil,
	}
	// Pids counts the program's processes and threads: the init (the same
	// user, in the same group) gets room for its own threads on top. A
	// zygote template's forks get their own groups and limits.
	if !cfg.Zygote {
		initCfg.ProgramPids = limits.Pids
		initCfg.Limits.Pids += initThreads
	}
	if h.mode != "" {
		p.enforce = h.mode
		initCfg.NewCgroupNS = true
	} else {
		p.enforce = "rlimits"
		// One short line: `sandloop doctor` says why and how to fix it.
		p.warn = append(p.warn, RlimitsWarning)
		initCfg.RlimitMemory, initCfg.RlimitPids = true, true
	}
	fail := func(err error) (*Process, error) {
		p.closeStdin()
		if p.tty != nil {
			p.tty.Close()
		}
		if p.cg != nil {
			_ = p.cg.remove()
		}
		return nil, err
	}

	var stdin, ttySlave *os.File
	var err error
	if cfg.Terminal != nil {
		if p.tty, ttySlave, err = openTerminal(*cfg.Terminal); err != nil {
			return fail(err)
		}
		defer ttySlave.Close() // the jail's copies keep it open
		p.ttyDone = make(chan struct{})
	} else {
		if stdin, err = p.stdinPipe(cfg.Stdin); err != nil {
			return fail(err)
		}
		if p.stdin != nil {
			defer stdin.Close() // our copy of the child's end
		}
	}

	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer cfgR.Close()
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer stW.Close()
	extra := cfg.ExtraFiles
	var handOff *net.UnixConn
	if cfg.ListenPort != 0 {
		ours, theirs, err := handOffPair()
		if err != nil {
			return fail(err)
		}
		defer theirs.Close()
		handOff = ours
		defer handOff.Close()
		extra = append(append([]*os.File(nil), extra...), theirs)
	}
	// The mounts' clones follow the extra files (and the listener's
	// hand-off socket); the init attaches and closes them.
	mountFiles, err := openMounts(cfg.Mounts, initFirstExtra+len(extra), &initCfg)
	if err != nil {
		return fail(err)
	}
	defer func() {
		for _, f := range mountFiles {
			f.Close()
		}
	}()
	extra = append(append([]*os.File(nil), extra...), mountFiles...)

	flags := unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS
	if cfg.Network != NetworkHost {
		flags |= unix.CLONE_NEWNET
	}
	initCmd := func(path string) *exec.Cmd {
		c := &exec.Cmd{
			Path: path,
			Args: []string{initArg0},
			Env:  []string{}, // never the server's environment
			// Readers and writers that are not pipes go through pipes, so the
			// jail is never handed a terminal (TIOCSTI) or a server file.
			Stdin:      readerOrNil(stdin),
			Stdout:     wrapWriter(cfg.Stdout),
			Stderr:     wrapWriter(cfg.Stderr),
			ExtraFiles: append([]*os.File{cfgR, stW, ws.fd}, extra...),
			SysProcAttr: &syscall.SysProcAttr{
				Cloneflags:                 uintptr(flags),
				UidMappings:                []syscall.SysProcIDMap{{ContainerID: SandboxUID, HostID: uid, Size: 1}},
				GidMappings:                []syscall.SysProcIDMap{{ContainerID: SandboxGID, HostID: gid, Size: 1}},
				GidMappingsEnableSetgroups: false,
				Credential:                 &syscall.Credential{Uid: SandboxUID, Gid: SandboxGID, NoSetGroups: true},
				// The init needs these in its own namespaces to build the
				// mount tree; it drops all of them before the program starts.
				AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP, unix.CAP_DAC_OVERRIDE},
				Pdeathsig:   syscall.SIGKILL,
				Setsid:      true,
			},
			WaitDelay: 2 * time.Second,
		}
		if ttySlave != nil {
			// The terminal is the host's own new pair (see Config.Terminal).
			c.Stdin, c.Stdout, c.Stderr = ttySlave, ttySlave, ttySlave
		}
		return c
	}
	if cfg.Spawn != nil && !ws.holder {
		err = spawnInit(p, cfg.Spawn, initCmd)
	} else if ws.holder {
		var h *quotaHolder
		if h, err = theHolder(); err == nil {
			var op *os.Process
			if op, p.waitProc, err = h.spawn(initCmd(initPath())); err == nil {
				p.proc = osProcess{op}
			}
		}
	} else {
		var cmd *exec.Cmd
		if cmd, err = startInit(initCmd); err == nil {
			p.proc = osProcess{cmd.Process}
			p.waitProc = func() (*os.ProcessState, error) {
				err := cmd.Wait()
				return cmd.ProcessState, err
			}
		}
	}
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			// Typically a container's seccomp or AppArmor profile, or a
			// sysctl forbidding user namespaces.
			return fail(fmt.Errorf("start jail: new namespaces refused (%w): `sandloop doctor` says why and how to fix it", err))
		}
		return fail(fmt.Errorf("start jail: %w", err))
	}
	p.pid = p.proc.pid()
	p.start = time.Now()
	// The init is waiting for its configuration: certainly alive, and in
	// the jail's network namespace from its birth (DialLoopback checks it).
	p.network = cfg.Network
	p.netns, _ = netnsInode(p.pid)
	if p.tty != nil {
		ttySlave.Close()
		p.serveTerminal(cfg.Stdin, cfg.Stdout)
	}
	cfgR.Close()
	stW.Close()
	p.statusF = stR
	p.status = bufio.NewReader(io.LimitReader(stR, 1<<20))
	// lost: the init had ended before abort killed it (see initLost).
	lost := false
	abort := func(err error) (*Process, error) {
		_ = p.proc.Kill()
		ps, _ := p.waitProc()
		if lost {
			err = fmt.Errorf("%w (the jail's init had ended: %s)", err, initEnd(ps))
		}
		stR.Close()
		if p.pidfd != nil {
			p.pidfd.Close()
			p.cancelR.Close()
			p.cancelW.Close()
		}
		return fail(err)
	}
	// The group is made while the init starts up (it waits for its
	// configuration, so nothing runs outside the group).
	if h.mode != "" {
		cg, err := newCgroup(h, "sandloop-"+rand.Text(), initCfg.Limits)
		if err != nil {
			return abort(err)
		}
		p.cg, p.cgName = cg, filepath.Base(cg.dirs[0])
		if err := cg.add(p.pid); err != nil {
			return abort(err)
		}
	}
	// initLost aborts after err from a pipe whose init's end closed
	// before its time (EPIPE, EOF), saying how the init ended: killed by
	// a signal (whose?), an exit status (its runtime failed: why is on
	// the program's stderr), or not yet (it closed the pipe itself, or it
	// was still ending).
	initLost := func(err error) (*Process, error) {
		if lost = p.proc.ended(); !lost {
			err = fmt.Errorf("%w (the jail's init had not ended yet)", err)
		}
		return abort(err)
	}
	if initStarted != nil {
		initStarted(cfg, p.pid)
	}
	if err := sendConfig(cfgW, &initCfg); err != nil {
		return initLost(fmt.Errorf("configure jail: %w", err))
	}
	cfgW.Close()
	var st initStatus
	if err := readStatus(p.status, &st); err != nil {
		return initLost(fmt.Errorf("jail did not start: %w", err))
	}
	if st.Error != "" {
		return abort(fmt.Errorf("set up jail: %s", st.Error))
	}
	if handOff != nil {
		// The init sent it before it reported the program's start.
		if p.listener, err = receiveListener(handOff); err != nil {
			return abort(fmt.Errorf("the jail's listener: %w", err))
		}
	}
	p.killAt(ctx, limits.Timeout)
	return p, nil
}

// initStarted, when set (tests only), is called with the init's PID
// before its configuration is sent.
var initStarted func(cfg *Config, pid int)

// initEnd says how an init that was waited for ended (ps nil: unknown
// here, as of a keeper's child, which the keeper reaps).
func initEnd(ps *os.ProcessState) string {
	if ps == nil {
		return "its exit status is not known here"
	}
	return ps.String()
}

// killAt kills the process when timeout (if > 0) has passed, marking it
// timed out, or when ctx ends, whichever comes first while it runs.
func (p *Process) killAt(ctx context.Context, timeout time.Duration) {
	if timeout > 0 {
		p.timer = time.AfterFunc(timeout, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			p.Kill()
		})
	}
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				p.Kill()
			case <-p.done:
			}
		}()
	}
}

func readStatus(r *bufio.Reader, st *initStatus) error {
	return readReport(r, st, "the jail's init exited without a report")
}

// readReport reads one JSON line into st; eof says what an end before
// it means.
func readReport[T any](r *bufio.Reader, st *T, eof string) error {
	line, err := r.ReadBytes('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New(eof)
		}
		return err
	}
	return json.Unmarshal(line, st)
}

// Listener is the listener on the jail's loopback that Config.ListenPort
// asked for (nil if none). Its connections come from inside the jail. It is
// closed when the jail has ended.
func (p *Process) Listener() net.Listener { return p.listener }

// Pid is the host PID of the jail's init (PID 1 inside).
func (p *Process) Pid() int { return p.pid }

// Usage is what the jail uses now (ErrNoGroup where no cgroup measures it:
// limits are rlimits there).
func (p *Process) Usage() (LiveUsage, error) {
	if p.cg == nil {
		return LiveUsage{}, ErrNoGroup
	}
	return p.cg.live(), nil
}

// Signal delivers sig to the jailed program (the init forwards it).
func (p *Process) Signal(sig os.Signal) error {
	if p.joinPid != 0 {
		s, ok := sig.(syscall.Signal)
		if !ok {
			return fmt.Errorf("unsupported signal %v", sig)
		}
		select {
		case <-p.done:
			return os.ErrProcessDone
		default:
		}
		return p.joinChild.signal(s)
	}
	return p.proc.Signal(sig)
}

// Kill kills every process of the jail. It is safe to call at any time.
// Of a joined program (Config.Join) it kills the program's session (its
// process group, and the groups of the jobs of an interactive shell):
// what it started and did not detach (setsid) into a session of its own.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	if p.joinPid != 0 {
		killSession(p.joinChild)
		return
	}
	_ = p.proc.Signal(syscall.SIGKILL) // PID 1 gone: the kernel kills the namespace
	if p.cg != nil {
		p.cg.kill()
	}
}

// Done is closed when the jail has ended and its resources are released.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the program to end, kills anything left in the jail,
// removes its cgroup and reports what happened. It may be called more than
// once and from several goroutines.
func (p *Process) Wait() (*Result, error) {
	p.waitOnce.Do(func() {
		p.result, p.waitErr = p.wait()
		close(p.done)
	})
	return p.result, p.waitErr
}

func (p *Process) wait() (*Result, error) {
	ps, waitErr := p.waitProc()
	if p.detached.Load() {
		return p.detach()
	}
	end := time.Now()
	p.closeStdin()
	p.closeTerminal()
	if p.timer != nil {
		p.timer.Stop()
	}
	r := &Result{Duration: end.Sub(p.start), Enforcement: p.enforce, Warnings: p.warn}
	if p.joinPid != 0 {
		p.waitJoined(r)
		p.statusF.Close()
		p.mu.Lock()
		r.TimedOut = p.timedOut
		p.mu.Unlock()
		return r, nil
	}
	var st initStatus
	statusErr := readStatus(p.status, &st)
	p.statusF.Close()
	if p.pidfd != nil {
		p.pidfd.Close()
		p.cancelR.Close()
		p.cancelW.Close()
	}
	if p.listener != nil {
		p.listener.Close()
	}

	p.mu.Lock()
	r.TimedOut = p.timedOut
	p.mu.Unlock()
	if ps != nil {
		r.CPUTime = ps.UserTime() + ps.SystemTime()
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			r.MemoryPeak = ru.Maxrss * 1024
		}
	}
	switch {
	case statusErr == nil && st.Exited:
		r.ExitCode = st.ExitCode
		if st.Signal != 0 {
			r.ExitCode = 128 + st.Signal
			r.Signal = unix.SignalName(syscall.Signal(st.Signal))
		}
	default:
		// The init itself was killed (timeout, Kill, context, OOM).
		r.ExitCode = 137
		r.Signal = "SIGKILL"
		var ee *exec.ExitError
		if waitErr != nil && !errors.As(waitErr, &ee) && !errors.Is(waitErr, exec.ErrWaitDelay) {
			return nil, fmt.Errorf("wait for jail: %w", waitErr)
		}
	}
	if p.cg != nil {
		cpu, peak, oom := p.cg.stats()
		if cpu > 0 {
			r.CPUTime = cpu
		}
		if peak > 0 {
			r.MemoryPeak = peak
		}
		r.OOMKilled = oom
		if err := p.cg.remove(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Run starts cfg in a jail and waits for it.
func Run(ctx context.Context, cfg *Config) (*Result, error) {
	p, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return p.Wait()
}

// baseEnv is the start of every jail's environment.
var baseEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin:" + ToolsDir,
	"HOME=" + WorkspaceDir,
	"USER=" + SandboxUser,
	"LOGNAME=" + SandboxUser,
	"LANG=C.UTF-8",
	"TMPDIR=/tmp",
}

// buildEnv returns the base environment overridden by env (later wins).
func buildEnv(env []string) []string {
	out := make([]string, 0, len(baseEnv)+len(env))
	idx := map[string]int{}
	for _, kv := range append(append([]string{}, baseEnv...), env...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// chownTree gives the workspace to the sandbox user's host id without
// following symlinks.
func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// What the sandbox user owns already is left alone: on an overlay
		// workspace (a fork's child) a chown would copy a shared lower
		// file up into the child's own layer.
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
				return nil
			}
		}
		return os.Lchown(path, uid, gid)
	})
}

func openWorkspaceTree(path string) (*os.File, bool) {
	if fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err == nil {
		return os.NewFile(uintptr(fd), "workspace"), true
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		panic(err) // no /dev/null: nothing can work
	}
	return f, false
}

type writerOnly struct{ io.Writer }

// stdinPipe returns the file to hand the jail as its stdin for r (nil for
// none). A pipe is handed on as it is (it cannot be a terminal). Anything
// else (a terminal, a regular file, an io.Reader) is copied into a pipe of
// ours by a goroutine the jail's end does not wait for: exec.Cmd's own
// copier would make Wait wait until r has no more to say, so a program
// that exited while its caller held stdin open (E2B's `stdin: true`)
// would never be reported as ended. The copier returns once r's Read
// does, after the jail's end at the latest when the caller closes r.
func (p *Process) stdinPipe(r io.Reader) (*os.File, error) {
	if r == nil {
		return nil, nil
	}
	if f, ok := r.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeNamedPipe != 0 {
			return f, nil
		}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p.stdin = pw
	go func() {
		_, _ = io.Copy(pw, r)
		pw.Close() // EOF for the program (a second Close is harmless)
	}()
	return pr, nil
}

// closeStdin closes our end of the stdin pipe, if any.
func (p *Process) closeStdin() {
	if p.stdin != nil {
		p.stdin.Close()
	}
}

func readerOrNil(f *os.File) io.Reader {
	if f == nil {
		return nil
	}
	return f
}

func wrapWriter(w io.Writer) io.Writer {
	if w == nil {
		return nil
	}
	return writerOnly{w}
}

// startInit starts the command that cmd makes for the init program: the
// cached small init, or this binary where that cannot be executed.
// spawnInit starts the init by spawn (the keeper) as startInit does
// here: if the keeper cannot execute the cached small init (its directory
// mounted noexec, removed, or not reachable by the sandbox user), it
// executes its own binary (the keeper is this program, started by a
// server of the same directory), and from then on this process's jails
// do so too.
func spawnInit(p *Process, spawn SpawnFunc, cmd func(path string) *exec.Cmd) error {
	path := initPath()
	err := p.spawnBy(spawn, cmd(path))
	if err == nil || path == selfExe || !(errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
		return err
	}
	giveUpSmallInit(err)
	if err2 := p.spawnBy(spawn, cmd(selfExe)); err2 != nil {
		return fmt.Errorf("the keeper could not execute the jail's init %s (%w; is its directory mounted noexec?), nor its own binary: %w", path, err, err2)
	}
	return nil
}

func startInit(cmd func(path string) *exec.Cmd) (*exec.Cmd, error) {
	c := cmd(initPath())
	err := c.Start()
	if err != nil && c.Path != selfExe && (errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
		// The cached small init cannot be executed here: this binary can.
		giveUpSmallInit(err)
		c = cmd(selfExe)
		err = c.Start()
	}
	return c, err
}
