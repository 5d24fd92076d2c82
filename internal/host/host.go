// Package host is one sandloop server: the sessions, their warm pool and
// zygote, the run history, the E2B and MCP faces and the HTTP API over them.
package host

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/e2b"
	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/webui"
	"github.com/sandloop/sandloop/internal/zygote"
)

// Config configures a Host. The zero value serves cold sessions without
// tokens, run history, E2B or MCP.
type Config struct {
	// Tokens are the accepted bearer tokens. If empty, none is asked
	// (the caller checks that the listener is loopback: server.CheckBind).
	Tokens []string
	// AllowedHosts are extra Host header values accepted (DNS rebinding).
	AllowedHosts []string
	// PreviewFor is how long an app run's session is kept after the run
	// for the previews of the servers its agent left listening. If zero,
	// runs.DefaultPreviewFor.
	PreviewFor time.Duration
	// GatewaySecret, if set, makes this a cell's host (server.Options).
	GatewaySecret string
	// Register, if set, keeps this host's row in the cell's PostgreSQL
	// (Database) while it serves, renewed every Heartbeat (if zero, 2s).
	Register  *gateway.Target
	Heartbeat time.Duration

	// PoolSize, MaxSessions, IdleTimeout, MaxLifetime, ExecTimeout,
	// Defaults and Max are the session manager's (session.ManagerOptions).
	PoolSize, MaxSessions                 int
	IdleTimeout, MaxLifetime, ExecTimeout time.Duration
	// IdleAction is what becomes of a session idle past IdleTimeout:
	// "close" (also "") or "pause" (session.ManagerOptions.IdleAction).
	IdleAction    string
	Defaults, Max jail.Limits
	// Checkpoints ("off" or "auto"), AutoCheckpoints, MaxCheckpoints and
	// CheckpointMemory are the session manager's checkpoint options
	// (session.ManagerOptions; zero values take its defaults).
	Checkpoints                     string
	AutoCheckpoints, MaxCheckpoints int
	CheckpointMemory                int64
	// SnapshotStore is where durable snapshots go: a directory, or
	// s3://HOST/BUCKET[/PREFIX] (snapshot.OpenBackend); "off" for none.
	// If empty, DataDir/snapshots (none without a DataDir).
	SnapshotStore string
	// SnapshotQuota caps the stored bytes of one owner's snapshots (zero:
	// none); SnapshotTTL deletes snapshots older than it (zero: kept);
	// SnapshotsPerSession keeps the newest this many of one session
	// (zero: all). Hibernated sessions' snapshots are left alone.
	SnapshotQuota       int64
	SnapshotTTL         time.Duration
	SnapshotsPerSession int
	// IdleHibernate hibernates sessions idle (or paused) this long
	// (session.ManagerOptions.IdleHibernate); zero: never.
	IdleHibernate time.Duration
	// SnapshotEvery writes an automatic snapshot of a session used since
	// its last one at most this often (session.ManagerOptions.
	// SnapshotEvery), so that a session whose processes are lost (its
	// keeper or this server killed) comes back from it at the next start.
	// If zero, 30 seconds with KeepSessions and never otherwise; negative,
	// never. It needs a snapshot store and a DataDir.
	SnapshotEvery time.Duration
	// AllowNetwork lets sessions ask for the host's whole network.
	AllowNetwork bool
	// Egress configures allow mode. New adds the listener's address to
	// Egress.Policy.Deny.
	Egress server.EgressOptions
	// WheelCache, if set, is the package cache of allow-mode sessions.
	// It holds no process or file open, so the caller keeps it.
	WheelCache *egress.Cache
	// Zygote is "on" (fail where the host cannot run one), "auto" (cold
	// sessions there) or "off". If empty, off.
	Zygote string
	// SpareMemory is the memory the kernels kept ready ahead of requests
	// may hold together when demand grows them past PoolSize: the warm
	// pool (session.ManagerOptions.PoolMemory) and the zygote's spares
	// (zygote.Options.MaxSpares: up to 16, at most half of it), at
	// session.ForkedKernelMemory each (ColdKernelMemory without a zygote).
	// If zero, session.DefaultPoolMemory (an eighth of MemAvailable at
	// start).
	SpareMemory int64
	// OldPipeline selects the session pipeline before issue 26 (a fixed
	// refill delay, one spare, one pooled kernel started at a time), so a
	// benchmark can print its figures beside the current ones.
	OldPipeline bool
	// ColdCommands: E2B commands join their sandbox's jail when they come,
	// none made ahead (e2b.Options.ColdCommands; so does OldPipeline):
	// for benchmarks' baselines. E2BCommandTrace, if set, receives E2B
	// commands' stages (e2b.Options.CommandTrace).
	ColdCommands    bool
	E2BCommandTrace io.Writer
	// TemplatesDir is where templates are (package template). If empty,
	// DataDir/templates; if both are empty, the host has none.
	// WarmTemplates are started (each its zygote) before New returns;
	// MaxWarmTemplates bounds the templates' zygotes (template.PoolOptions.MaxWarm).
	TemplatesDir     string
	WarmTemplates    []string
	MaxWarmTemplates int
	// DefaultTemplate is the template of sessions that name none (its
	// zygote is started with WarmTemplates'). It must exist.
	DefaultTemplate string

	// KeepSessions starts (or joins) the keeper of DataDir/keeper
	// (package keeper), which holds the sessions' jails: they survive
	// this process (kill -9 included), New takes over those a server
	// before it left there, and Close lets go of them rather than closing
	// them. Sessions then start cold (no zygote). KeeperExe is the program
	// the keeper runs (this binary: os.Executable if empty). Needs DataDir
	// and root (workspaces are host directories).
	KeepSessions bool
	KeeperExe    string

	// Database is the run history: a postgres:// URL or a SQLite file.
	// If empty, runs.db in DataDir; if both are empty, no history: runs
	// and lessons answer 501.
	Database, DataDir string
	// Model is the model of runs that name none (PROVIDER/MODEL; if empty,
	// llm.Resolve's choice); PricesFile overrides the price table.
	Model, PricesFile string

	// E2B serves E2B's API too, with a key per token (e2b.KeysForTokens).
	E2B bool
	// MCP, if set, builds the handler served at /mcp over the host's
	// manager; if it is an io.Closer, Close closes it before the HTTP
	// server shuts down (it holds event streams open).
	MCP func(*session.Manager) (http.Handler, error)

	// MaxBodyBytes, MaxFileBytes, MaxRunBodyBytes and Keepalive are the
	// HTTP API's (server.Options).
	MaxBodyBytes, MaxFileBytes, MaxRunBodyBytes int64
	Keepalive                                   time.Duration
	// Logger receives the host's logs. If nil, they are discarded.
	Logger *slog.Logger
}

// ArgumentError is a Config the host cannot serve with: Name is the
// field (as the CLI's flag, without dashes).
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// DefaultSnapshotEvery is Config.SnapshotEvery's default with KeepSessions.
const DefaultSnapshotEvery = 30 * time.Second

// Host is a running sandloop server. Its parts are built by New and
// stopped, in order, by Close.
type Host struct {
	cfg    Config
	log    *slog.Logger
	ln     net.Listener
	epoch  string
	zy     *zygote.Zygote
	tmpl   *template.Pool // nil: no templates
	mgr    *session.Manager
	st     store.History
	runs   *runs.Service
	e2b    *e2b.Handler
	e2bKey string
	mounts map[string]http.Handler
	srv    *server.Server
	hs     *http.Server

	mu       sync.Mutex
	served   chan struct{} // closed when hs.Serve has returned; nil before Serve
	serveErr error
	stopBeat func()
	keeper   *keeperLink // with KeepSessions
	// records is where the sessions' records are kept (durable sessions:
	// with KeepSessions, SnapshotEvery or IdleHibernate), "" for none.
	// Without a keeper, shutdown hibernates them for the next server.
	records string
	// cellPG is the cell's database once opened (cell): snapshots
	// written before are not recorded there.
	cellPG    atomic.Pointer[store.Postgres]
	closeOnce sync.Once
	closeErr  error
}

// New builds a host that will serve on ln (see Serve). Sandboxes never
// reach ln through their egress proxy. Close releases what New built,
// ln included; if New fails, it has released it all but ln.
func New(ctx context.Context, ln net.Listener, cfg *Config) (_ *Host, err error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if err := session.CheckIdleAction(cfg.IdleAction); err != nil {
		return nil, err
	}
	h := &Host{cfg: *cfg, log: cfg.Logger, ln: ln, epoch: newEpoch(), mounts: map[string]http.Handler{}}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()

	// Sandboxes never reach this server through their proxy, even where
	// an allowlist opens loopback: the listener's address, and its port
	// on any address, are denied before the first sandbox starts.
	eg := h.cfg.Egress
	eg.Policy.Deny = slices.Clone(eg.Policy.Deny)
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		eg.Policy.Deny = append(eg.Policy.Deny, ap, netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port()))
	}
	h.cfg.Egress = eg

	if h.cfg.KeepSessions {
		if h.keeper, err = openKeeper(&h.cfg); err != nil {
			return nil, err
		}
		undo = append(undo, func() { h.keeper.close() })
		h.cfg.Zygote = "off" // a zygote's forks would die with this process
	}
	spareMem := h.cfg.SpareMemory
	if spareMem == 0 {
		spareMem = session.DefaultPoolMemory()
	}
	// The zygote's spares take their share first (at most half, up to
	// its default 16), the pool the rest.
	maxSpares := int(min(16, spareMem/2/session.ForkedKernelMemory))
	if h.zy, err = startZygote(ctx, h.cfg.Zygote, h.log, h.cfg.OldPipeline, max(maxSpares, 1)); err != nil {
		return nil, err
	}
	poolMem := spareMem
	if h.zy != nil {
		poolMem -= int64(maxSpares) * session.ForkedKernelMemory
	}
	var zy session.Zygote
	if h.zy != nil {
		zy = h.zy
		undo = append(undo, func() { h.zy.Close() })
	}
	if err := h.openTemplates(ctx); err != nil {
		return nil, err
	}
	if h.tmpl != nil {
		undo = append(undo, h.tmpl.Close)
	}
	snaps, err := h.openSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	every := h.cfg.SnapshotEvery
	if every == 0 && h.cfg.KeepSessions {
		every = DefaultSnapshotEvery
	}
	if every > 0 && snaps == nil {
		return nil, &ArgumentError{"snapshot-every", errors.New("needs a snapshot store (--data-dir or --snapshot-store)")}
	}
	if every > 0 && h.cfg.DataDir == "" {
		return nil, &ArgumentError{"snapshot-every", errors.New("needs a data directory (--data-dir) for the sessions' records")}
	}
	var records string
	if snaps != nil && h.cfg.DataDir != "" && (h.cfg.KeepSessions || every > 0 || h.cfg.IdleHibernate > 0) {
		records = filepath.Join(h.cfg.DataDir, "session-records")
	}
	h.records = records
	mo := &session.ManagerOptions{
		Records: records, SnapshotEvery: max(every, 0),
		Snapshots: snaps, IdleHibernate: h.cfg.IdleHibernate,
		PoolSize: h.cfg.PoolSize, MaxSessions: h.cfg.MaxSessions, IdleTimeout: h.cfg.IdleTimeout, IdleAction: h.cfg.IdleAction,
		MaxLifetime: h.cfg.MaxLifetime, ExecTimeout: h.cfg.ExecTimeout, Defaults: h.cfg.Defaults, Max: h.cfg.Max,
		DefaultEgress: eg.DefaultPolicy(), EgressCache: h.cfg.WheelCache, Logger: h.log, Zygote: zy,
		FixedPool: h.cfg.OldPipeline, PoolMemory: max(poolMem, 1), PoolPeakFile: h.poolPeakFile(),
		// E2B's sandboxes run commands: pooled kernels make a join ahead
		// while sandboxes have started commands lately (CommandsRecent).
		PrepareCommands: h.cfg.E2B && !h.cfg.ColdCommands && !h.cfg.OldPipeline,
		Checkpoints:     h.cfg.Checkpoints, AutoCheckpoints: h.cfg.AutoCheckpoints, MaxCheckpoints: h.cfg.MaxCheckpoints,
		CheckpointMemory: h.cfg.CheckpointMemory,
		OnSnapshot:       h.recordSnapshot,
	}
	if h.tmpl != nil {
		mo.Templates = h.tmpl
		mo.DefaultTemplate = h.cfg.DefaultTemplate
	}
	var kept []session.KeptRecord
	if h.keeper != nil {
		mo.Keeper = h.keeper
		kept = h.keptSessions(records) // before the manager's pool makes workspaces
	}
	h.mgr = session.NewManager(mo)
	if h.keeper != nil {
		h.reattach(ctx, kept)
		h.keeper.onDeath(h.keeperDied)
	}
	if n, err := h.mgr.Restore(ctx); n > 0 || err != nil {
		h.log.Info("sessions restored from their snapshots: each wakes at its first use", "sessions", n)
		if err != nil {
			h.log.Warn("some sessions could not be restored (their records are kept)", "err", err)
		}
	}

	undo = append(undo, func() { h.mgr.Close() })
	if h.cfg.MCP != nil {
		m, err := h.cfg.MCP(h.mgr)
		if err != nil {
			return nil, err
		}
		h.mounts["/mcp"] = m
		undo = append(undo, h.closeMounts)
	}

	var ls store.LessonStore
	if h.cfg.Database != "" || h.cfg.DataDir != "" {
		if h.st, err = openStore(ctx, h.cfg.Database, h.cfg.DataDir); err != nil {
			return nil, err
		}
		undo = append(undo, func() { h.st.Close() })
		if ls, _ = h.st.(store.LessonStore); ls == nil {
			h.log.Info("this run history keeps no lessons: runs go without")
		}
		model, prices := h.cfg.Model, h.cfg.PricesFile
		h.runs = runs.New(&runs.Options{
			Store: h.st, Lessons: ls, Logger: h.log, NewSession: runs.ManagerSessions(h.mgr),
			// An app run's servers open after it, under this host's own
			// loopback name (h.srv is made below, before any run starts).
			PreviewURL: func(id string, port int, exp time.Time) string {
				_, p, _ := net.SplitHostPort(h.ln.Addr().String())
				return h.srv.PreviewURL("localhost:"+p, id, port, exp)
			},
			PreviewFor: h.cfg.PreviewFor,
			Cell:       h.cell(),
			Provider: func(ctx context.Context, m string) (llm.Provider, error) {
				return llm.Resolve(ctx, llm.Config{Model: cmp.Or(m, model), PricesFile: prices})
			},
		})

		undo = append(undo, h.runs.Close)
	}
	if pg, ok := h.cell().(*store.Postgres); ok {
		h.cellPG.Store(pg)
	}
	pg, _ := h.st.(*store.Postgres)
	if h.cfg.Register != nil && pg == nil {
		return nil, &ArgumentError{"register", errors.New("needs the cell's PostgreSQL (database postgres://...)")}
	}

	// The page and its assets hold no data; the page sends the token with every API call.
	public := webui.Mounts()
	if h.cfg.E2B {
		keys, first := e2b.KeysForTokens(h.cfg.Tokens, server.OwnerOf)
		// E2B's sandboxes are open unless told otherwise: here, open is
		// what a session that asks for nothing may reach.
		network := e2b.NetworkOptions{Policy: eg.Policy, Max: eg.Max}
		if eg.DefaultMode == egress.ModeAllow {
			network.Default = eg.Default
		}
		eo := &e2b.Options{Manager: h.mgr, Keys: keys, Zygote: zy, MaxTimeout: max(h.cfg.MaxLifetime, 0), Network: network, Logger: h.log,
			ColdCommands: h.cfg.ColdCommands || h.cfg.OldPipeline, CommandTrace: h.cfg.E2BCommandTrace}
		if h.keeper != nil || h.shelves() {
			// The keeper keeps the sandboxes' sessions, or shutdown puts
			// them to sleep on their snapshots (Close); these records
			// what E2B adds (tokens, metadata, time to live), for the
			// next server.
			eo.StateDir = filepath.Join(h.cfg.DataDir, "e2b")
		}
		if h.tmpl != nil {
			eo.HasTemplate = h.tmpl.Has
			eo.BuildTemplate = h.templateBuilder(eg)
		}
		if h.e2b, err = e2b.New(eo); err != nil {
			return nil, err
		}
		undo = append(undo, func() { h.e2b.Close() })
		h.e2bKey = first
		for p, m := range h.e2b.Mounts() {
			public[p] = m // authenticated by the E2B handler itself
		}
	}
	so := server.Options{
		GatewaySecret: h.cfg.GatewaySecret, Epoch: h.epoch,
		Manager: h.mgr, Tokens: h.cfg.Tokens, AllowedHosts: h.cfg.AllowedHosts, AllowNetwork: h.cfg.AllowNetwork,
		Egress: eg, Logger: h.log, Mounts: h.mounts, PublicMounts: public, Runs: h.runs, Store: h.st, Lessons: ls,
		MaxBodyBytes: h.cfg.MaxBodyBytes, MaxFileBytes: h.cfg.MaxFileBytes, MaxRunBodyBytes: h.cfg.MaxRunBodyBytes,
		Keepalive: h.cfg.Keepalive, Templates: h.tmpl,
	}
	if h.e2b != nil {
		so.Dispatch = h.e2b.Dispatch
	}
	if h.records != "" {
		// Sessions outlive this server (a keeper, records): their web UI
		// notebooks too.
		so.NotebookDir = filepath.Join(h.cfg.DataDir, "notebooks")
	}
	if h.srv, err = server.New(&so); err != nil {
		return nil, err
	}
	h.hs = &http.Server{Handler: announceKeepAlive(h.srv), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: IdleKeep + 5*time.Second}
	return h, nil
}

// IdleKeep is how long the server keeps a client's idle HTTP/1.1
// connection open between requests, as every response says in its
// Keep-Alive header (timeout=120). Without the header Node's HTTP client
// (undici: fetch, and E2B's JS SDK) closes an idle connection after 4 s
// of its own, so an agent framework's burst sent more than 4 s after the
// previous one paid a new connection per request: ~200 for a burst of 100
// sandboxes through E2B's SDK, ~0.5 ms of the client's CPU each (undici's
// connect and client set-up), about a fifth of what the client spends on
// the burst (BenchmarkE2BBurst100, docs/benchmarks.md). The server closes
// a connection idle 5 s longer than it says (undici closes its side 2 s
// before), so it is the client that closes, between requests.
const IdleKeep = 2 * time.Minute

// announceKeepAlive sets the Keep-Alive header of IdleKeep on next's
// HTTP/1 responses (HTTP/2 forbids the header and needs it not).
func announceKeepAlive(next http.Handler) http.Handler {
	v := "timeout=" + strconv.Itoa(int(IdleKeep/time.Second))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 {
			w.Header().Set("Keep-Alive", v)
		}
		next.ServeHTTP(w, r)
	})
}

// cell is the cell's sessions table where this host's runs record the
// sessions they keep for previews (runs.Options.Cell): the run history's
// PostgreSQL, on a cell's host (one with a gateway secret); nil otherwise.
func (h *Host) cell() runs.Placements {
	if pg, ok := h.st.(*store.Postgres); ok && h.cfg.GatewaySecret != "" {
		return pg
	}
	return nil
}

// recordSnapshot records in the cell's sessions table the snapshot just
// written of a session as its latest: a gateway restores the session
// from it if this host is lost. Sessions not in the table (this host's
// runs' sandboxes) are left alone.
func (h *Host) recordSnapshot(session, snap string) {
	pg := h.cellPG.Load()
	if pg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pg.SetSnapshot(ctx, session, snap); err != nil && !errors.Is(err, store.ErrNotFound) {
		h.log.Warn("record a session's snapshot in the cell", "session", session, "snapshot", snap, "err", err)
	}
}

// openSnapshots opens the snapshot store the config names (nil: none).
func (h *Host) openSnapshots(ctx context.Context) (*snapshot.Store, error) {
	spec := h.cfg.SnapshotStore
	switch {
	case spec == "off":
		return nil, nil
	case spec == "" && h.cfg.DataDir == "":
		if h.cfg.IdleHibernate > 0 {
			return nil, &ArgumentError{"idle-hibernate", errors.New("needs a snapshot store (--data-dir or --snapshot-store)")}
		}
		return nil, nil
	case spec == "":
		spec = filepath.Join(h.cfg.DataDir, "snapshots")
	}
	b, err := snapshot.OpenBackend(ctx, spec)
	if err != nil {
		return nil, &ArgumentError{"snapshot-store", err}
	}
	st, err := snapshot.New(b, &snapshot.Options{Quota: h.cfg.SnapshotQuota, MaxAge: h.cfg.SnapshotTTL, MaxPerSession: h.cfg.SnapshotsPerSession, Logger: h.log})
	if err != nil {
		return nil, &ArgumentError{"snapshot-quota", err}
	}
	return st, nil
}

// openStore opens the run history database names, else runs.db in dataDir.
func openStore(ctx context.Context, database, dataDir string) (store.History, error) {
	if database != "" {
		return store.OpenHistory(ctx, database, nil)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, &ArgumentError{"data-dir", err}
	}
	return store.Open(ctx, filepath.Join(dataDir, "runs.db"), nil)
}

// URL is the host's base URL, http://ADDR.
func (h *Host) URL() string { return "http://" + h.ln.Addr().String() }

// E2BKey is an API key E2B's SDKs can use ("" without Config.E2B).
func (h *Host) E2BKey() string { return h.e2bKey }

// Manager is the host's session manager.
func (h *Host) Manager() *session.Manager { return h.mgr }

// Serve answers requests on the listener until ctx is done, and keeps
// the host's registration (Config.Register) renewed. It returns nil when
// ctx is done, with the listener still served (so Drain can let the open
// sessions finish), or the listener's error. Close stops serving.
func (h *Host) Serve(ctx context.Context) error {
	h.mu.Lock()
	if h.served != nil {
		h.mu.Unlock()
		return errors.New("host: Serve called twice")
	}
	served := make(chan struct{})
	h.served = served
	h.mu.Unlock()
	go func() {
		defer close(served)
		err := h.hs.Serve(h.ln)
		h.mu.Lock()
		h.serveErr = err
		h.mu.Unlock()
	}()
	if r := h.cfg.Register; r != nil {
		h.startHeartbeat(*r)
	}
	select {
	case <-served:
		h.mu.Lock()
		defer h.mu.Unlock()
		if errors.Is(h.serveErr, http.ErrServerClosed) {
			return nil
		}
		return h.serveErr
	case <-ctx.Done():
		return nil
	}
}

// startHeartbeat renews the registration (not ready once draining) until
// Close, which removes it.
func (h *Host) startHeartbeat(self gateway.Target) {
	pg := h.st.(*store.Postgres) // checked by New
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gateway.Register(ctx, pg, cmp.Or(h.cfg.Heartbeat, 2*time.Second), func() store.Registration {
			st := h.mgr.Stats()
			var templates []string
			if h.tmpl != nil {
				if ts, err := h.tmpl.Store().List(); err == nil {
					for _, t := range ts {
						templates = append(templates, t.Name)
					}
				}
			}
			return store.Registration{Name: self.Name, URL: self.URL, Epoch: h.epoch, Ready: !h.srv.Draining(),
				Slots: st.MaxSessions, Used: st.Busy(), Templates: templates}
		}, h.log)
	}()
	h.mu.Lock()
	h.stopBeat = func() { cancel(); <-done }
	h.mu.Unlock()
}

// Drain takes no new sessions (readiness false) and waits until the open
// ones have ended (deleted, reaped or idle-closed), d has passed or ctx
// is done.
func (h *Host) Drain(ctx context.Context, d time.Duration) {
	h.srv.Drain()
	h.log.Info("draining: no new sessions", "open", h.mgr.Stats().Sessions, "timeout", d)
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for h.mgr.Stats().Sessions > 0 {
		select {
		case <-deadline.C:
			h.log.Warn("drain timeout: closing the sessions left", "open", h.mgr.Stats().Sessions)
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	h.log.Info("drained")
}

// Close stops the host in order: the registration first (gateways place
// nothing more here), the MCP streams, then the HTTP server's listener
// (in-flight requests get 10s, while E2B's sandboxes, the runs and every
// session are closed: left to the keeper with one, put to sleep on their
// snapshots with records), the history and the zygote. It returns the
// manager's error.
func (h *Host) Close() error {
	h.closeOnce.Do(func() {
		h.mu.Lock()
		stopBeat, served := h.stopBeat, h.served
		h.mu.Unlock()
		if stopBeat != nil {
			stopBeat()
		}
		switch {
		case h.keeper != nil:
			h.log.Info("shutting down: the sessions stay in the keeper for the next server")
		case h.shelves():
			h.log.Info("shutting down: each session goes to sleep on a snapshot; the next server on this data directory wakes it at its next use")
		case h.records == "" && h.mgr.Stats().Sessions > 0 && h.cfg.GatewaySecret == "":
			h.log.Info("shutting down: closing every session, its files with it (with --snapshot-every, sessions sleep on snapshots across a restart instead)", "sessions", h.mgr.Stats().Sessions)
		default:
			h.log.Info("shutting down: closing every session")
		}
		h.closeMounts()
		// No new connections from here on, and the sessions are killed
		// while Shutdown waits for the requests in flight: the streams of
		// clients waiting on them (a command's output, a cell's events)
		// end, so nothing waits on a user process or a client for long.
		shut := make(chan struct{})
		if served == nil {
			h.ln.Close()
			close(shut)
		} else {
			go func() {
				defer close(shut)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := h.hs.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
					h.log.Warn("shutdown", "err", err)
				}
				h.hs.Close() // what is left after the deadline
				<-served
			}()
		}
		if h.e2b != nil && (h.keeper != nil && h.keeper.alive() || h.shelves()) {
			h.e2b.Detach() // the sandboxes' sessions stay, in the keeper or asleep
		} else if h.e2b != nil {
			h.e2b.Close() // before the manager closes the sessions
		}
		if h.runs != nil {
			h.runs.Close()
		}
		switch {
		case h.keeper != nil:
			// Kept for the next server (an upgrade): not closed. Those
			// whose keeper died are left to their records and snapshots:
			// the next server restores them.
			h.closeErr = h.mgr.Detach()
		case h.shelves():
			// Durable sessions without a keeper: hibernated, so that a
			// restart loses nothing of them (their files and variables).
			var n int
			n, h.closeErr = h.mgr.Shelve(context.Background())
			h.log.Info("shutdown: sessions asleep on their snapshots, for the next server", "sessions", n)
		default:
			h.closeErr = h.mgr.Close()
		}
		if h.keeper != nil {
			h.keeper.close()
		}
		<-shut
		if h.st != nil {
			if err := h.st.Close(); err != nil {
				h.log.Warn("close the run history", "err", err)
			}
		}
		if h.zy != nil {
			h.zy.Close() // after the manager has closed its sessions
		}
		if h.tmpl != nil {
			h.tmpl.Close()
		}
	})
	return h.closeErr
}

// poolPeakFile is where the pool keeps the bursts it remembers for the
// next server on the same data directory (session.ManagerOptions
// PoolPeakFile); none without one.
func (h *Host) poolPeakFile() string {
	if h.cfg.DataDir == "" {
		return ""
	}
	return filepath.Join(h.cfg.DataDir, "pool-peaks.json")
}

// shelves says whether shutdown puts the sessions to sleep on snapshots
// for the next server on the same data directory (Manager.Shelve): they
// are durable, no keeper holds them, and this is no cell's host (a
// gateway restores a host's sessions elsewhere, from their latest
// snapshots, once the host's process is gone: the next one's epoch is
// new).
func (h *Host) shelves() bool {
	return h.keeper == nil && h.records != "" && h.cfg.GatewaySecret == ""
}

// closeMounts closes the mounted handlers that hold connections open
// (MCP event streams), so Shutdown does not wait on them.
func (h *Host) closeMounts() {
	for _, m := range h.mounts {
		if c, ok := m.(io.Closer); ok {
			c.Close()
		}
	}
}

// newEpoch names this process's life as a host.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StartZygote starts the zygote mode asks for ("on", "auto"; "" or "off"
// for none). It returns nil, and sessions start cold, for none, or for
// "auto" on a host that cannot run one (logged in one line with the
// reason); for "on" there, an *ArgumentError.
func StartZygote(ctx context.Context, mode string, log *slog.Logger) (*zygote.Zygote, error) {
	return startZygote(ctx, mode, log, false, 0)
}

// startZygote is StartZygote, with the pipeline before issue 26 if old,
// keeping at most maxSpares spares (zygote's default if zero).
func startZygote(ctx context.Context, mode string, log *slog.Logger, old bool, maxSpares int) (*zygote.Zygote, error) {
	if mode == "" || mode == "off" {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	err := zygote.Supported()
	if err == nil {
		var z *zygote.Zygote
		if z, err = zygote.New(ctx, &zygote.Options{Env: session.KernelEnv(), Logger: log, Fixed: old, MaxSpares: maxSpares}); err == nil {
			return z, nil
		}
		err = fmt.Errorf("the zygote did not start: %w", err)
	}
	if mode == "on" {
		return nil, &ArgumentError{"zygote", fmt.Errorf("cannot work on this host: %s", UnsupportedReason(err))}
	}
	log.Warn(fmt.Sprintf("sessions start cold: %s (--zygote=off silences this)", UnsupportedReason(err)))
	return nil, nil
}

// UnsupportedReason is err's text without jail.ErrUnsupported's own
// words, which the reason after them says better.
func UnsupportedReason(err error) string {
	return strings.Replace(err.Error(), jail.ErrUnsupported.Error()+": ", "", 1)
}
