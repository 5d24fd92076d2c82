package session

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// Commands. A session is one sandbox, as an E2B sandbox is one machine:
// a command (E2B's process RPCs, a terminal) runs inside the kernel's own
// jail (jail.Config.Join), so it shares the kernel's /tmp, loopback,
// processes, network (the egress allowlist included) and limits. What a
// command leaves running when it ends (`nohup server &`) lives until the
// session ends or restarts, and is killed with it.

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
	p, closed := s.proc, s.closed
	s.mu.Unlock()
	if closed {
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
			return nil, ErrClosed // the kernel has ended: the session is being closed or restarted
		}
		defer t.Close()
		cfg.Join = t
		cfg.Limits.Timeout = c.Timeout
		return jail.Start(ctx, cfg)
	}
	cfg.Workspace = s.workspace
	cfg.Limits = s.opts.Limits
	cfg.Limits.Timeout = c.Timeout
	cfg.Network = s.opts.Network
	return jail.Start(ctx, cfg)
}

// StartCommand is Session.StartCommand; a paused session is resumed first.
func (m *Managed) StartCommand(ctx context.Context, c Command) (*jail.Process, error) {
	if err := m.Resume(); err != nil {
		return nil, err
	}
	m.markUsed() // a command may change the files: snapshot them again
	return m.Session.StartCommand(ctx, c)
}
