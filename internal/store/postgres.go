package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
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

// lockRun fails with ErrNotFound unless the run exists, and holds its row
// until tx ends: the writers of one run take turns.
func lockRun(ctx context.Context, tx pgx.Tx, id string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return err
}

// pgRunExists is lockRun for readers.
func pgRunExists(ctx context.Context, q pgx.Tx, id string) error {
	var one int
	err := q.QueryRow(ctx, `SELECT 1 FROM runs WHERE id = $1`, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return err
}

// jsonArg passes JSON text to a JSON column (NULL when empty).
func jsonArg(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// CreateRun stores a new run (see Store.CreateRun).
func (p *Postgres) CreateRun(ctx context.Context, r Run) (*Run, error) {
	if err := validJSON("run report", r.Report); err != nil {
		return nil, err
	}
	if r.ID == "" {
		r.ID = newID()
	}
	if r.Status == "" {
		r.Status = "running"
	}
	now := p.nowMillis()
	r.CreatedAt, r.UpdatedAt = now, now
	_, err := p.pool.Exec(ctx, `INSERT INTO runs (`+runColumns+`, report) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)`,
		r.ID, toMillis(r.CreatedAt), toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
		r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, r.Owner, jsonArg(r.Report))
	if err != nil {
		return nil, fmt.Errorf("create run: %w", err)
	}
	return &r, nil
}

// pgRun scans a run row (report last, as text).
func pgRun(row pgx.Row, withReport bool) (*Run, error) {
	var (
		r                Run
		created, updated int64
		report           *string
	)
	dest := []any{&r.ID, &created, &updated, &r.Task, &r.Mode, &r.Model, &r.Status, &r.Steps,
		&r.TokensIn, &r.TokensOut, &r.CostUSD, &r.Summary, &r.Error, &r.Owner}
	if withReport {
		dest = append(dest, &report)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.CreatedAt, r.UpdatedAt = fromMillis(created), fromMillis(updated)
	if report != nil {
		r.Report = json.RawMessage(*report)
	}
	return &r, nil
}

const pgRunSelect = `SELECT ` + runColumns + `, report::text FROM runs WHERE id = $1`

// GetRun returns the run with the given id, Report included.
func (p *Postgres) GetRun(ctx context.Context, id string) (*Run, error) {
	r, err := pgRun(p.pool.QueryRow(ctx, pgRunSelect, id), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	return r, nil
}

// UpdateRun changes a run under its row lock (see Store.UpdateRun).
func (p *Postgres) UpdateRun(ctx context.Context, id string, update func(*Run) error) (*Run, error) {
	var out *Run
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		r, err := pgRun(tx.QueryRow(ctx, pgRunSelect+` FOR UPDATE`, id), true)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("run %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		created, owner := r.CreatedAt, r.Owner
		if err := update(r); err != nil {
			return err
		}
		if err := validJSON("run report", r.Report); err != nil {
			return err
		}
		r.ID, r.CreatedAt, r.Owner = id, created, owner
		r.UpdatedAt = p.nowMillis()
		_, err = tx.Exec(ctx, `UPDATE runs SET updated_at=$1, task=$2, mode=$3, model=$4, status=$5, steps=$6,
			tokens_in=$7, tokens_out=$8, cost_usd=$9, summary=$10, error=$11, report=$12 WHERE id=$13`,
			toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
			r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, jsonArg(r.Report), id)
		out = r
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update run %s: %w", id, err)
	}
	return out, nil
}

// ListRuns returns runs, newest first, without their Report.
func (p *Postgres) ListRuns(ctx context.Context, opts ListOptions) ([]Run, error) {
	if opts.Limit <= 0 {
		opts.Limit = 50
	}
	opts.Limit = min(opts.Limit, 1000)
	opts.Offset = max(opts.Offset, 0)
	var (
		where []string
		args  []any
	)
	add := func(col string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf("%s = $%d", col, len(args)))
	}
	if opts.Status != "" {
		add("status", opts.Status)
	}
	if opts.Mode != "" {
		add("mode", opts.Mode)
	}
	if opts.Owner != nil {
		add("owner", *opts.Owner)
	}
	q := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, opts.Limit, opts.Offset)
	q += fmt.Sprintf(` ORDER BY created_at DESC, id LIMIT $%d OFFSET $%d`, len(args)-1, len(args))
	rows, err := p.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	runs := []Run{}
	for rows.Next() {
		r, err := pgRun(rows, false)
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		runs = append(runs, *r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

// LookupRunID expands a unique prefix of a run id; an exact id always wins.
func (p *Postgres) LookupRunID(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		return "", fmt.Errorf("run %q: %w", prefix, ErrNotFound)
	}
	rows, err := p.pool.Query(ctx,
		`SELECT id FROM runs WHERE left(id, length($1)) = $1 ORDER BY id = $1 DESC, id LIMIT 2`, prefix)
	if err != nil {
		return "", fmt.Errorf("look up run %s: %w", prefix, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("look up run %s: %w", prefix, err)
	}
	switch {
	case len(ids) == 0:
		return "", fmt.Errorf("run %s: %w", prefix, ErrNotFound)
	case ids[0] == prefix || len(ids) == 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("run %s (%s, %s, ...): %w", prefix, ids[0], ids[1], ErrAmbiguous)
}

// DeleteRun removes a run with its steps, events and files.
func (p *Postgres) DeleteRun(ctx context.Context, id string) error {
	tag, err := p.pool.Exec(ctx, `DELETE FROM runs WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete run %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return nil
}

// AppendStep stores st as the run's next step and adds its usage to the
// run's totals (see Store.AppendStep).
func (p *Postgres) AppendStep(ctx context.Context, st Step) (*Step, error) {
	if err := validJSON("step data", st.Data); err != nil {
		return nil, err
	}
	now := p.nowMillis()
	if st.StartedAt.IsZero() {
		st.StartedAt = now
	}
	if st.EndedAt.IsZero() {
		st.EndedAt = now
	}
	st.StartedAt, st.EndedAt = st.StartedAt.UTC().Truncate(time.Millisecond), st.EndedAt.UTC().Truncate(time.Millisecond)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := lockRun(ctx, tx, st.RunID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(idx) + 1, 0) FROM steps WHERE run_id = $1`, st.RunID).Scan(&st.Index); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO steps (run_id, idx, kind, name, data, tokens_in, tokens_out, cost_usd, started_at, ended_at)
			VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)`, st.RunID, st.Index, st.Kind, st.Name, jsonArg(st.Data),
			st.TokensIn, st.TokensOut, st.CostUSD, toMillis(st.StartedAt), toMillis(st.EndedAt)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE runs SET tokens_in = tokens_in + $1, tokens_out = tokens_out + $2,
			cost_usd = cost_usd + $3, updated_at = $4 WHERE id = $5`, st.TokensIn, st.TokensOut, st.CostUSD, toMillis(now), st.RunID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("append step to run %s: %w", st.RunID, err)
	}
	return &st, nil
}

// readTx runs fn in a read-only transaction that sees one snapshot.
func (p *Postgres) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// ListSteps returns the run's steps in order.
func (p *Postgres) ListSteps(ctx context.Context, runID string) ([]Step, error) {
	var steps []Step
	err := p.readTx(ctx, func(tx pgx.Tx) error {
		var err error
		steps, err = pgListSteps(ctx, tx, runID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list steps of run %s: %w", runID, err)
	}
	return steps, nil
}

func pgListSteps(ctx context.Context, tx pgx.Tx, runID string) ([]Step, error) {
	if err := pgRunExists(ctx, tx, runID); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT idx, kind, name, data::text, tokens_in, tokens_out, cost_usd, started_at, ended_at
		FROM steps WHERE run_id = $1 ORDER BY idx`, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	steps := []Step{}
	for rows.Next() {
		st := Step{RunID: runID}
		var (
			data           *string
			started, ended int64
		)
		if err := rows.Scan(&st.Index, &st.Kind, &st.Name, &data, &st.TokensIn, &st.TokensOut, &st.CostUSD, &started, &ended); err != nil {
			return nil, err
		}
		if data != nil {
			st.Data = json.RawMessage(*data)
		}
		st.StartedAt, st.EndedAt = fromMillis(started), fromMillis(ended)
		steps = append(steps, st)
	}
	return steps, rows.Err()
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
	now := p.nowMillis()
	out, err := newEvents(runID, now, events)
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := lockRun(ctx, tx, runID); err != nil {
			return err
		}
		var next int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = $1`, runID).Scan(&next); err != nil {
			return err
		}
		var b pgx.Batch
		for i := range out {
			out[i].Seq = next + int64(i)
			b.Queue(`INSERT INTO events (run_id, seq, at, type, data) VALUES ($1,$2,$3,$4,$5)`,
				runID, out[i].Seq, toMillis(now), out[i].Type, jsonArg(out[i].Data))
		}
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("append events to run %s: %w", runID, err)
	}
	return out, nil
}

// ListEvents returns the run's events with Seq greater than since, in
// order, at most limit of them (if limit is zero, all).
func (p *Postgres) ListEvents(ctx context.Context, runID string, since int64, limit int) ([]Event, error) {
	var events []Event
	err := p.readTx(ctx, func(tx pgx.Tx) error {
		var err error
		events, err = pgListEvents(ctx, tx, runID, since, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list events of run %s: %w", runID, err)
	}
	return events, nil
}

func pgListEvents(ctx context.Context, tx pgx.Tx, runID string, since int64, limit int) ([]Event, error) {
	if err := pgRunExists(ctx, tx, runID); err != nil {
		return nil, err
	}
	var lim any // NULL: no limit
	if limit > 0 {
		lim = limit
	}
	rows, err := tx.Query(ctx, `SELECT seq, at, type, data::text FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
		runID, since, lim)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	events := []Event{}
	for rows.Next() {
		ev := Event{RunID: runID}
		var (
			at   int64
			data *string
		)
		if err := rows.Scan(&ev.Seq, &at, &ev.Type, &data); err != nil {
			return nil, err
		}
		ev.Time = fromMillis(at)
		if data != nil {
			ev.Data = json.RawMessage(*data)
		}
		events = append(events, ev)
	}
	return events, rows.Err()
}

// PutArtifacts replaces the run's files (see Store.PutArtifacts).
func (p *Postgres) PutArtifacts(ctx context.Context, runID string, files []Artifact) error {
	if err := checkArtifacts(files); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := lockRun(ctx, tx, runID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM artifacts WHERE run_id = $1`, runID); err != nil {
			return err
		}
		for _, f := range files {
			data, mode := artifactRow(f)
			if _, err := tx.Exec(ctx, `INSERT INTO artifacts (run_id, path, mode, size, data) VALUES ($1,$2,$3,$4,$5)`,
				runID, f.Path, int64(mode), len(data), data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("put artifacts of run %s: %w", runID, err)
	}
	return nil
}

// ListArtifacts returns the run's files, by path, without their content.
func (p *Postgres) ListArtifacts(ctx context.Context, runID string) ([]Artifact, error) {
	var out []Artifact
	err := p.readTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = pgListArtifacts(ctx, tx, runID, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list artifacts of run %s: %w", runID, err)
	}
	return out, nil
}

// Artifact returns one file of the run, with its content.
func (p *Postgres) Artifact(ctx context.Context, runID, path string) (*Artifact, error) {
	a := Artifact{Path: path}
	var mode int64
	err := p.pool.QueryRow(ctx, `SELECT mode, size, data FROM artifacts WHERE run_id = $1 AND path = $2`, runID, path).
		Scan(&mode, &a.Size, &a.Data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("run %s: file %s: %w", runID, path, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: file %s: %w", runID, path, err)
	}
	a.Mode = fs.FileMode(mode)
	return &a, nil
}

func pgListArtifacts(ctx context.Context, tx pgx.Tx, runID string, withData bool) ([]Artifact, error) {
	if err := pgRunExists(ctx, tx, runID); err != nil {
		return nil, err
	}
	cols := "path, mode, size"
	if withData {
		cols += ", data"
	}
	rows, err := tx.Query(ctx, `SELECT `+cols+` FROM artifacts WHERE run_id = $1 ORDER BY path`, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Artifact{}
	for rows.Next() {
		var (
			a    Artifact
			mode int64
		)
		dest := []any{&a.Path, &mode, &a.Size}
		if withData {
			dest = append(dest, &a.Data)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		a.Mode = fs.FileMode(mode)
		out = append(out, a)
	}
	return out, rows.Err()
}

// ExportRun writes the run as a zip archive to w (see Store.ExportRun),
// from one snapshot.
func (p *Postgres) ExportRun(ctx context.Context, id string, w io.Writer) error {
	var (
		run    *Run
		steps  []Step
		events []Event
		files  []Artifact
	)
	err := p.readTx(ctx, func(tx pgx.Tx) error {
		var err error
		run, err = pgRun(tx.QueryRow(ctx, pgRunSelect, id), true)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("run %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if steps, err = pgListSteps(ctx, tx, id); err != nil {
			return err
		}
		if events, err = pgListEvents(ctx, tx, id, 0, 0); err != nil {
			return err
		}
		files, err = pgListArtifacts(ctx, tx, id, true)
		return err
	})
	if err != nil {
		return fmt.Errorf("export run %s: %w", id, err)
	}
	if err := writeExport(w, run, steps, events, files); err != nil {
		return fmt.Errorf("export run %s: %w", id, err)
	}
	return nil
}
