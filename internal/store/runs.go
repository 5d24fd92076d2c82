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
	Summary   string  `json:"summary,omitempty"`
	Error     string  `json:"error,omitempty"`
	// Report is the final report, as JSON. ListRuns leaves it out to keep lists light.
	Report json.RawMessage `json:"report,omitempty"`
	// Owner is who started the run: the server's name for a token (never
	// the token), or "" (the CLI, a server without tokens). It cannot change.
	Owner string `json:"-"`
}

const runColumns = `id, created_at, updated_at, task, mode, model, status, steps, tokens_in, tokens_out, cost_usd, summary, error, owner`

type scanner interface{ Scan(dest ...any) error }

func scanRun(row scanner, withReport bool) (*Run, error) {
	var (
		r                Run
		created, updated int64
		report           sql.NullString
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
	if err := validJSON("run report", r.Report); err != nil {
		return nil, err
	}
	if r.ID == "" {
		r.ID = newID()
	}
	if r.Status == "" {
		r.Status = "running"
	}
	now := s.now().UTC().Truncate(time.Millisecond)
	r.CreatedAt, r.UpdatedAt = now, now
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO runs (`+runColumns+`, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			r.ID, toMillis(r.CreatedAt), toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
			r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, r.Owner, nullJSON(r.Report))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create run: %w", err)
	}
	return &r, nil
}

// GetRun returns the run with the given id, Report included.
func (s *Store) GetRun(ctx context.Context, id string) (*Run, error) {
	r, err := scanRun(s.r.QueryRowContext(ctx, `SELECT `+runColumns+`, report FROM runs WHERE id = ?`, id), true)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	return r, nil
}

// UpdateRun changes a run: update receives the stored run and edits it in place,
// inside one write transaction, so concurrent updates (the agent finishing while a
// user cancels) cannot lose each other's changes. ID, CreatedAt and Owner cannot change;
// UpdatedAt is set to now. If update returns an error nothing is written.
func (s *Store) UpdateRun(ctx context.Context, id string, update func(*Run) error) (*Run, error) {
	var out *Run
	err := s.write(ctx, func(tx *sql.Tx) error {
		r, err := scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+`, report FROM runs WHERE id = ?`, id), true)
		if errors.Is(err, sql.ErrNoRows) {
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
		r.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
		_, err = tx.ExecContext(ctx, `UPDATE runs SET updated_at=?, task=?, mode=?, model=?, status=?, steps=?,
			tokens_in=?, tokens_out=?, cost_usd=?, summary=?, error=?, report=? WHERE id=?`,
			toMillis(r.UpdatedAt), r.Task, r.Mode, r.Model, r.Status, r.Steps,
			r.TokensIn, r.TokensOut, r.CostUSD, r.Summary, r.Error, nullJSON(r.Report), id)
		out = r
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update run %s: %w", id, err)
	}
	return out, nil
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
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	runs := []Run{}
	for rows.Next() {
		r, err := scanRun(rows, false)
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

// LookupRunID expands a unique prefix of a run id (as `sandloop runs show 3f9a` takes)
// to the full id. An exact id always wins.
func (s *Store) LookupRunID(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		return "", fmt.Errorf("run %q: %w", prefix, ErrNotFound)
	}
	rows, err := s.r.QueryContext(ctx,
		`SELECT id FROM runs WHERE substr(id, 1, length(?1)) = ?1 ORDER BY id = ?1 DESC, id LIMIT 2`, prefix)
	if err != nil {
		return "", fmt.Errorf("look up run %s: %w", prefix, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return "", fmt.Errorf("look up run %s: %w", prefix, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
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
func (s *Store) DeleteRun(ctx context.Context, id string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete run %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("run %s: %w", id, ErrNotFound)
		}
		return nil
	})
}

// runExists fails with ErrNotFound unless the run exists; the foreign key would
// also refuse, but with an error callers cannot branch on.
func runExists(ctx context.Context, tx *sql.Tx, id string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM runs WHERE id = ?`, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	return err
}
