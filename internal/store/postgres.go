package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is the run history (and, in a cell, the hosts and sessions
// tables) in a PostgreSQL database shared by every host and gateway. It
// is safe for concurrent use by many processes: writes to one run lock
// that run's row, so events and steps are numbered without gaps however
// many writers there are.
type Postgres struct {
	pool *pgxpool.Pool
	url  string
	log  *slog.Logger
	now  func() time.Time
}

// OpenPostgres connects to the database at url (postgres://...) and
// brings its schema up to date. opts may be nil; of it only Logger and
// Now are used.
func OpenPostgres(ctx context.Context, url string, opts *Options) (*Postgres, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password included: say only what is wrong.
		return nil, fmt.Errorf("--database: not a valid PostgreSQL URL (postgres://USER:PASSWORD@HOST:PORT/DB)")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	p := &Postgres{pool: pool, url: url, log: o.Logger, now: o.Now}
	if err := p.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return p, nil
}

// Close closes the connections. Calls after Close fail.
func (p *Postgres) Close() error {
	p.pool.Close()
	return nil
}

// pgMigrations are applied in order, each once; the table
// sandloop_schema records how many have been. Never edit one that has
// shipped: append a new one. Times are Unix milliseconds, as in SQLite.
var pgMigrations = []string{
	// 1: the run history (the SQLite schema's migrations 1 and 2).
	`
CREATE TABLE runs (
	id         TEXT PRIMARY KEY,
	created_at BIGINT NOT NULL,
	updated_at BIGINT NOT NULL,
	task       TEXT NOT NULL,
	mode       TEXT NOT NULL,
	model      TEXT NOT NULL,
	status     TEXT NOT NULL,
	steps      INTEGER NOT NULL DEFAULT 0,
	tokens_in  BIGINT NOT NULL DEFAULT 0,
	tokens_out BIGINT NOT NULL DEFAULT 0,
	cost_usd   DOUBLE PRECISION NOT NULL DEFAULT 0,
	summary    TEXT NOT NULL DEFAULT '',
	error      TEXT NOT NULL DEFAULT '',
	report     JSON,
	owner      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_by_created ON runs (created_at DESC, id);
CREATE INDEX runs_by_status ON runs (status, created_at DESC);
CREATE INDEX runs_by_owner ON runs (owner, created_at DESC);

CREATE TABLE steps (
	run_id     TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	idx        INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	name       TEXT NOT NULL DEFAULT '',
	data       JSON,
	tokens_in  BIGINT NOT NULL DEFAULT 0,
	tokens_out BIGINT NOT NULL DEFAULT 0,
	cost_usd   DOUBLE PRECISION NOT NULL DEFAULT 0,
	started_at BIGINT NOT NULL,
	ended_at   BIGINT NOT NULL,
	PRIMARY KEY (run_id, idx)
);

CREATE TABLE events (
	run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	seq    BIGINT NOT NULL,
	at     BIGINT NOT NULL,
	type   TEXT NOT NULL,
	data   JSON,
	PRIMARY KEY (run_id, seq)
);

CREATE TABLE artifacts (
	run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	path   TEXT NOT NULL,
	mode   INTEGER NOT NULL,
	size   BIGINT NOT NULL,
	data   BYTEA NOT NULL,
	PRIMARY KEY (run_id, path)
);
`,
	// 2: a cell's hosts as the gateways last saw them, and where each
	// session (or run, or MCP session) lives: host and the host's epoch
	// (one per host process) when it was placed. lost is set once that
	// epoch has ended; such sessions answer 410 Gone.
	`
CREATE TABLE hosts (
	name       TEXT PRIMARY KEY,
	url        TEXT NOT NULL,
	epoch      TEXT NOT NULL,
	ready      BOOLEAN NOT NULL,
	slots      INTEGER NOT NULL,
	used       INTEGER NOT NULL,
	seen_at    BIGINT NOT NULL
);

CREATE TABLE sessions (
	id         TEXT PRIMARY KEY,
	kind       TEXT NOT NULL,
	owner      TEXT NOT NULL,
	host       TEXT NOT NULL,
	epoch      TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	lost       BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX sessions_by_host ON sessions (host, epoch) WHERE NOT lost;
`,
	// 3: lessons (postgres_lessons.go).
	pgLessonsSchema,
	// 4: hosts that register themselves (cluster.go's Heartbeat), for
	// cells without Kubernetes or a static list; when each session was
	// marked lost, so old rows can be pruned.
	`
CREATE TABLE host_heartbeats (
	name    TEXT PRIMARY KEY,
	url     TEXT NOT NULL,
	epoch   TEXT NOT NULL,
	ready   BOOLEAN NOT NULL,
	slots   INTEGER NOT NULL,
	used    INTEGER NOT NULL,
	beat_at BIGINT NOT NULL
);
ALTER TABLE sessions ADD COLUMN lost_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sessions_by_lost_at ON sessions (lost_at) WHERE lost;
`,
	// 5: whether a run's cost leaves out model calls without a price (SQLite's 4).
	`ALTER TABLE runs ADD COLUMN cost_unknown INTEGER NOT NULL DEFAULT 0;`,
	// 6: the templates a registered host has (comma-separated names), so
	// that gateways place a session naming one on a host that has it.
	`ALTER TABLE host_heartbeats ADD COLUMN templates TEXT NOT NULL DEFAULT '';`,
	// 7: a session's latest durable snapshot (in the cell's shared
	// snapshot store), from which a gateway restores it if its host is
	// lost; and the session it was restored as, where its old id leads.
	`
ALTER TABLE sessions ADD COLUMN snapshot TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN restored_as TEXT NOT NULL DEFAULT '';
`,
	// 8: when a session was deleted through a gateway: its row stays
	// until pruned, so its id still says when and why it closed.
	`
ALTER TABLE sessions ADD COLUMN closed_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sessions_by_closed_at ON sessions (closed_at) WHERE closed_at <> 0;
`,
}

// pgMigrationLock is the advisory lock key that makes concurrent openers
// of a new database apply each migration once.
const pgMigrationLock = 0x73616e646c6f6f70 // "sandloop"

func (p *Postgres) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgMigrationLock)); err != nil {
			return fmt.Errorf("lock the schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS sandloop_schema (version INTEGER NOT NULL)`); err != nil {
			return fmt.Errorf("create schema table: %w", err)
		}
		var version int
		err := tx.QueryRow(ctx, `SELECT version FROM sandloop_schema`).Scan(&version)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err = tx.Exec(ctx, `INSERT INTO sandloop_schema (version) VALUES (0)`)
		}
		if err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if version > len(pgMigrations) {
			return fmt.Errorf("the database has schema version %d, newer than this program's %d; upgrade sandloop", version, len(pgMigrations))
		}
		for i := version; i < len(pgMigrations); i++ {
			if _, err := tx.Exec(ctx, pgMigrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
			p.log.InfoContext(ctx, "applied store migration", "version", i+1, "backend", "postgres")
		}
		_, err = tx.Exec(ctx, `UPDATE sandloop_schema SET version = $1`, len(pgMigrations))
		return err
	})
}

func (p *Postgres) nowMillis() time.Time { return p.now().UTC().Truncate(time.Millisecond) }

// inTx runs fn in a write transaction (the shared SQL locks the run's row).
func (p *Postgres) inTx(ctx context.Context) func(func(db) error) error {
	return func(fn func(db) error) error {
		return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return fn(pgDB{tx}) })
	}
}

// inSnapshot runs fn in a read-only transaction that sees one snapshot.
func (p *Postgres) inSnapshot(ctx context.Context) func(func(db) error) error {
	return func(fn func(db) error) error {
		return pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
			func(tx pgx.Tx) error { return fn(pgDB{tx}) })
	}
}

// CreateRun stores a new run (see Store.CreateRun).
func (p *Postgres) CreateRun(ctx context.Context, r Run) (*Run, error) {
	return createRun(ctx, pgDB{p.pool}, r, p.nowMillis())
}

// GetRun returns the run with the given id, Report included.
func (p *Postgres) GetRun(ctx context.Context, id string) (*Run, error) {
	return getRun(ctx, pgDB{p.pool}, id)
}

// UpdateRun changes a run under its row lock (see Store.UpdateRun).
func (p *Postgres) UpdateRun(ctx context.Context, id string, update func(*Run) error) (*Run, error) {
	return updateRun(ctx, p.inTx(ctx), id, update, p.nowMillis)
}

// ListRuns returns runs, newest first, without their Report.
func (p *Postgres) ListRuns(ctx context.Context, opts ListOptions) ([]Run, error) {
	return listRuns(ctx, pgDB{p.pool}, opts)
}

// LookupRunID expands a unique prefix of a run id; an exact id always wins.
func (p *Postgres) LookupRunID(ctx context.Context, prefix string) (string, error) {
	return lookupRunID(ctx, pgDB{p.pool}, prefix)
}

// DeleteRun removes a run with its steps, events and files.
func (p *Postgres) DeleteRun(ctx context.Context, id string) error {
	return deleteRun(ctx, pgDB{p.pool}, id)
}

// AppendStep stores st as the run's next step and adds its usage to the
// run's totals (see Store.AppendStep).
func (p *Postgres) AppendStep(ctx context.Context, st Step) (*Step, error) {
	return appendStep(ctx, st, p.nowMillis(), p.inTx(ctx))
}

// ListSteps returns the run's steps in order.
func (p *Postgres) ListSteps(ctx context.Context, runID string) ([]Step, error) {
	return stepsOf(ctx, p.inSnapshot(ctx), runID)
}

// AppendEvent adds an event to the run's log.
func (p *Postgres) AppendEvent(ctx context.Context, runID, typ string, data json.RawMessage) (*Event, error) {
	evs, err := p.AppendEvents(ctx, runID, []Event{{Type: typ, Data: data}})
	if err != nil {
		return nil, err
	}
	return &evs[0], nil
}

// AppendEvents adds several events in one transaction (see Store.AppendEvents).
func (p *Postgres) AppendEvents(ctx context.Context, runID string, events []Event) ([]Event, error) {
	return appendEvents(ctx, runID, events, p.nowMillis(), p.inTx(ctx))
}

// ListEvents returns the run's events with Seq greater than since, in
// order, at most limit of them (if limit is zero, all).
func (p *Postgres) ListEvents(ctx context.Context, runID string, since int64, limit int) ([]Event, error) {
	return eventsOf(ctx, p.inSnapshot(ctx), runID, since, limit)
}

// PutArtifacts replaces the run's files (see Store.PutArtifacts).
func (p *Postgres) PutArtifacts(ctx context.Context, runID string, files []Artifact) error {
	return putArtifacts(ctx, runID, files, p.inTx(ctx))
}

// ListArtifacts returns the run's files, by path, without their content.
func (p *Postgres) ListArtifacts(ctx context.Context, runID string) ([]Artifact, error) {
	return artifactsOf(ctx, p.inSnapshot(ctx), runID)
}

// Artifact returns one file of the run, with its content.
func (p *Postgres) Artifact(ctx context.Context, runID, path string) (*Artifact, error) {
	return getArtifact(ctx, pgDB{p.pool}, runID, path)
}

// ExportRun writes the run as a zip archive to w (see Store.ExportRun),
// from one snapshot.
func (p *Postgres) ExportRun(ctx context.Context, id string, w io.Writer) error {
	return exportRun(ctx, id, w, p.inSnapshot(ctx))
}
