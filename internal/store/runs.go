package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Run is one agent run.
type Run struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Task      string    `json:"task"`
	Mode      string    `json:"mode"`   // generate, debug, refactor, app
	Model     string    `json:"model"`  // provider/model
	Status    string    `json:"status"` // the agent's vocabulary: running, succeeded, failed, cancelled, ...
	// Steps is the agent's step count, set by the agent (a step may span several
	// stored Step rows: a model call and its tool results).
	Steps int `json:"steps"`
	// TokensIn, TokensOut and CostUSD are totals: AppendStep adds each step's usage.
	TokensIn  int64   `json:"tokens_in"`
	TokensOut int64   `json:"tokens_out"`
	CostUSD   float64 `json:"cost_usd"`
	// CostUnknown: some of the run's model calls had no price, so CostUSD
	// leaves them out (it is not what the run cost).
	CostUnknown bool   `json:"cost_unknown,omitempty"`
	Summary     string `json:"summary,omitempty"`
	Error       string `json:"error,omitempty"`
	// Report is the final report, as JSON. ListRuns leaves it out to keep lists light.
	Report json.RawMessage `json:"report,omitempty"`
	// Owner is who started the run: the server's name for a token (never
	// the token), or "" (the CLI, a server without tokens). It cannot change.
	Owner string `json:"-"`
}

const runColumns = `id, created_at, updated_at, task, mode, model, status, steps, tokens_in, tokens_out, cost_usd, summary, error, owner, cost_unknown`

func scanRun(row scanner, withReport bool) (*Run, error) {
	var (
		r                Run
		created, updated int64
		unknown          int64
		report           sql.NullString
	)
	dest := []any{&r.ID, &created, &updated, &r.Task, &r.Mode, &r.Model, &r.Status, &r.Steps,
		&r.TokensIn, &r.TokensOut, &r.CostUSD, &r.Summary, &r.Error, &r.Owner, &unknown}
	if withReport {
		dest = append(dest, &report)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.CreatedAt, r.UpdatedAt = fromMillis(created), fromMillis(updated)
	r.CostUnknown = unknown != 0
	if report.Valid {
		r.Report = json.RawMessage(report.String)
	}
	return &r, nil
}

func validJSON(what string, b []byte) error {
	if len(b) > 0 && !json.Valid(b) {
		return fmt.Errorf("store: %s is not valid JSON", what)
	}
	return nil
}

// CreateRun stores a new run and returns it as stored. If r.ID is empty an id is made
// up; times are set to now; Status defaults to "running".
func (s *Store) CreateRun(ctx context.Context, r Run) (*Run, error) {
	return createRun(ctx, sqlDB{s.w}, r, s.nowMillis())
}

// GetRun returns the run with the given id, Report included.
func (s *Store) GetRun(ctx context.Context, id string) (*Run, error) {
	return getRun(ctx, sqlDB{s.r}, id)
}

// UpdateRun changes a run: update receives the stored run and edits it in place,
// inside one write transaction, so concurrent updates (the agent finishing while a
// user cancels) cannot lose each other's changes. ID, CreatedAt and Owner cannot change;
// UpdatedAt is set to now. If update returns an error nothing is written.
func (s *Store) UpdateRun(ctx context.Context, id string, update func(*Run) error) (*Run, error) {
	return updateRun(ctx, s.inTx(ctx), id, update, s.nowMillis)
}

// ListOptions selects and pages runs.
type ListOptions struct {
	// Limit is the page size. If zero, 50; at most 1000.
	Limit int
	// Offset skips that many runs (newest first).
	Offset int
	// Status and Mode, if set, keep only runs with that value.
	Status string
	Mode   string
	// Owner, if not nil, keeps only the runs of that owner ("" included).
	Owner *string
}

// ListRuns returns runs, newest first, without their Report.
func (s *Store) ListRuns(ctx context.Context, opts ListOptions) ([]Run, error) {
	return listRuns(ctx, sqlDB{s.r}, opts)
}

// LookupRunID expands a unique prefix of a run id (as `sandloop runs show 3f9a` takes)
// to the full id. An exact id always wins.
func (s *Store) LookupRunID(ctx context.Context, prefix string) (string, error) {
	return lookupRunID(ctx, sqlDB{s.r}, prefix)
}

// DeleteRun removes a run with its steps, events and files.
func (s *Store) DeleteRun(ctx context.Context, id string) error {
	return deleteRun(ctx, sqlDB{s.w}, id)
}

// The shared SQL of runs (dialect.go).

func createRun(ctx context.Context, d db, r Run, now time.Time) (*Run, error) {
	if err := validJSON("run report", r.Report); err != nil {
		return nil, err
	}
	if r.ID == "" {
		r.ID = newID()
	}
	if r.Status == "" {
		r.Status = "running"
	}
	r.CreatedAt, r.UpdatedAt = now, now
	_, err := d.exec(ctx, `INSERT INTO runs (`+runColumns+`, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		r.ID, toMillis(r.CreatedAt), toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
		r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, r.Owner, flag(r.CostUnknown), nullJSON(r.Report))
	if err != nil {
		return nil, fmt.Errorf("create run: %w", err)
	}
	return &r, nil
}

// selectRun reads a run with its report; lock holds its row in a write.
func selectRun(ctx context.Context, d db, id string, lock bool) (*Run, error) {
	q := `SELECT ` + runColumns + `, ` + d.dialect().text("report") + ` FROM runs WHERE id = ?`
	if lock {
		q += d.dialect().lock
	}
	r, err := scanRun(d.queryRow(ctx, q, id), true)
	if isNoRows(err) {
		return nil, fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return r, err
}

func getRun(ctx context.Context, d db, id string) (*Run, error) {
	r, err := selectRun(ctx, d, id, false)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	return r, err
}

// updateRun is UpdateRun in a write transaction that inTx runs.
func updateRun(ctx context.Context, inTx txFunc, id string, update func(*Run) error, now func() time.Time) (*Run, error) {
	var out *Run
	err := inTx(func(tx db) error {
		var err error
		out, err = updateRunIn(ctx, tx, id, update, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update run %s: %w", id, err)
	}
	return out, nil
}

func updateRunIn(ctx context.Context, tx db, id string, update func(*Run) error, now func() time.Time) (*Run, error) {
	r, err := selectRun(ctx, tx, id, true)
	if err != nil {
		return nil, err
	}
	created, owner := r.CreatedAt, r.Owner
	if err := update(r); err != nil {
		return nil, err
	}
	if err := validJSON("run report", r.Report); err != nil {
		return nil, err
	}
	r.ID, r.CreatedAt, r.Owner = id, created, owner
	r.UpdatedAt = now()
	_, err = tx.exec(ctx, `UPDATE runs SET updated_at=?, task=?, mode=?, model=?, status=?, steps=?,
		tokens_in=?, tokens_out=?, cost_usd=?, summary=?, error=?, cost_unknown=?, report=? WHERE id=?`,
		toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
		r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, flag(r.CostUnknown), nullJSON(r.Report), id)
	return r, err
}

// flag is a bool as both databases' INTEGER columns keep it.
func flag(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func listRuns(ctx context.Context, d db, opts ListOptions) ([]Run, error) {
	if opts.Limit <= 0 {
		opts.Limit = 50
	}
	opts.Limit = min(opts.Limit, 1000)
	opts.Offset = max(opts.Offset, 0)
	var (
		where []string
		args  []any
	)
	if opts.Status != "" {
		where, args = append(where, "status = ?"), append(args, opts.Status)
	}
	if opts.Mode != "" {
		where, args = append(where, "mode = ?"), append(args, opts.Mode)
	}
	if opts.Owner != nil {
		where, args = append(where, "owner = ?"), append(args, *opts.Owner)
	}
	q := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created_at DESC, id LIMIT ? OFFSET ?`
	args = append(args, opts.Limit, opts.Offset)
	rs, err := d.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	runs, err := collect(rs, func(row scanner) (Run, error) {
		r, err := scanRun(row, false)
		if err != nil {
			return Run{}, err
		}
		return *r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

func lookupRunID(ctx context.Context, d db, prefix string) (string, error) {
	if prefix == "" {
		return "", fmt.Errorf("run %q: %w", prefix, ErrNotFound)
	}
	rs, err := d.query(ctx, `SELECT id FROM runs WHERE substr(id, 1, length(?)) = ? ORDER BY id = ? DESC, id LIMIT 2`, prefix, prefix, prefix)
	if err != nil {
		return "", fmt.Errorf("look up run %s: %w", prefix, err)
	}
	ids, err := collect(rs, func(row scanner) (id string, err error) { return id, row.Scan(&id) })
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

func deleteRun(ctx context.Context, d db, id string) error {
	n, err := d.exec(ctx, `DELETE FROM runs WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete run %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return nil
}

// runExists fails with ErrNotFound unless the run exists (the foreign keys
// would refuse too, but with an error callers cannot branch on); lock
// holds its row until a write transaction ends.
func runExists(ctx context.Context, d db, id string, lock bool) error {
	q := `SELECT 1 FROM runs WHERE id = ?`
	if lock {
		q += d.dialect().lock
	}
	var one int
	err := d.queryRow(ctx, q, id).Scan(&one)
	if isNoRows(err) {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return err
}
