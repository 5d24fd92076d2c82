package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"golang.org/x/sys/unix"
)

// KernelPath is where kernel.py is placed inside the jail (read-only).
const KernelPath = "/opt/sandloop/kernel.py"

// kernelEnv is the environment every kernel gets on top of the jail's.
var kernelEnv = []string{
	// Figures render with Agg; the kernel's backend module makes show()
	// and figures left open come back as PNG results.
	"MPLBACKEND=module://sandloop_backend",
	// matplotlib and fontconfig caches go to the jail's tmpfs: the root
	// is read-only and the workspace is the user's.
	"MPLCONFIGDIR=/tmp/.sandloop/matplotlib",
	"XDG_CACHE_HOME=/tmp/.sandloop/cache",
	"PYTHONDONTWRITEBYTECODE=1",
}

// KernelEnv returns the environment every kernel gets on top of the
// jail's (a zygote template should import under it too).
func KernelEnv() []string { return append([]string(nil), kernelEnv...) }

// Zygote forks kernels from a template that has already imported the heavy
// modules (package zygote).
type Zygote interface {
	// Launcher starts a kernel for a session with this workspace, limits
	// and environment (on top of the jail's minimal one).
	// listenPort, if nonzero, asks for a listener on the kernel's
	// loopback (as jail.Config.ListenPort), which the process returns
	// from a Listener() net.Listener method. A nil launcher means it
	// cannot fork for this workspace: the session starts cold.
	Launcher(workspace string, limits jail.Limits, env []string, listenPort int) kernel.Launcher
}

// kernelEnviron is the kernel's environment: kernelEnv, then the
// session's variables in key order.
func (s *Session) kernelEnviron() []string {
	env := append([]string(nil), kernelEnv...)
	if s.opts.Template != nil {
		env = append(env, s.opts.Template.Env...)
	}
	if s.gate != nil {
		env = append(env, egress.Env(egress.Port)...)
		env = append(env, s.gate.PipEnv(egress.Port)...)
	}
	keys := make([]string, 0, len(s.opts.Env))
	for k := range s.opts.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+s.opts.Env[k])
	}
	return env
}

// zygoteLauncher forks kernels from s.opts.Zygote with the session's limits.
func (s *Session) zygoteLauncher() kernel.Launcher {
	limits := s.opts.Limits
	limits.Timeout = 0
	z := s.opts.Zygote
	if s.opts.Template != nil {
		z = s.opts.Template.Zygote // the template's own (nil: cold)
	}
	if z == nil {
		return nil
	}
	return z.Launcher(s.workspace, limits, s.kernelEnviron(), s.listenPort())
}

// listenPort is the port of the proxy's listener in the kernel's jail (0: none).
func (s *Session) listenPort() int {
	if s.gate != nil || s.opts.EgressStandby {
		return egress.Port
	}
	return 0
}

// launcher is how the session starts kernels: forked from the zygote, in
// a local jail or by Options.Launcher, with the proxy's listener served by
// the gate or held on standby.
func (s *Session) launcher() kernel.Launcher {
	launch := s.opts.Launcher
	if launch == nil && s.opts.Keeper == nil && (s.opts.Zygote != nil || s.opts.Template != nil) && s.opts.Network != jail.NetworkHost {
		launch = s.zygoteLauncher()
	}
	if launch == nil {
		launch = s.jailLauncher()
	}
	launch = s.remembered(launch)
	switch {
	case s.gate != nil:
		// The session's gate serves the listener of every kernel it starts.
		launch = withListener(launch, s.gate.Serve)
	case s.opts.EgressStandby:
		// The listener is kept on standby (unserved) until ArmEgress or
		// DisarmEgress.
		launch = withListener(launch, s.holdListener)
	}
	return launch
}

// remembered wraps launch so the session knows its kernel's process
// (Resources measures it).
func (s *Session) remembered(launch kernel.Launcher) kernel.Launcher {
	return func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		p, err := launch(ctx, f)
		if err == nil {
			s.mu.Lock()
			s.proc = p
			s.mu.Unlock()
		}
		return p, err
	}
}

// listening is a kernel process with a listener on its loopback.
type listening interface{ Listener() net.Listener }

// withListener wraps launch so use gets the listener (for the egress
// proxy) of every kernel it starts; a kernel without one is stopped.
func withListener(launch kernel.Launcher, use func(net.Listener)) kernel.Launcher {
	return func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		p, err := launch(ctx, f)
		if err != nil {
			return nil, err
		}
		l, ok := p.(listening)
		if !ok || l.Listener() == nil {
			p.Kill()
			p.Wait()
			return nil, errors.New("the kernel's launcher gave no listener for the egress proxy")
		}
		use(l.Listener())
		return p, nil
	}
}

// holdListener puts ln on standby, closing the one it replaces.
func (s *Session) holdListener(ln net.Listener) {
	s.mu.Lock()
	old := s.standby
	s.standby = ln
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// closeStandby closes the listener on standby, if any: the socket is gone
// from the kernel's loopback (the jail keeps no handle on it).
func (s *Session) closeStandby() {
	s.mu.Lock()
	ln := s.standby
	s.standby = nil
	s.mu.Unlock()
	if ln != nil {
		stopListening(ln)
		ln.Close()
	}
}

// stopListening makes ln's socket stop listening now, whatever other
// descriptors of it exist: a child this server is forking at the moment
// (a jail or a kernel starting) holds a copy of every descriptor until it
// executes its program, and until then closing ln alone would leave the
// socket listening on the session's loopback, where the session's code
// could connect to it (and find nobody serving) or fail to bind its port.
// shutdown(2) acts on the socket, not the descriptor: a listening TCP
// socket goes to the closed state and refuses connections at once.
func stopListening(ln net.Listener) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// ArmEgress lets a session started with Options.EgressStandby out through
// an allowlist proxy, as if it had been started with Options.Egress (and
// EgressLookup, EgressCache): a gate with policy serves the listener held
// on standby, and the kernel's environment gets the proxy's variables.
// The session must not be in use: a manager arms a pooled session as it
// hands it out.
func (s *Session) ArmEgress(ctx context.Context, policy *egress.Policy, lookup func(context.Context, string) ([]netip.Addr, error), cache *egress.Cache) error {
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	k, err := s.kernel()
	if err != nil {
		return err
	}
	s.mu.Lock()
	ln := s.standby
	s.standby = nil
	s.mu.Unlock()
	if ln == nil || s.gate != nil {
		return errors.New("the session has no egress listener on standby")
	}
	s.opts.Egress, s.opts.EgressLookup, s.opts.EgressCache, s.opts.EgressStandby = policy, lookup, cache, false
	s.gate = egress.New(&egress.Options{Policy: *policy, LookupIP: lookup, Cache: cache, Logger: s.log})
	s.gate.Serve(ln)
	s.launch = s.launcher() // a restarted kernel: served by the gate, with the variables
	env := map[string]string{}
	for _, kv := range append(egress.Env(egress.Port), s.gate.PipEnv(egress.Port)...) {
		name, value, _ := strings.Cut(kv, "=")
		env[name] = value
	}
	if err := k.SetEnv(ctx, env); err != nil {
		return fmt.Errorf("session %s: arming its egress proxy: %w", s.id, err)
	}
	return nil
}

// DisarmEgress closes the listener a session started with
// Options.EgressStandby holds, leaving the session with no way out (its
// kernels restart without one). The session must not be in use.
func (s *Session) DisarmEgress() {
	s.acquire(context.Background())
	defer s.release()
	s.closeStandby()
	if s.opts.EgressStandby {
		s.opts.EgressStandby = false
		s.launch = s.launcher()
	}
}

// NetworkLog returns the session's egress log, or nil if the session has
// no allowlist.
func (s *Session) NetworkLog() *egress.Log {
	if s.gate == nil {
		return nil
	}
	l := s.gate.Log()
	return &l
}

// jailLauncher starts kernels in a local jail with the session's limits.
func (s *Session) jailLauncher() kernel.Launcher {
	limits := s.opts.Limits
	limits.Timeout = 0 // sessions live until closed
	env := s.kernelEnviron()
	var spawn jail.SpawnFunc
	var stderr io.Writer = logWriter{s.log}
	if kp := s.opts.Keeper; kp != nil {
		// The keeper's child must not write to a pipe of ours.
		stderr = nil
		spawn = func(cmd *exec.Cmd) (int, *os.File, error) {
			if in, ok := kp.(keeperSpawnIn); ok {
				pid, fd, keeper, err := in.SpawnIn(cmd)
				if err == nil {
					s.keeperPid.Store(int64(keeper))
				}
				return pid, fd, err
			}
			pid, fd, err := kp.Spawn(cmd)
			if err == nil {
				s.keeperPid.Store(int64(kp.Pid()))
			}
			return pid, fd, err
		}
	}
	return func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		p, err := jail.Start(ctx, &jail.Config{
			Path:       s.opts.Template.python(),
			Args:       []string{"python3", KernelPath},
			Mounts:     s.opts.Template.mounts(),
			Env:        env,
			Workspace:  s.workspace,
			Limits:     limits,
			Network:    s.opts.Network,
			ListenPort: s.listenPort(),
			Files:      []jail.File{{Path: KernelPath, Data: kernel.Source, Mode: 0o444}},
			Stderr:     stderr,
			ExtraFiles: f.List(),
			Spawn:      spawn,
		})
		if err != nil {
			return nil, err
		}
		return &jailProcess{p: p, limits: limits.WithDefaults()}, nil
	}
}

// logWriter logs what the kernel's Python says before the kernel takes
// over its stderr (it only speaks if the installation is broken).
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("kernel stderr", "text", string(p))
	return len(p), nil
}

// jailProcess adapts a jail.Process to kernel.Process.
type jailProcess struct {
	p      *jail.Process
	limits jail.Limits
}

func (j *jailProcess) Signal(sig os.Signal) error { return j.p.Signal(sig) }

func (j *jailProcess) JoinTarget() (*jail.JoinTarget, error) { return j.p.JoinTarget() }

func (j *jailProcess) Listener() net.Listener { return j.p.Listener() }

func (j *jailProcess) Usage() (jail.LiveUsage, error) { return j.p.Usage() }

func (j *jailProcess) Freeze() error { return j.p.Freeze() }

func (j *jailProcess) Thaw() error { return j.p.Thaw() }

func (j *jailProcess) DialLoopback(ctx context.Context, port int) (net.Conn, error) {
	return j.p.DialLoopback(ctx, port)
}

func (j *jailProcess) ListeningPorts() ([]int, error) { return j.p.ListeningPorts() }

func (j *jailProcess) Handoff() (jail.Handoff, []*os.File, error) { return j.p.Handoff() }

func (j *jailProcess) Detach() { j.p.Detach() }

func (j *jailProcess) Kill() error {
	j.p.Kill()
	return nil
}

// Wait reports why the kernel ended, in words for the user's traceback.
func (j *jailProcess) Wait() error {
	r, err := j.p.Wait()
	if err != nil {
		return err
	}
	return exitError(r, j.limits)
}

func exitError(r *jail.Result, l jail.Limits) error {
	switch {
	case r == nil:
		return nil
	case r.OOMKilled:
		return fmt.Errorf("killed by the out-of-memory killer: the session's memory limit is %s", bytesText(l.Memory))
	case r.Signal != "":
		return fmt.Errorf("killed by signal %s", r.Signal)
	case r.ExitCode != 0:
		return fmt.Errorf("exited with status %d", r.ExitCode)
	}
	return nil
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return strings.TrimSpace(fmt.Sprintf("%d bytes", n))
}
