package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Manager errors callers may branch on.
var (
	// ErrNotFound: no session with that id belongs to the caller.
	ErrNotFound = errors.New("session not found")
	// ErrCapacity: the server holds as many sessions as it may.
	ErrCapacity = errors.New("too many sessions")
	// ErrNoTemplates: a session asked for a template on a manager without
	// ManagerOptions.Templates.
	ErrNoTemplates = errors.New("this server has no templates")
)

// LimitError reports a requested limit above the server's maximum.
type LimitError struct {
	Name      string
	Requested string
	Max       string
	// Reason, if set, is the whole message (what is over which bound,
	// and what to do).
	Reason string
}

func (e *LimitError) Error() string {
	if e.Reason != "" {
		return e.Reason
	}
	return fmt.Sprintf("%s %s is above this server's maximum of %s", e.Name, e.Requested, e.Max)
}

// ManagerOptions configure a Manager. Zero values mean the defaults.
type ManagerOptions struct {
	// PoolSize is how many kernels are kept started ahead, so creating a
	// session with the default limits does not wait for a jail and an
	// interpreter. If zero, none: every session starts cold.
	PoolSize int
	// PrepareCommands: a pooled session gets a join of its jail made
	// ahead for its first command (Session.PrepareCommand) once started
	// and while no create waits for the pool, kept by a create that asks
	// for it (CreateOptions.Commands) and dropped by the others; only
	// while sessions run commands (CommandsRun within PoolPeakHold): a
	// join costs ~2 ms of CPU and ~100 KiB (~25 ms and ~4 MiB with the join
	// script, without the join program), of no use to sessions that
	// only execute code. Not with FixedPool.
	PrepareCommands bool
	// MaxSessions caps the running sessions held at once (pooled and
	// paused ones not counted: see MaxPaused) when one is created: a
	// paused session is resumed whenever it is called, even past it. If
	// zero, 64.
	MaxSessions int
	// IdleTimeout closes (or, with IdleAction "pause", pauses) a session
	// not used for this long. If zero, 30 minutes; if negative, never.
	IdleTimeout time.Duration
	// IdleAction is what becomes of a session idle past IdleTimeout:
	// "close" (the default, also for "") or "pause" (Session.Pause: it
	// keeps its state and memory, uses no CPU, takes no slot of
	// MaxSessions, and the next call resumes it). Where MaxPaused
	// sessions are paused already, or pausing fails, it is closed.
	IdleAction string
	// MaxPaused caps the paused sessions held besides MaxSessions running
	// ones: past it a Managed.Pause fails with ErrCapacity and an idle
	// session is closed instead of paused. If zero, MaxSessions.
	MaxPaused int
	// PausedTimeout closes a session paused and unused for this long
	// (pinned ones excepted: their owner governs them). If zero, 24
	// hours; negative, never. MaxLifetime still applies to paused
	// sessions (and, at 12 hours by default, usually comes first).
	PausedTimeout time.Duration
	// MaxLifetime closes a session this long after its creation. If zero,
	// 12 hours; if negative, never.
	MaxLifetime time.Duration
	// RefillDelay is how long the pool waits after handing out a kernel
	// before starting its replacement, so the start does not compete for
	// CPU with the new session's first execution. If zero, 250ms.
	RefillDelay time.Duration
	// FixedPool selects the pool before issue 26, for comparison: one
	// kernel started at a time, RefillDelay after each take even while
	// creates wait, which start cold meanwhile; the pool never grows past
	// PoolSize.
	FixedPool bool
	// MaxPool bounds the pool when the demand grows it (pool.go). If
	// zero, MaxSessions (PoolMemory and the free slots bound it too), at
	// least PoolSize.
	MaxPool int
	// PoolMemory is the memory the pool's ready kernels may hold when the
	// demand grows it past PoolSize: at most PoolMemory /
	// ForkedKernelMemory kernels (ColdKernelMemory without a Zygote). If
	// zero, DefaultPoolMemory (an eighth of MemAvailable now); negative:
	// no bound.
	PoolMemory int64
	// PoolPeakHold is how long the pool remembers the largest burst of
	// creates it has seen (the most within two seconds) and keeps that
	// many kernels ready, so that bursts of the same size again and again
	// are served from the pool; a burst as large renews it. If zero, 5
	// minutes; negative: bursts are not remembered (the pool follows the
	// arrival rate only).
	PoolPeakHold time.Duration
	// PoolPeakFile, if set, is where the bursts the pool remembers are
	// kept (poolpeak.go), so that a manager started on the same file
	// within PoolPeakHold of a burst fills its pool for it at once, as the
	// manager before it did.
	PoolPeakFile string
	// PoolIdleShrink is how long without a create before the kernels
	// above the pool's target are closed. If zero, 30 seconds.
	PoolIdleShrink time.Duration
	// PoolParallel is how many pooled kernels may start at once while
	// creates wait for one. If zero, twice the CPUs, between 2 and 8.
	PoolParallel int
	// ReapInterval is how often idle and expired sessions are looked for.
	// If zero, 10 seconds.
	ReapInterval time.Duration
	// CloseTimeout bounds how long closing one session holds up its
	// caller (a delete, the reaper, Close); a close that takes longer
	// goes on in the background. If zero, 5 seconds.
	CloseTimeout time.Duration
	// Defaults are the limits of a session that asks for none (and of the
	// pooled kernels). Zero fields take jail's defaults.
	Defaults jail.Limits
	// Max bounds what a session may ask for. Zero fields mean: no more
	// than the defaults.
	Max jail.Limits
	// ExecTimeout is the default execution timeout. If zero, 5 minutes.
	ExecTimeout time.Duration
	// MaxOutputBytes caps stdout and stderr kept per execution. If zero, 1 MiB.
	MaxOutputBytes int
	// Zygote, if set, forks every session's kernel (pooled ones too) from
	// a template that has already imported the heavy modules; sessions
	// with the host's network still start cold.
	Zygote Zygote
	// DefaultEgress, if set, is the allowlist policy of sessions created
	// without a Network or an Egress of their own (a server whose default
	// mode is allow: MCP and agent runs' sessions too).
	DefaultEgress *egress.Policy
	// EgressLookup resolves names for the egress gates of sessions with
	// an allowlist. If nil, the host's resolver.
	EgressLookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// EgressCache is the package cache of sessions with an allowlist
	// (Options.EgressCache). If nil, none.
	EgressCache *egress.Cache
	// Templates, if set, resolves CreateOptions.Template.
	Templates Templates
	// DefaultTemplate, if set, is the template of sessions created without
	// one (CreateOptions.Template empty; NoTemplate asks for none). It
	// needs Templates.
	DefaultTemplate string
	// Logger receives lifecycle events. If nil, they are discarded.
	Logger *slog.Logger
	// OnClose, if set, is called after a managed session is closed, with
	// the reason ("deleted", "idle", "expired", "shutdown").
	OnClose func(id, reason string)

	// Checkpoints is the checkpoint mode of sessions created without one:
	// "auto" or "off". If empty, "off".
	Checkpoints string
	// AutoCheckpoints is how many automatic checkpoints a session keeps.
	// If zero, 3.
	AutoCheckpoints int
	// CheckpointMemory bounds the bytes a session's checkpoints hold
	// (their kernel copies' private memory and their files). If zero,
	// 1 GiB.
	CheckpointMemory int64
	// MaxCheckpoints caps the checkpoints a session takes on request. If
	// zero, 16.
	MaxCheckpoints int
	// Keeper, if set, holds every session handed out for the next server
	// (keep.go, manager_keep.go): Reattach takes them over, Detach lets go
	// of them at shutdown. Sessions then start cold (Zygote is not used).
	Keeper Keeper

	// Snapshots, if set, is where durable snapshots are written
	// (Manager.Snapshot, CreateOptions.Snapshot, hibernation). If nil,
	// they answer ErrNoSnapshots and no session hibernates.
	Snapshots *snapshot.Store
	// IdleHibernate, with Snapshots, hibernates a session unused this
	// long (hibernate.go): its files and variables go to the snapshot
	// store and its processes and workspace are freed; the next call
	// restores it on the same id. Paused sessions (also pinned ones: an
	// E2B sandbox paused by its owner or by its lifecycle) hibernate
	// after this long paused. If zero, never.
	IdleHibernate time.Duration
	// SnapshotMaintenance is how often the snapshot store's retention is
	// enforced and its garbage collected (snapshot.Store.Maintain). If
	// zero, 10 minutes; negative, never.
	SnapshotMaintenance time.Duration
	// OnSnapshot, if set, is told of every snapshot written of a session
	// (Manager.Snapshot and hibernation), once it is stored: a cell's
	// host records it as the session's latest, from which a gateway
	// restores the session if this host is lost. It must not block long.
	OnSnapshot func(session, snapshot string)
	// Records, with Snapshots, is a directory where the manager keeps a
	// small record of every session (durable.go), so that the next
	// manager on it brings back, from their latest snapshots, the
	// sessions whose processes were lost (a keeper or a server killed)
	// and the hibernated ones (Restore). If empty, none.
	Records string
	// SnapshotEvery, with Records, writes an automatic snapshot of a
	// session used since its last one, at most this often (durable.go).
	// If zero, never.
	SnapshotEvery time.Duration
	// ForkFiles is how a fork gives its children the parent's files:
	// ForkFilesOverlay (the default where it runs: as root, without a
	// Keeper or DefaultTemplate) shares one read-only copy per fork under
	// each child's own overlay layer; ForkFilesCopy copies them into each
	// child's workspace. Where the overlay cannot run, forks copy
	// (ForkFilesSupport says why; Restored.FilesBy says which ran).
	ForkFiles string
}

// What ManagerOptions.IdleAction may be.
const (
	IdleActionClose = "close"
	IdleActionPause = "pause"
)

// CheckIdleAction says what is wrong with an IdleAction ("" is "close").
func CheckIdleAction(a string) error {
	switch a {
	case "", IdleActionClose, IdleActionPause:
		return nil
	}
	return fmt.Errorf("idle action %q: must be %q or %q", a, IdleActionClose, IdleActionPause)
}

// CreateOptions are what a caller may choose for one session.
type CreateOptions struct {
	// Owner is who the session belongs to (for example a token's hash);
	// other owners cannot see it.
	Owner string
	// Limits: zero fields take the manager's defaults. Timeout is ignored.
	Limits jail.Limits
	// Env is the kernel's environment, on top of the jail's minimal one.
	Env map[string]string
	// Network: "" (the manager's default: DefaultEgress if set), "none"
	// (loopback only) or "host" (if allowed by AllowNetwork).
	Network jail.Network
	// Egress, if set, lets the session out through an allowlist proxy
	// (Options.Egress); Network must then be none. Such a session takes a
	// pooled kernel too: pooled kernels hold the proxy's listener on
	// standby, armed (or closed) as they are handed out.
	Egress *egress.Policy
	// ExecTimeout is the default timeout of this session's executions.
	// If zero, the manager's.
	ExecTimeout time.Duration
	// Checkpoints: "auto" (one before every execution, for Undo), "off",
	// or "" (the manager's default).
	Checkpoints string
	// Ports says who may reach servers inside the session besides its
	// owner (see PortAccess).
	PortAccess PortAccess
	// Template, if set, names the template the session runs in
	// (ManagerOptions.Templates); its limits are the defaults of the
	// session's. Never from the pool. If empty, the manager's
	// DefaultTemplate; NoTemplate: none, whatever the default.
	Template string
	// Commands: the session will run commands (an E2B sandbox): it keeps
	// the join a pooled session has made ahead (PrepareCommands).
	Commands bool
	// Snapshot, if set, is the id of one of Owner's snapshots the session
	// starts from: its files, then its variables, are loaded before
	// Create returns (Session.Restored says what came back). If loading
	// fails (a corrupted snapshot: *snapshot.CorruptError), the session is
	// closed and Create fails: never half-restored.
	Snapshot string

	// frozen: a fork's child, whose workspace is an overlay over its
	// parent's frozen files (forkfiles.go). Never from the pool.
	frozen *frozenFiles
	// forkOf: a fork's child, of this parent; Fork notes its creation
	// once it holds the parent's state.
	forkOf string
}

// NoTemplate, as CreateOptions.Template, asks for the plain environment
// (the sandbox's own Python) on a manager with a DefaultTemplate. It
// cannot be a template's name.
const NoTemplate = "-"

// Managed is a session held by a Manager, with its bookkeeping.
//
// Whether it is in use is decided in one place, here: its Execute,
// CheckComplete, Restart, Interrupt, the checkpoint calls and a Fork of it
// mark it busy while they run (it
// is never reaped as idle mid-call, whoever calls), Lease marks it busy
// for longer work spanning several calls, and Pin for good (a session
// whose life its owner governs: an E2B sandbox's time to live, an agent
// run).
// Idle reaping, and the lifecycle built on it, asks only
// Manager.reapVerdictLocked. A session the manager let go of (reaped,
// deleted) fails every such call with ErrClosed.
//
// A paused session (Pause, or the reaper with IdleAction "pause") is
// resumed by every call on it but Close (and the manager's Delete), which
// kill it as they would a running one.
type Managed struct {
	*Session
	Owner       string
	Created     time.Time
	Limits      jail.Limits
	Network     jail.Network
	Egress      *egress.Policy // nil: no allowlist
	ExecTimeout time.Duration
	FromPool    bool
	PortAccess  PortAccess
	Template    string // "" for none

	mgr *Manager

	mu        sync.Mutex
	lastUsed  time.Time
	busy      int
	pinned    bool
	gone      bool      // the manager let go of it (reaped, deleted, shut down): its close is under way
	hibFailed time.Time // the last failed hibernation

	durable *durableState // with ManagerOptions.Records (durable.go)
}

// Touch marks the session used now.
func (m *Managed) Touch() { m.mu.Lock(); m.lastUsed = time.Now(); m.mu.Unlock() }

// Lease marks the session in use until release is called (once; later
// calls do nothing): it is not idle meanwhile, and its idle time starts
// at the release.
//
// A paused session is resumed (Lease is how longer work on a session
// starts: it needs the session running).
func (m *Managed) Lease() (release func()) {
	release, _ = m.lease()
	return release
}

// use is Lease for one call on the session: ErrClosed if the manager has
// let go of it (reaped or deleted, its close under way), rather than a
// call run on a kernel about to be closed. The reaper decides and marks
// under m.mu, as use does: a session is either reaped idle or in use.
func (m *Managed) use() (release func(), err error) {
	release, gone := m.lease()
	if gone {
		release()
		return nil, ErrClosed
	}
	return release, nil
}

// lease is Lease, saying too whether the manager had let go of the
// session (then it is not resumed).
func (m *Managed) lease() (release func(), gone bool) {
	m.mu.Lock()
	m.busy++
	m.lastUsed = time.Now()
	gone = m.gone
	m.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			m.mu.Lock()
			m.busy--
			m.lastUsed = time.Now()
			m.mu.Unlock()
			// Again at its end: an automatic snapshot that took the turn
			// between the start and the work (a cell waiting for it)
			// counted the use without its effects.
			m.markUsed()
		})
	}
	if gone {
		return release, true
	}
	m.markUsed()
	if err := m.Session.Resume(); err != nil && !errors.Is(err, ErrClosed) {
		m.Session.log.Warn("resume a paused session", "err", err)
	}
	return release, false
}

// inUse runs f with m in use (use): ErrClosed, f not run, if the manager
// has let go of m.
func inUse[T any](m *Managed, f func() (T, error)) (T, error) {
	release, err := m.use()
	if err != nil {
		var zero T
		return zero, err
	}
	defer release()
	return f()
}

// letGoLocked forgets ms, which is about to be closed (or let go of at
// shutdown), under m.mu: calls on it fail with ErrClosed from now on
// (Managed.use), and its events are served until its close has ended
// (shutting).
func (m *Manager) letGoLocked(ms *Managed) {
	delete(m.sessions, ms.ID())
	ms.mu.Lock()
	ms.gone = true
	ms.mu.Unlock()
	m.shutting[ms.ID()] = ms
}

// closeEnded notes that ms's close (or its letting go) has ended: ended holds
// its events from now on, if it was closed.
func (m *Manager) closeEnded(ms *Managed) {
	m.mu.Lock()
	if m.shutting[ms.ID()] == ms {
		delete(m.shutting, ms.ID())
	}
	m.mu.Unlock()
}

// Pin marks the session in use until it is closed: it is never reaped as
// idle (MaxLifetime still applies). For sessions whose owner governs their
// life (an E2B sandbox's time to live, an agent run).
func (m *Managed) Pin() { m.mu.Lock(); m.pinned = true; m.mu.Unlock() }

// LastUsed is when the session last served a request.
func (m *Managed) LastUsed() time.Time { m.mu.Lock(); defer m.mu.Unlock(); return m.lastUsed }

// Execute is Session.Execute, with the session in use meanwhile.
func (m *Managed) Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error) {
	return inUse(m, func() (*kernel.Result, error) { return m.Session.Execute(ctx, req, onEvent) })
}

// CheckComplete is Session.CheckComplete, with the session in use meanwhile.
func (m *Managed) CheckComplete(ctx context.Context, code string) (string, error) {
	return inUse(m, func() (string, error) { return m.Session.CheckComplete(ctx, code) })
}

// Restart is Session.Restart, with the session in use meanwhile.
func (m *Managed) Restart(ctx context.Context) error {
	_, err := inUse(m, func() (struct{}, error) { return struct{}{}, m.Session.Restart(ctx) })
	return err
}

// Checkpoint is Session.Checkpoint, with the session in use meanwhile.
func (m *Managed) Checkpoint(ctx context.Context, name string) (*Checkpoint, error) {
	return inUse(m, func() (*Checkpoint, error) { return m.Session.Checkpoint(ctx, name) })
}

// Checkpoints is Session.Checkpoints; it counts as a use.
func (m *Managed) Checkpoints() []Checkpoint {
	m.Touch()
	return m.Session.Checkpoints()
}

// RestoreCheckpoint is Session.RestoreCheckpoint, with the session in use
// meanwhile.
func (m *Managed) RestoreCheckpoint(ctx context.Context, id string) (*Restored, error) {
	return inUse(m, func() (*Restored, error) { return m.Session.RestoreCheckpoint(ctx, id) })
}

// DeleteCheckpoint is Session.DeleteCheckpoint, with the session in use
// meanwhile.
func (m *Managed) DeleteCheckpoint(ctx context.Context, id string) error {
	_, err := inUse(m, func() (struct{}, error) { return struct{}{}, m.Session.DeleteCheckpoint(ctx, id) })
	return err
}

// Undo is Session.Undo, with the session in use meanwhile.
func (m *Managed) Undo(ctx context.Context) (*Restored, error) {
	return inUse(m, func() (*Restored, error) { return m.Session.Undo(ctx) })
}

// Interrupt is Session.Interrupt; it counts as a use.
func (m *Managed) Interrupt() error {
	m.Touch()
	return m.Session.Interrupt()
}

// Files is Session.Files, resuming a paused session first (a request to
// the session wakes it, whatever it asks). Opening it is a use, and so is
// each change made through it: an automatic snapshot taken between the
// opening and a write would otherwise count the use without the write.
func (m *Managed) Files(opts workspace.Options) (*workspace.Workspace, error) {
	if err := m.Resume(); err != nil {
		return nil, err
	}
	m.markUsed()
	changed := opts.Changed
	opts.Changed = func() {
		m.markUsed()
		if changed != nil {
			changed()
		}
	}
	return m.Session.Files(opts)
}

// Pause is Session.Pause, within the manager's cap on paused sessions
// (ManagerOptions.MaxPaused: past it, with a snapshot store, the session
// hibernates instead; without one, ErrCapacity). It is not a use: the
// session's idle time goes on.
func (m *Managed) Pause() error {
	mg := m.mgr
	mg.pauseMu.Lock()
	defer mg.pauseMu.Unlock()
	if m.Session.paused.Load() || m.Session.hib.on.Load() {
		return nil
	}
	if mg.Stats().Paused >= mg.opts.MaxPaused {
		if mg.opts.Snapshots != nil {
			// Memory is short for one more paused session: this one
			// goes to storage instead (a hibernation keeps no memory).
			ctx, cancel := context.WithTimeout(context.Background(), snapshotDeadline)
			defer cancel()
			man, err := m.Session.hibernate(ctx, mg.opts.Snapshots, m.Owner, m.durable != nil,
				fmt.Sprintf("a pause, to storage: %d sessions are paused already, the server's maximum", mg.opts.MaxPaused))
			if err != nil {
				return fmt.Errorf("%d sessions are paused already, this server's maximum, and hibernating this one instead failed: %w", mg.opts.MaxPaused, err)
			}
			m.hibernated(man)
			return nil
		}
		return fmt.Errorf("%w: %d sessions are paused already, this server's maximum (close or resume one)", ErrCapacity, mg.opts.MaxPaused)
	}
	m.snapshotBeforePause()
	for {
		err := m.Session.Pause()
		if !errors.Is(err, ErrBusy) || m.durable == nil || m.durable.writing.Load() == 0 {
			return err
		}
		// An automatic snapshot holds the turn, not a cell: it ends soon.
		time.Sleep(5 * time.Millisecond)
	}
}

// snapshotBeforePause writes an automatic snapshot of a session used
// since its last one (with ManagerOptions.SnapshotEvery): a paused
// session is not written (its kernel is frozen), so what was done
// between its last snapshot and the pause would be lost with its keeper.
func (m *Managed) snapshotBeforePause() {
	d := m.durable
	if d == nil || m.mgr.opts.SnapshotEvery <= 0 {
		return
	}
	d.mu.Lock()
	used := !d.usedAt.IsZero()
	d.mu.Unlock()
	if !used {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), snapshotDeadline)
	defer cancel()
	m.mgr.autoSnapshot(ctx, m) // a cell running: none (the pause fails busy too)
}

// Resume is Session.Resume; it counts as a use.
func (m *Managed) Resume() error {
	m.Touch()
	return m.Session.Resume()
}

// Close gives the session back to its manager, which closes and forgets
// it. Closing it again, or after the manager reaped it, is not an error.
func (m *Managed) Close() error {
	if err := m.mgr.Delete(m.Owner, m.ID()); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Manager holds the sessions of a server: a warm pool, a cap, limits
// bounded by server-wide maxima, idle and lifetime reaping, and shutdown.
type Manager struct {
	opts     ManagerOptions
	log      *slog.Logger
	defaults jail.Limits
	max      jail.Limits

	pauseMu sync.Mutex // one Managed.Pause at a time, within MaxPaused

	detaching atomic.Bool // Detach: Close lets go of kept sessions

	commandsAt atomic.Int64 // when a session last started a command (CommandsRun), Unix ns

	mu       sync.Mutex
	sessions map[string]*Managed
	pool     []*Session
	starting int // pooled kernels being started
	closed   bool
	// keeperDeaths are the keepers KeeperDied was told of, in order: a
	// session whose kernel one that died while it was created spawned,
	// registered after its sweep, is put to sleep at its registration
	// (Create). Only deaths since the create began count: a later keeper
	// may reuse a dead one's PID.
	keeperDeaths []int64

	fair fairPool // without FixedPool (pool.go)
	// peakSave is the write of PoolPeakFile due (poolpeak.go), under mu;
	// peakFileMu orders the writes.
	peakSave   *time.Timer
	peakFileMu sync.Mutex

	usage samplers // the sessions whose metrics are watched (usage.go)

	ended endedSessions // the sessions closed lately: their events, why (events.go)
	// shutting are the sessions let go of whose close has not ended yet
	// (under mu): their events are still served (SessionEvents) until
	// ended holds them.
	shutting map[string]*Managed

	recordWrites inflight // records written again at an event (recordEventsOf)

	refill  chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
	closing sync.WaitGroup // sessions and pooled kernels being closed
}

// NewManager starts a manager and, in the background, its pool.
func NewManager(o *ManagerOptions) *Manager {
	opts := *cmp.Or(o, &ManagerOptions{}) // nil: every default
	if opts.MaxSessions == 0 {
		opts.MaxSessions = 64
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = 30 * time.Minute
	}
	if opts.MaxPaused == 0 {
		opts.MaxPaused = opts.MaxSessions
	}
	if opts.PausedTimeout == 0 {
		opts.PausedTimeout = 24 * time.Hour
	}
	if opts.MaxLifetime == 0 {
		opts.MaxLifetime = 12 * time.Hour
	}
	if opts.ReapInterval == 0 {
		opts.ReapInterval = 10 * time.Second
	}
	if opts.CloseTimeout == 0 {
		opts.CloseTimeout = 5 * time.Second
	}
	if opts.ExecTimeout == 0 {
		opts.ExecTimeout = 5 * time.Minute
	}
	if opts.RefillDelay == 0 {
		opts.RefillDelay = 250 * time.Millisecond
	}
	if opts.MaxPool == 0 {
		opts.MaxPool = opts.MaxSessions
	}
	if opts.PoolMemory == 0 {
		opts.PoolMemory = DefaultPoolMemory()
	}
	if opts.PoolPeakHold == 0 {
		opts.PoolPeakHold = 5 * time.Minute
	}
	if opts.PoolIdleShrink == 0 {
		opts.PoolIdleShrink = 30 * time.Second
	}
	opts.MaxPool = max(opts.MaxPool, opts.PoolSize)
	if opts.PoolParallel <= 0 {
		opts.PoolParallel = defaultPoolParallel()
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	def := opts.Defaults.WithDefaults()
	def.Timeout = 0
	mx := opts.Max
	for _, f := range []struct {
		max *int64
		def int64
	}{{&mx.Memory, def.Memory}, {&mx.TmpSize, def.TmpSize}, {&mx.FileSize, def.FileSize}, {&mx.Stack, def.Stack}, {&mx.Disk, def.Disk}} {
		if *f.max == 0 {
			*f.max = f.def
		}
	}
	if mx.CPUs == 0 {
		mx.CPUs = def.CPUs
	}
	if mx.Pids == 0 {
		mx.Pids = def.Pids
	}
	if mx.NoFile == 0 {
		mx.NoFile = def.NoFile
	}
	if mx.Files == 0 {
		mx.Files = def.Files
	}
	m := &Manager{
		opts: opts, log: log, defaults: def, max: mx,
		sessions: map[string]*Managed{},
		shutting: map[string]*Managed{},
		refill:   make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	if opts.PoolPeakFile != "" && !opts.FixedPool && opts.PoolPeakHold > 0 {
		peaks, err := m.loadPeaks(time.Now())
		if err != nil {
			log.Warn("the bursts the last server's pool remembered are not read; the pool starts without them", "file", opts.PoolPeakFile, "err", err)
		}
		if len(peaks) > 0 {
			m.fair.peaks = peaks
			log.Info("the pool remembers the largest burst before the restart and fills for it", "creates", peaks[0].n,
				"within", poolRateWindow, "at", peaks[0].at.UTC().Format(time.RFC3339), "until", peaks[0].at.Add(opts.PoolPeakHold).UTC().Format(time.RFC3339))
		}
	}
	m.wg.Add(2)
	if opts.FixedPool {
		go m.poolLoop()
	} else {
		go m.poolLoopFair()
	}
	go m.reapLoop()
	if opts.Snapshots != nil && opts.SnapshotMaintenance >= 0 {
		m.wg.Add(1)
		go m.maintainLoop(cmp.Or(opts.SnapshotMaintenance, 10*time.Minute))
	}
	if opts.Snapshots != nil && opts.Records != "" && opts.SnapshotEvery > 0 {
		m.wg.Add(1)
		go m.autoSnapshotLoop(opts.SnapshotEvery)
	}
	m.kick()
	return m
}

func (m *Manager) sessionOptions(l jail.Limits, env map[string]string, network jail.Network, eg *egress.Policy, execTimeout time.Duration) *Options {
	return &Options{
		Limits: l, Env: env, Network: network, Egress: eg, EgressLookup: m.opts.EgressLookup, EgressCache: m.opts.EgressCache, ExecTimeout: execTimeout,
		MaxOutputBytes: m.opts.MaxOutputBytes, Logger: m.log, Zygote: m.opts.Zygote, Keeper: m.opts.Keeper,
		AutoCheckpoints: m.opts.AutoCheckpoints, MaxCheckpoints: m.opts.MaxCheckpoints, CheckpointMemory: m.opts.CheckpointMemory,
		lasting: m.opts.Records != "" && m.opts.Snapshots != nil,
	}
}

// resolve fills a request's limits from the defaults and checks them
// against the maxima.
func (m *Manager) resolve(req jail.Limits) (jail.Limits, error) {
	l, d := req, m.defaults
	l.Memory, l.CPUs, l.Pids = cmp.Or(l.Memory, d.Memory), cmp.Or(l.CPUs, d.CPUs), cmp.Or(l.Pids, d.Pids)
	l.TmpSize, l.FileSize = cmp.Or(l.TmpSize, d.TmpSize), cmp.Or(l.FileSize, d.FileSize)
	l.NoFile, l.Stack = cmp.Or(l.NoFile, d.NoFile), cmp.Or(l.Stack, d.Stack)
	l.Disk, l.Files = cmp.Or(l.Disk, d.Disk), cmp.Or(l.Files, d.Files)
	if req.Disk == 0 && l.Disk > l.Memory {
		// The workspace counts toward memory: a session that asks for
		// less memory than the default disk gets half its memory.
		l.Disk = l.Memory / 2 &^ (1<<20 - 1)
	}
	l.Timeout = 0
	switch {
	case l.Memory > m.max.Memory:
		return l, &LimitError{Name: "memory", Requested: fmt.Sprintf("%d MiB", l.Memory>>20), Max: fmt.Sprintf("%d MiB", m.max.Memory>>20)}
	case l.CPUs > m.max.CPUs:
		return l, &LimitError{Name: "cpus", Requested: fmt.Sprint(l.CPUs), Max: fmt.Sprint(m.max.CPUs)}
	case l.Pids > m.max.Pids:
		return l, &LimitError{Name: "pids", Requested: fmt.Sprint(l.Pids), Max: fmt.Sprint(m.max.Pids)}
	case l.TmpSize > m.max.TmpSize:
		return l, &LimitError{Name: "tmp size", Requested: fmt.Sprint(l.TmpSize), Max: fmt.Sprint(m.max.TmpSize)}
	case l.Disk > m.max.Disk:
		return l, &LimitError{Name: "disk", Requested: fmt.Sprintf("%d MiB", l.Disk>>20), Max: fmt.Sprintf("%d MiB", m.max.Disk>>20)}
	case l.Files > m.max.Files:
		return l, &LimitError{Name: "files", Requested: fmt.Sprint(l.Files), Max: fmt.Sprint(m.max.Files)}
	}
	return l, l.DiskFits()
}

// Create returns a new session for opts.Owner: a pooled kernel when the
// request asks for nothing the pool's kernels lack, a cold one otherwise.
func (m *Manager) Create(ctx context.Context, opts CreateOptions) (_ *Managed, err error) {
	switch opts.Template {
	case "":
		opts.Template = m.opts.DefaultTemplate
	case NoTemplate:
		opts.Template = ""
	}
	var rd *snapshot.Reading
	if opts.Snapshot != "" {
		// Its blobs are read (and verified) while the session starts.
		t0 := time.Now()
		if rd, err = m.openSnapshot(ctx, opts.Owner, opts.Snapshot); err != nil {
			return nil, err
		}
		defer rd.Close()
		snapshotStage("open", t0)
	}
	t0 := time.Now()
	ms, err := m.create(ctx, opts)
	if err != nil {
		return nil, err
	}
	if rd != nil {
		snapshotStage("create", t0)
	}
	e := createdEvent(ms)
	if rd != nil {
		if err := m.fromSnapshot(ctx, ms, rd); err != nil {
			ms.Close()
			return nil, err
		}
		e.How, e.Snapshot, e.Restored = CreatedSnapshot, opts.Snapshot, ms.Restored()
	}
	if opts.forkOf == "" && !ms.events.begun() { // (sleepLost noted one lost as it was made)
		ms.note(e)
	}
	return ms, nil
}

// createdEvent is ms's EventCreated, as far as create knows: a session
// from a snapshot or a fork says so once it holds what it came from.
func createdEvent(ms *Managed) Event {
	e := Event{Type: EventCreated, How: CreatedNew, Template: ms.Template}
	switch {
	case ms.FromPool:
		e.How = CreatedPool
	case ms.Template != "":
		e.How = CreatedTemplate
	}
	return e
}

func (m *Manager) create(ctx context.Context, opts CreateOptions) (_ *Managed, err error) {
	tmpl, err := m.useTemplate(ctx, opts.Template)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tmpl.release()
		}
	}()
	limits, err := m.resolve(withTemplateDefaults(opts.Limits, tmpl))
	if err != nil {
		return nil, err
	}
	mode, err := checkpointMode(opts.Checkpoints, m.opts.Checkpoints)
	if err != nil {
		return nil, err
	}
	if opts.Network == "" && opts.Egress == nil {
		opts.Egress = m.opts.DefaultEgress
	}
	if opts.Network == "" {
		opts.Network = jail.NetworkNone
	}
	execTimeout := opts.ExecTimeout
	if execTimeout == 0 {
		execTimeout = m.opts.ExecTimeout
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if paused := m.pausedLocked() + m.hibernatedLocked(); len(m.sessions)-paused >= m.opts.MaxSessions {
		m.mu.Unlock()
		return nil, ErrCapacity
	}
	// Reserve the slot while the session starts.
	placeholder := &Managed{}
	key := "starting-" + newID()
	m.sessions[key] = placeholder
	deaths := len(m.keeperDeaths) // keepers dead before it began
	var pooled *Session
	var servedAt time.Time
	poolable := limits == m.defaults && len(opts.Env) == 0 && opts.Network == jail.NetworkNone && tmpl == nil && m.opts.PoolSize > 0 && opts.frozen == nil
	if poolable && len(m.pool) > 0 {
		pooled = m.pool[len(m.pool)-1]
		m.pool = m.pool[:len(m.pool)-1]
		servedAt = time.Now() // under m.mu, as a waiter's: Created orders all handouts
	}
	var waiter *poolWaiter
	if !m.opts.FixedPool && poolable {
		m.tookLocked(time.Now())
		if pooled == nil {
			waiter = m.enqueueLocked() // in line for the next pooled kernel
		}
	}
	m.mu.Unlock()
	switch {
	case waiter != nil:
		if pooled, servedAt, err = m.awaitPooled(ctx, waiter); err != nil {
			m.mu.Lock()
			delete(m.sessions, key)
			m.mu.Unlock()
			return nil, err
		}
	case pooled != nil && m.opts.FixedPool:
		time.AfterFunc(m.opts.RefillDelay, m.kick)
	case pooled != nil:
		m.kick()
	}

	s := pooled
	if s != nil {
		if err := s.Err(); err != nil || m.keeperDiedSince(s) { // died while waiting in the pool
			s.Close()
			s = nil
		} else {
			s.opts.ExecTimeout = execTimeout
			s.opts.Checkpoints = mode
			if !opts.Commands {
				go s.closeWarm() // a join made ahead, of no use here
			}
		}
	}
	if s != nil {
		if opts.Egress != nil {
			if err := s.ArmEgress(ctx, opts.Egress, m.opts.EgressLookup, m.opts.EgressCache); err != nil {
				m.log.Warn("pool: arming a pooled kernel's egress proxy failed; starting cold", "err", err)
				s.Close()
				s = nil
			}
		} else {
			s.DisarmEgress()
		}
	}
	if s == nil {
		o := m.sessionOptions(limits, opts.Env, opts.Network, opts.Egress, execTimeout)
		o.Checkpoints = mode
		o.Template = tmpl
		o.frozen = opts.frozen
		s, err = New(ctx, o)
	}
	m.mu.Lock()
	delete(m.sessions, key)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	if m.closed {
		m.mu.Unlock()
		s.Close()
		return nil, ErrClosed
	}
	// A session from the pool is created when it was handed its kernel
	// (under m.mu, at once or after waiting in line), so Created orders
	// them as they were served.
	now := time.Now()
	if s == pooled && !servedAt.IsZero() {
		now = servedAt
	}
	ms := &Managed{Session: s, Owner: opts.Owner, Created: now, Limits: limits, Network: opts.Network, Egress: opts.Egress,
		ExecTimeout: execTimeout, FromPool: pooled != nil && s == pooled, PortAccess: opts.PortAccess, Template: opts.Template, mgr: m, lastUsed: now}
	if m.opts.Records != "" && m.opts.Snapshots != nil {
		ms.durable = &durableState{}
	}
	s.woken = ms.wokeInUse
	m.recordEventsOf(ms)
	m.sessions[s.ID()] = ms
	// Its kernel was started in a keeper that died before it was
	// registered here: KeeperDied's sweep missed it (see there).
	lost := slices.Contains(m.keeperDeaths[deaths:], s.keeperPid.Load())
	m.mu.Unlock()
	m.saveRecord(ms)
	if lost {
		if err := m.sleepLost(ctx, ms); err != nil {
			m.log.Warn("keeper: a session created as its keeper died cannot come back", "session", s.ID(), "err", err)
		}
	} else {
		m.keep(ctx, ms)
	}
	m.log.Info("session created", "session", s.ID(), "pooled", ms.FromPool)
	return ms, nil
}

// keeperDeathsNow is how many keepers KeeperDied was told of so far.
func (m *Manager) keeperDeathsNow() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keeperDeaths)
}

// keeperDiedSince says whether the keeper that spawned pooled kernel s
// died after s's start began (its kernel then died with it, though s may
// not have seen it yet): only deaths since count, as a later keeper may
// reuse a dead one's pid.
func (m *Manager) keeperDiedSince(s *Session) bool {
	pid := s.keeperPid.Load()
	if pid == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.keeperDeaths[min(s.deathsBefore, len(m.keeperDeaths)):], pid)
}

// Get returns owner's session id.
func (m *Manager) Get(owner, id string) (*Managed, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms, ok := m.sessions[id]
	if !ok || ms.Session == nil || ms.Owner != owner {
		if x := m.ended.get(owner, id); x != nil {
			return nil, &closedError{id, x}
		}
		return nil, ErrNotFound
	}
	return ms, nil
}

// Lookup returns session id whoever owns it: for a face that checked a
// credential of the session's own (a port route's signed URL or port
// token), never for one that should check the owner (Get).
func (m *Manager) Lookup(id string) (*Managed, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms, ok := m.sessions[id]
	if !ok || ms.Session == nil {
		return nil, ErrNotFound
	}
	return ms, nil
}

// List returns owner's sessions, oldest first.
func (m *Manager) List(owner string) []*Managed {
	m.mu.Lock()
	var out []*Managed
	for _, ms := range m.sessions {
		if ms.Session != nil && ms.Owner == owner {
			out = append(out, ms)
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Delete closes owner's session id.
func (m *Manager) Delete(owner, id string) error { return m.DeleteFor(owner, id, "deleted") }

// DeleteFor is Delete, its close saying why (the reason of OnClose and of
// the session's closed event): a face that ends a session on its own
// terms (an E2B sandbox's timeout) says so.
func (m *Manager) DeleteFor(owner, id, reason string) error {
	m.mu.Lock()
	ms, ok := m.sessions[id]
	if !ok || ms.Session == nil || ms.Owner != owner {
		m.mu.Unlock()
		if x := m.ended.get(owner, id); x != nil {
			return &closedError{id, x} // (a second delete: when and why)
		}
		return ErrNotFound
	}
	m.letGoLocked(ms)
	m.closing.Add(1) // under mu: Close's Wait counts it
	m.mu.Unlock()
	return m.closeSession(ms, reason)
}

// closeSession closes ms (already forgotten by the manager), waiting at
// most CloseTimeout: a close that takes longer (a kernel that will not
// die, a client's stream that will not drain) goes on in the background,
// so one stuck session never holds up a delete, the reaper or shutdown.
// The caller has done m.closing.Add(1) under m.mu, in the same critical
// section that forgot ms: so a Close that races a Delete or a Reap waits
// for that close too, and never calls Wait while an Add from zero is due.
func (m *Manager) closeSession(ms *Managed, reason string) error {
	done := make(chan error, 1)
	go func() {
		defer m.closing.Done()
		if m.detaching.Load() {
			if ms.durable != nil {
				// Its record and snapshot stay for the next server,
				// which restores it if its kernel is gone.
				ms.Session.keepSnapshots.Store(true)
			}
			err := ms.Session.Detach() // kept for the next server
			m.closeEnded(ms)
			done <- err
			return
		}
		m.forget(ms)
		ms.Session.closeWhy.Store(&reason)
		err := ms.Session.Close()
		m.ended.add(ms.ID(), &ended{owner: ms.Owner, at: time.Now(), reason: reason, events: ms.Session.events.tail(closedTail)})
		m.closeEnded(ms)
		m.kick() // a slot is free: the pool may grow to its target
		m.log.Info("session closed", "session", ms.ID(), "reason", reason)
		if m.opts.OnClose != nil {
			m.opts.OnClose(ms.ID(), reason)
		}
		done <- err
	}()
	t := time.NewTimer(m.opts.CloseTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		m.log.Warn("session close is taking long: it goes on in the background", "session", ms.ID(), "reason", reason, "waited", m.opts.CloseTimeout)
		return nil
	}
}

// Stats are the manager's gauges.
type Stats struct {
	// Sessions are the sessions held, paused ones included.
	Sessions int
	// Paused are the paused ones among them: they use no CPU and take
	// no slot (MaxSessions caps Sessions - Paused).
	Paused int
	// Hibernated are the hibernated ones: on storage only, no slot.
	Hibernated int
	PoolReady  int
	// PoolTarget is how many kernels the pool keeps ready now, and
	// PoolReason why (the pool size, the arrival rate or the largest
	// burst remembered, and what capped it).
	PoolTarget int
	PoolReason string
	// Spares are the zygote's armed spares waiting for a fork (0 without
	// a zygote, or one that does not tell): with PoolReady, the sessions
	// that start without waiting for a fork.
	Spares int
	// Starting are creates under way (in line for a pooled kernel or
	// starting one): each holds a slot.
	Starting int
	// MaxSessions is the cap on running sessions (ManagerOptions.MaxSessions).
	MaxSessions int
}

// Busy is the sessions that take a slot: those held and not paused.
func (st Stats) Busy() int { return st.Sessions - st.Paused - st.Hibernated }

// Stats reports how many sessions are held (and paused) and how many
// kernels wait in the pool.
func (m *Manager) Stats() Stats {
	spares := 0
	if z, ok := m.opts.Zygote.(interface{ SparesReady() int }); ok {
		spares = z.SparesReady()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n, starting := 0, 0
	for _, ms := range m.sessions {
		if ms.Session != nil {
			n++
		} else {
			starting++
		}
	}
	t := m.poolTargetLocked(time.Now())
	return Stats{Sessions: n, Paused: m.pausedLocked(), Hibernated: m.hibernatedLocked(), PoolReady: len(m.pool),
		PoolTarget: t.N, PoolReason: t.Reason, Spares: spares, Starting: starting, MaxSessions: m.opts.MaxSessions}
}

// pausedLocked counts the paused sessions held (m.mu held).
func (m *Manager) pausedLocked() int {
	n := 0
	for _, ms := range m.sessions {
		if ms.Session != nil && ms.Session.paused.Load() && !ms.Session.hib.on.Load() {
			n++
		}
	}
	return n
}

// hibernatedLocked counts the hibernated sessions held (m.mu held): they
// take no slot.
func (m *Manager) hibernatedLocked() int {
	n := 0
	for _, ms := range m.sessions {
		if ms.Session != nil && ms.Session.hib.on.Load() {
			n++
		}
	}
	return n
}

// Close closes every session and pooled kernel and stops the background
// work. It waits for all of them to be gone.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	if m.peakSave != nil {
		defer m.savePeaks(true) // once the manager's lock is let go
	}
	for _, w := range m.fair.waiters {
		w.ch <- nil // they find the manager closed
	}
	m.fair.waiters = nil
	sessions := make([]*Managed, 0, len(m.sessions))
	for _, ms := range m.sessions {
		if ms.Session != nil {
			m.letGoLocked(ms)
			sessions = append(sessions, ms)
		}
	}
	m.sessions = map[string]*Managed{}
	m.closing.Add(len(sessions)) // one per closeSession below
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait() // no pooled kernel is being started after this
	m.mu.Lock()
	pool := m.pool
	m.pool = nil
	m.mu.Unlock()
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, ms := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.closeSession(ms, "shutdown"); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	for _, s := range pool {
		m.closing.Add(1)
		go func() { defer m.closing.Done(); s.Close() }()
	}
	wg.Wait()
	m.recordWrites.wait()
	// What is still closing in the background gets one more bound: Close
	// returns, and the process may exit, even if a kernel will not die
	// (its jail's init dies with this process: Pdeathsig).
	all := make(chan struct{})
	go func() { m.closing.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(m.opts.CloseTimeout):
		m.log.Warn("shutdown: some sessions are still closing; not waiting for them", "waited", m.opts.CloseTimeout)
	}
	return errors.Join(errs...)
}

func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// poolLoop keeps PoolSize kernels ready, one start at a time so refilling
// never starves executions of CPU.
func (m *Manager) poolLoop() {
	defer m.wg.Done()
	backoff := time.Duration(0)
	for {
		select {
		case <-m.stop:
			return
		case <-m.refill:
		}
		for {
			m.mu.Lock()
			need := !m.closed && len(m.pool) < m.opts.PoolSize
			m.mu.Unlock()
			if !need {
				break
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			o := m.sessionOptions(m.defaults, nil, jail.NetworkNone, nil, m.opts.ExecTimeout)
			o.EgressStandby = true // for a session in allow mode or in none mode
			deaths := m.keeperDeathsNow()
			s, err := New(ctx, o)
			cancel()
			if err == nil {
				s.deathsBefore = deaths
			}
			if err != nil {
				m.log.Error("pool: start kernel", "err", err)
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				select {
				case <-m.stop:
					return
				case <-time.After(backoff):
				}
				continue
			}
			backoff = 0
			m.mu.Lock()
			if m.closed {
				m.mu.Unlock()
				s.Close()
				return
			}
			m.pool = append(m.pool, s)
			m.mu.Unlock()
		}
	}
}

func (m *Manager) reapLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Reap(time.Now())
		}
	}
}

// Reap closes sessions older than MaxLifetime, paused and unused past
// PausedTimeout, or idle past IdleTimeout at time now (with IdleAction
// "pause", it pauses the idle ones instead, as long as fewer than
// MaxPaused are paused), and returns how many it closed.
func (m *Manager) Reap(now time.Time) int {
	var victims, toPause, toHibernate []*Managed
	var reasons []string
	m.mu.Lock()
	paused := m.pausedLocked()
	for id, ms := range m.sessions {
		if ms.Session == nil {
			continue
		}
		// Decided and marked in one critical section of ms.mu, as a call
		// on it marks it in use (Managed.use): a call that starts after
		// the verdict finds the session let go of, never one closed
		// under it.
		ms.mu.Lock()
		v, reason := m.reapVerdictLocked(ms, now, paused)
		if v == reapClose {
			ms.gone = true
			m.shutting[id] = ms
		}
		ms.mu.Unlock()
		switch v {
		case reapHibernate:
			toHibernate = append(toHibernate, ms)
		case reapPause:
			toPause = append(toPause, ms)
			paused++
		case reapClose:
			victims = append(victims, ms)
			reasons = append(reasons, reason)
			delete(m.sessions, id)
			m.closing.Add(1) // one per closeSession below
		}
	}
	m.mu.Unlock()
	m.hibernateIdle(toHibernate)
	for _, ms := range toPause {
		err := ms.Session.pause(fmt.Sprintf("idle for longer than the server's idle timeout (%s)", m.opts.IdleTimeout))
		switch {
		case err == nil:
			m.log.Info("session paused", "session", ms.ID(), "reason", "idle")
		case errors.Is(err, ErrBusy), errors.Is(err, ErrClosed):
			// In use again since, or gone: nothing to do.
		default:
			m.log.Warn("pausing an idle session failed: closing it", "session", ms.ID(), "err", err)
			m.mu.Lock()
			if m.sessions[ms.ID()] == ms {
				m.letGoLocked(ms)
				m.closing.Add(1)
				victims = append(victims, ms)
				reasons = append(reasons, "idle")
			}
			m.mu.Unlock()
		}
	}
	// In parallel: a slow close delays no other (each is bounded anyway).
	var wg sync.WaitGroup
	for i, ms := range victims {
		wg.Go(func() { _ = m.closeSession(ms, reasons[i]) })
	}
	wg.Wait()
	return len(victims)
}

// What the reaper does with a session.
type reapAction int

const (
	reapNone reapAction = iota
	reapClose
	reapPause
	reapHibernate
)

// reapVerdictLocked decides what Reap does with ms at now, paused sessions
// counted so far; ms.mu held. With reapClose, the reason of its close.
func (m *Manager) reapVerdictLocked(ms *Managed, now time.Time, paused int) (reapAction, string) {
	last, unused := ms.lastUsed, ms.busy == 0
	idle := unused && !ms.pinned
	isPaused := ms.Session.paused.Load()
	hib := m.opts.IdleHibernate
	switch {
	case m.opts.MaxLifetime > 0 && now.Sub(ms.Created) > m.opts.MaxLifetime:
		return reapClose, "expired"
	case ms.Session.hib.on.Load():
		if m.opts.PausedTimeout > 0 && unused && now.Sub(last) > m.opts.PausedTimeout {
			return reapClose, "idle"
		}
	case hib > 0 && m.opts.Snapshots != nil && (idle || isPaused && unused) && now.Sub(last) > hib && now.Sub(ms.hibFailed) > hib:
		// Idle, or paused (pinned ones too: an E2B sandbox's pause),
		// that long: to storage.
		return reapHibernate, ""
	case isPaused:
		if m.opts.PausedTimeout > 0 && idle && now.Sub(last) > m.opts.PausedTimeout {
			return reapClose, "idle"
		}
	case m.opts.IdleTimeout > 0 && idle && now.Sub(last) > m.opts.IdleTimeout:
		if m.opts.IdleAction == IdleActionPause && paused < m.opts.MaxPaused {
			return reapPause, ""
		}
		return reapClose, "idle"
	}
	return reapNone, ""
}
