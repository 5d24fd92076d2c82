package zygote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"golang.org/x/sys/unix"
)

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
		if inst.fill != nil {
			r, err = inst.takeFair(ctx)
		} else {
			r, err = inst.takeFixed(ctx, z.opts.RefillDelay)
		}
		if errors.Is(err, errDead) {
			lastErr = err // current retires it and starts another
			continue
		}
		if err != nil {
			return nil, err
		}
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

// takeFixed is take's wait with Options.Fixed: the pipeline before
// issue 26 (one "more" per take, RefillDelay later unless a fork finds no
// spare when it arrives).
func (inst *instance) takeFixed(ctx context.Context, delay time.Duration) (spareOrErr, error) {
	var r spareOrErr
	select {
	case r = <-inst.spares:
	default:
		inst.moreNow() // none ready: nobody should wait for the delay
		select {
		case r = <-inst.spares:
		case <-inst.dead:
			return r, errDead
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	inst.moreLater(delay)
	return r, nil
}

// takeFair is take's wait: a fork that finds no spare waits in line (a
// channel's receivers are served in the order they came) while the
// template is asked at once for what is missing.
func (inst *instance) takeFair(ctx context.Context) (spareOrErr, error) {
	var r spareOrErr
	select {
	case r = <-inst.spares:
	default:
		inst.fill.wait()
		defer inst.fill.unwait()
		select {
		case r = <-inst.spares:
		case <-inst.dead:
			return r, errDead
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}
	inst.fill.took()
	return r, nil
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
	state := f.State
	if state == nil { // no state channel: kernel.py sees /dev/null as fd 7 and does without
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, fmt.Errorf("zygote: %w", err)
		}
		defer null.Close()
		state = null
	}
	fds := []int{int(f.Requests.Fd()), int(f.Events.Fd()), int(f.Stdout.Fd()), int(f.Stderr.Fd()), int(state.Fd()), tree}
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
