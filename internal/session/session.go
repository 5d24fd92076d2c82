// Package session runs stateful Python sessions: each is one kernel in its
// own jail with its own workspace, executing one cell at a time.
package session

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// Errors callers may branch on.
var (
	// ErrRestartRequired means the session's kernel died or was killed
	// (see the reason in the error); Restart brings it back.
	ErrRestartRequired = errors.New("session must be restarted")
	// ErrClosed means the session was closed.
	ErrClosed = errors.New("session closed")
)

// Options configure a session. The zero value is ready to use.
type Options struct {
	// Limits bound the kernel's jail (memory, CPUs, pids, /tmp...). Its
	// Timeout is ignored: a session lives until closed; see ExecTimeout.
	Limits jail.Limits
	// Network selects the jail's network. If empty, loopback only.
	Network jail.Network
	// Egress, if set (Network must not be host), lets the session out
	// through an allowlist proxy (package egress): each kernel's jail gets
	// a listener on its loopback at egress.Port, served on the host by one
	// gate with this policy for the session's life, and the proxy
	// variables in its environment. There is still no route out.
	Egress *egress.Policy
	// EgressLookup resolves names for the gate. If nil, the host's
	// resolver. (Tests map their names to local servers.)
	EgressLookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// EgressStandby (without Egress) gives the kernel's jail the proxy's
	// listener too, held by the host and served by nothing until
	// ArmEgress serves it or DisarmEgress closes it: a pooled kernel that
	// may go to a session in allow mode or to one in none mode.
	EgressStandby bool
	// EgressCache, if set with Egress, is the host's package cache the
	// session's pip is pointed at (PIP_INDEX_URL) when its allowlist
	// covers the cache's index; shared by the sessions of a server.
	EgressCache *egress.Cache
	// Env is added to the kernel's environment (on top of the jail's
	// minimal one, never the server's).
	Env map[string]string
	// Workspace is a host directory mounted at /workspace. If empty, a
	// fresh one capped at Limits.Disk bytes and Limits.Files files is
	// made (jail.NewQuotaDir) and removed by Close; a directory given
	// here belongs to the caller, who caps it, and is kept.
	Workspace string
	// ExecTimeout is the timeout of an execution whose Request has none.
	// If zero, 5 minutes; if negative, none.
	ExecTimeout time.Duration
	// InterruptGrace is how long interrupted code may take to stop before
	// the kernel is killed. If zero, 2 seconds.
	InterruptGrace time.Duration
	// MaxOutputBytes caps stdout and stderr (each) kept in a Result. If
	// zero, 1 MiB.
	MaxOutputBytes int
	// Launcher starts the kernel. If nil, it runs in a local jail
	// (jail.Start with Limits, Network, Env and the workspace).
	Launcher kernel.Launcher
	// Zygote, if set and Launcher is nil, forks the kernel from a
	// template that has already imported the heavy modules, with the same
	// limits, environment and workspace. Sessions with the host's
	// network start cold.
	Zygote Zygote
	// Template, if set, is the template the session's kernel runs in
	// (its interpreter, mounts, environment and zygote); Close releases it.
	Template *TemplateUse
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Session is one sandboxed Python kernel and its workspace. Its methods are
// safe for concurrent use; executions run one at a time, in call order as
// far as the scheduler allows.
type Session struct {
	id        string
	opts      Options
	log       *slog.Logger
	workspace string
	quota     *jail.QuotaDir // the workspace made by New, nil if the caller's
	launch    kernel.Launcher
	gate      *egress.Gate // with Options.Egress, or once armed
	standby   net.Listener // with Options.EgressStandby: the kernel's, unserved (under mu)

	turn chan struct{} // held by Execute, Restart and CheckComplete
	done chan struct{} // closed by Close

	mu     sync.Mutex
	k      *kernel.Kernel
	proc   kernel.Process // the kernel's process, as the launcher gave it
	closed bool
}

// New starts a session: a workspace, a jail and a kernel ready to execute.
func New(ctx context.Context, o *Options) (*Session, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	s := &Session{id: newID(), opts: opts, turn: make(chan struct{}, 1), done: make(chan struct{})}
	s.log = opts.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("session", s.id)
	if opts.Workspace == "" {
		l := opts.Limits.WithDefaults()
		if err := l.DiskFits(); err != nil {
			return nil, err
		}
		q, err := jail.NewQuotaDir(l.Disk, l.Files)
		if err != nil {
			return nil, err
		}
		s.workspace, s.quota = q.Path, q
	} else {
		fi, err := os.Stat(opts.Workspace)
		if err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("workspace %s: not a directory", opts.Workspace)
		}
		s.workspace = opts.Workspace
	}
	if opts.Egress != nil {
		if opts.Network == jail.NetworkHost {
			s.removeWorkspace()
			return nil, errors.New("a session with the host's network has no egress allowlist")
		}
		s.gate = egress.New(&egress.Options{Policy: *opts.Egress, LookupIP: opts.EgressLookup, Cache: opts.EgressCache, Logger: s.log})
	}
	if opts.EgressStandby && (opts.Egress != nil || opts.Network == jail.NetworkHost) {
		s.removeWorkspace()
		return nil, errors.New("a session on standby for an egress allowlist has none yet and no host network")
	}
	s.launch = s.launcher()
	k, err := s.start(ctx)
	if err != nil {
		if s.gate != nil {
			s.gate.Close()
		}
		s.closeStandby()
		s.removeWorkspace()
		return nil, err
	}
	s.k = k
	s.log.Debug("session started", "workspace", s.workspace)
	return s, nil
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Session) start(ctx context.Context) (*kernel.Kernel, error) {
	k, err := kernel.Start(ctx, s.launch, &kernel.Options{
		InterruptGrace: s.opts.InterruptGrace,
		MaxOutputBytes: s.opts.MaxOutputBytes,
		Logger:         s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", s.id, err)
	}
	return k, nil
}

// ID identifies the session.
func (s *Session) ID() string { return s.id }

// Workspace is the host directory mounted at /workspace.
func (s *Session) Workspace() string { return s.workspace }

// kernel returns the current kernel, or an error if the session is closed.
func (s *Session) kernel() (*kernel.Kernel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.k, nil
}

// Err returns nil while the session can execute, ErrClosed once closed, or
// an error wrapping ErrRestartRequired (with the reason) after its kernel
// died or was killed.
func (s *Session) Err() error {
	k, err := s.kernel()
	if err != nil {
		return err
	}
	if err := k.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	return nil
}

// acquire takes the session's turn, respecting ctx.
func (s *Session) acquire(ctx context.Context) error {
	select {
	case s.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Session) release() { <-s.turn }

// Execute runs one cell and returns its result, calling onEvent (if not
// nil) with each event as it happens. A second call waits until the first
// is done or ctx is done. Code that fails, times out or kills its kernel
// gives a Result (status "error", "timeout", "killed"), not an error; the
// error return is for a session that cannot execute (ErrClosed,
// ErrRestartRequired) or a ctx done before the cell started. A ctx done
// while the cell runs interrupts it (status "interrupted").
func (s *Session) Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error) {
	if err := s.acquire(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	k, err := s.kernel()
	if err != nil {
		return nil, err
	}
	if req.Timeout == 0 {
		switch {
		case s.opts.ExecTimeout > 0:
			req.Timeout = s.opts.ExecTimeout
		case s.opts.ExecTimeout == 0:
			req.Timeout = 5 * time.Minute
		}
	}
	res, err := k.Execute(ctx, req, onEvent)
	if errors.Is(err, kernel.ErrDead) {
		if s.isClosed() {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	return res, err
}

// CheckComplete says whether code typed at a prompt is a complete cell
// ("complete"), needs more lines ("incomplete") or cannot compile
// ("invalid"), as Python's own prompt decides.
func (s *Session) CheckComplete(ctx context.Context, code string) (string, error) {
	if err := s.acquire(ctx); err != nil {
		return "", err
	}
	defer s.release()
	k, err := s.kernel()
	if err != nil {
		return "", err
	}
	status, err := k.CheckComplete(ctx, code)
	if errors.Is(err, kernel.ErrDead) {
		return "", fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	return status, err
}

// Interrupt interrupts the running execution, if any, as Ctrl-C would: it
// ends with status "interrupted" and the session keeps its state (unless
// the code ignores the interrupt past the grace period: then the kernel is
// killed).
func (s *Session) Interrupt() error {
	k, err := s.kernel()
	if err != nil {
		return err
	}
	k.Interrupt()
	return nil
}

// Restart replaces the kernel with a fresh one: all Python state is gone,
// the workspace stays. A running execution ends with status "killed".
func (s *Session) Restart(ctx context.Context) error {
	old, err := s.kernel()
	if err != nil {
		return err
	}
	old.Kill("the session was restarted")
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	old.Close()
	if s.isClosed() {
		return ErrClosed
	}
	k, err := s.start(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		k.Close()
		return ErrClosed
	}
	s.k = k
	return nil
}

// Done is closed when Close is called: a caller streaming an execution's
// events to a client stops waiting on that client then.
func (s *Session) Done() <-chan struct{} { return s.done }

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close kills the kernel and everything it started and removes the
// workspace if the session made it. A running execution ends with status
// "killed". Close is idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	k := s.k
	s.mu.Unlock()
	close(s.done)
	k.Kill("the session was closed")
	k.Close()
	// Wait for a Restart in progress to give up its turn: it sees closed.
	s.turn <- struct{}{}
	<-s.turn
	if s.gate != nil {
		s.gate.Close()
	}
	s.closeStandby()
	s.opts.Template.release()
	return s.removeWorkspace()
}

func (s *Session) removeWorkspace() error {
	if s.quota == nil {
		return nil
	}
	if err := s.quota.Remove(); err != nil {
		return fmt.Errorf("remove workspace: %w", err)
	}
	return nil
}

// Quota describes the workspace's caps: the bytes and files it may hold,
// and whether the kernel enforces them on every write (false for a
// caller's directory, or where no tmpfs can be made: then only uploads
// are checked).
type Quota struct {
	Disk     int64
	Files    int
	Enforced bool
}

// measured is a kernel process that can say what its sandbox uses now.
type measured interface {
	Usage() (jail.LiveUsage, error)
}

// Resources is what the session's sandbox uses now (its kernel and
// everything the kernel started): CPU time so far, memory. It fails where
// no cgroup measures the sandbox, and while no kernel runs.
func (s *Session) Resources() (jail.LiveUsage, error) {
	s.mu.Lock()
	p, closed := s.proc, s.closed
	s.mu.Unlock()
	if closed {
		return jail.LiveUsage{}, ErrClosed
	}
	m, ok := p.(measured)
	if !ok {
		return jail.LiveUsage{}, jail.ErrNoGroup
	}
	return m.Usage()
}

// Quota returns the workspace's caps.
func (s *Session) Quota() Quota {
	if s.quota == nil {
		l := s.opts.Limits.WithDefaults()
		return Quota{Disk: l.Disk, Files: l.Files}
	}
	return Quota{Disk: s.quota.Disk, Files: s.quota.Files, Enforced: s.quota.Enforced}
}

// Usage reports the bytes and files the workspace holds.
func (s *Session) Usage() (jail.Usage, error) {
	if s.quota == nil {
		q := jail.QuotaDir{Path: s.workspace}
		return q.Usage()
	}
	return s.quota.Usage()
}
