package session

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// Commands. A session is one sandbox, as an E2B sandbox is one machine:
// a command (E2B's process RPCs, a terminal) runs inside the kernel's own
// jail (jail.Config.Join), so it shares the kernel's /tmp, loopback,
// processes, network (the egress allowlist included) and limits. What a
// command leaves running when it ends (`nohup server &`) lives until the
// session ends or restarts, and is killed with it.
//
// A command's join can be made ahead (PrepareCommand: jail.Joiner, one at
// most per session, made in the background): the next command without a
// terminal then costs the exec of its program, not the join's (~8 ms and
// ~2 ms of CPU with the jail's join program; ~35-70 ms with the join
// script and the init, its fallback). The E2B face asks for one when a sandbox
// is created and after each command. It is killed with the session, and
// dies with the kernel's jail (a restart's new kernel gets a new one).

// Command is a program to run inside a session's sandbox.
type Command struct {
	// Path is the program, as seen in the sandbox; Args its arguments,
	// argv[0] included (if empty, [Path]).
	Path string
	Args []string
	// Env is added to the session's environment (later wins).
	Env []string
	// Dir is the working directory. If empty, the workspace.
	Dir string
	// Stdin, Stdout, Stderr and Terminal: as jail.Config's.
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	Terminal *jail.WindowSize
	// Timeout, if nonzero, kills the command (its process group) when it
	// passes.
	Timeout time.Duration
}

// joinable is a kernel process whose jail commands can join.
type joinable interface {
	JoinTarget() (*jail.JoinTarget, error)
}

// commandEnviron is the kernel's environment without its plotting
// backend (a command is no kernel), then env.
func (s *Session) commandEnviron(env []string) []string {
	var out []string
	for _, kv := range s.kernelEnviron() {
		if !strings.HasPrefix(kv, "MPLBACKEND=") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// StartCommand starts c inside the session's jail. The caller owns the
// process: it must Wait for it (Kill kills the command's process group).
// ctx ending kills it too. Where the kernel's jail cannot be joined (a
// launcher of the caller's), the command gets a jail of its own on the
// workspace with the session's limits and network, as before sessions
// were one sandbox.
func (s *Session) StartCommand(ctx context.Context, c Command) (*jail.Process, error) {
	s.mu.Lock()
	p, closed, w := s.proc, s.closed, s.warm
	if w != nil && (c.Terminal == nil || w.proc != p) {
		s.warm = nil // taken, or of a kernel gone (a restart)
	} else {
		w = nil
	}
	s.mu.Unlock()
	if w != nil && w.proc != p {
		go w.close()
		w = nil
	}
	if closed {
		if w != nil {
			go w.close()
		}
		return nil, ErrClosed
	}
	cfg := &jail.Config{
		Path:     c.Path,
		Args:     c.Args,
		Env:      s.commandEnviron(c.Env),
		Dir:      c.Dir,
		Stdin:    c.Stdin,
		Stdout:   c.Stdout,
		Stderr:   c.Stderr,
		Terminal: c.Terminal,
	}
	if j, ok := p.(joinable); ok {
		t, err := j.JoinTarget()
		if err != nil {
			if w != nil {
				go w.close()
			}
			return nil, ErrClosed // the kernel has ended: the session is being closed or restarted
		}
		defer t.Close()
		cfg.Join = t
		cfg.Limits.Timeout = c.Timeout
		if w != nil {
			if jp, err := w.start(ctx, cfg); err == nil {
				s.preparedStarts.Add(1)
				return jp, nil
			}
			// The prepared join failed (its jail ended, or it is still
			// being made): the command joins as usual.
		}
		return jail.Start(ctx, cfg)
	}
	if w != nil {
		go w.close()
	}
	cfg.Workspace = s.workspace
	cfg.Limits = s.opts.Limits
	cfg.Limits.Timeout = c.Timeout
	cfg.Network = s.opts.Network
	return jail.Start(ctx, cfg)
}

// warmJoin is a join of the session's jail being made, or made, ahead of
// a command (PrepareCommand).
type warmJoin struct {
	proc  kernel.Process // the kernel whose jail it joins
	ready chan struct{}  // closed once j or err is set
	j     *jail.Joiner
	err   error
}

// warmWait bounds how long a command waits for a join being made ahead
// before it joins as usual (the made one is closed then).
const warmWait = 5 * time.Second

// start starts cfg in the prepared join, once made; it is used or closed.
func (w *warmJoin) start(ctx context.Context, cfg *jail.Config) (*jail.Process, error) {
	t := time.NewTimer(warmWait)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
		go w.close()
		return nil, context.DeadlineExceeded
	}
	if w.err != nil {
		return nil, w.err
	}
	p, err := w.j.Start(ctx, cfg)
	if err != nil {
		w.j.Close()
	}
	return p, err
}

// close closes the join once made.
func (w *warmJoin) close() {
	<-w.ready
	if w.j != nil {
		w.j.Close()
	}
}

// A join made ahead holds 2 tasks of the jail's Pids and ~100 KiB of its
// memory while it waits (the join program; with the script and the init,
// its fallback, 6 tasks and ~4 MiB): taken from a sandbox with small
// limits, they would be missed by its programs, so none is made below
// these.
const (
	prepareMinPids   = 64
	prepareMinMemory = 128 << 20
)

// PrepareCommand makes a join of the session's jail for its next command
// (see Commands above), in the background, unless one is made or being
// made already, the session is paused or closed, its limits are small
// (prepareMinPids, prepareMinMemory), or its kernel's jail cannot be
// joined.
func (s *Session) PrepareCommand() { s.prepareCommand() }

// prepareCommand is PrepareCommand; it returns a channel closed when the
// join is made (or failed), nil if none is being made.
func (s *Session) prepareCommand() <-chan struct{} {
	if l := s.opts.Limits.WithDefaults(); l.Pids < prepareMinPids || l.Memory < prepareMinMemory {
		return nil
	}
	s.mu.Lock()
	j, ok := s.proc.(joinable)
	if s.closed || s.paused.Load() || !ok {
		s.mu.Unlock()
		return nil
	}
	if s.warm != nil {
		s.mu.Unlock()
		return s.warm.ready
	}
	w := &warmJoin{proc: s.proc, ready: make(chan struct{})}
	s.warm = w
	s.mu.Unlock()
	go func() {
		defer close(w.ready)
		t, err := j.JoinTarget()
		if err != nil {
			w.err = err
			return
		}
		defer t.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go func() {
			select {
			case <-s.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		w.j, w.err = jail.PrepareJoin(ctx, t)
	}()
	return w.ready
}

// PreparedPids are the host PIDs of the join made ahead, once made
// (jail.Joiner's Pid and ScriptPid), nil if none is ready.
func (s *Session) PreparedPids() []int {
	s.mu.Lock()
	w := s.warm
	s.mu.Unlock()
	if w == nil {
		return nil
	}
	select {
	case <-w.ready:
	default:
		return nil
	}
	if w.j == nil || w.j.Pid() == 0 {
		return nil
	}
	return []int{w.j.Pid(), w.j.ScriptPid()}
}

// PreparedCommands is how many commands started in a join made ahead.
func (s *Session) PreparedCommands() int64 { return s.preparedStarts.Load() }

// closeWarm kills the join made ahead, if any.
func (s *Session) closeWarm() {
	s.mu.Lock()
	w := s.warm
	s.warm = nil
	s.mu.Unlock()
	if w != nil {
		w.close()
	}
}

// dropWarm kills the join made ahead before the kernel is killed (Close,
// Restart, hibernation): while the jail lives, whatever of it is orphaned
// is reaped by the jail's PID 1. Killed with the jail, its init would be
// a zombie of the host's until the host's init reaps it, and the jail's
// cgroup could not be removed meanwhile (~1 s here). A paused session's
// is frozen, and cannot die before the kernel's kill thaws the jail: it
// is closed in the background.
func (s *Session) dropWarm() {
	if s.paused.Load() {
		go s.closeWarm()
		return
	}
	s.closeWarm()
}

// StartCommand is Session.StartCommand; a paused session is resumed first.
func (m *Managed) StartCommand(ctx context.Context, c Command) (*jail.Process, error) {
	if err := m.Resume(); err != nil {
		return nil, err
	}
	m.markUsed() // a command may change the files: snapshot them again
	p, err := m.Session.StartCommand(ctx, c)
	if err == nil {
		m.commandStarted(p)
	}
	return p, err
}
