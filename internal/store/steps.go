package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Step is one stored step of a run: a model call, a tool call with its full result,
// a nudge. Its content is the agent's JSON; the store only keeps it.
type Step struct {
	RunID string `json:"run_id"`
	// Index is assigned by AppendStep: 0, 1, 2, ... within the run.
	Index int `json:"index"`
	// Kind is what happened, in the agent's vocabulary ("model", "tool", "observation").
	Kind string `json:"kind"`
	// Name is the tool's name, for tool steps.
	Name string `json:"name,omitempty"`
	// Data is the step's content: messages, tool calls, the untruncated tool result.
	Data      json.RawMessage `json:"data,omitempty"`
	TokensIn  int64           `json:"tokens_in,omitempty"`
	TokensOut int64           `json:"tokens_out,omitempty"`
	CostUSD   float64         `json:"cost_usd,omitempty"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   time.Time       `json:"ended_at"`
}

// AppendStep stores st as the run's next step and adds its usage to the run's totals,
// in one transaction. It returns the step as stored, with its Index. Zero times are
// set to now.
func (s *Store) AppendStep(ctx context.Context, st Step) (*Step, error) {
	return appendStep(ctx, st, s.nowMillis(), s.inTx(ctx))
}

// ListSteps returns the run's steps in order. A run without steps gives an empty
// list; an unknown run gives ErrNotFound.
func (s *Store) ListSteps(ctx context.Context, runID string) ([]Step, error) {
	return stepsOf(ctx, s.inSnapshot(ctx), runID)
}

// appendStep is AppendStep in a write transaction that inTx runs.
func appendStep(ctx context.Context, st Step, now time.Time, inTx txFunc) (*Step, error) {
	if err := validJSON("step data", st.Data); err != nil {
		return nil, err
	}
	if st.StartedAt.IsZero() {
		st.StartedAt = now
	}
	if st.EndedAt.IsZero() {
		st.EndedAt = now
	}
	st.StartedAt, st.EndedAt = st.StartedAt.UTC().Truncate(time.Millisecond), st.EndedAt.UTC().Truncate(time.Millisecond)
	err := inTx(func(tx db) error {
		if err := runExists(ctx, tx, st.RunID, true); err != nil {
			return err
		}
		if err := tx.queryRow(ctx, `SELECT COALESCE(MAX(idx) + 1, 0) FROM steps WHERE run_id = ?`, st.RunID).Scan(&st.Index); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `INSERT INTO steps (run_id, idx, kind, name, data, tokens_in, tokens_out, cost_usd, started_at, ended_at)
			VALUES (?,?,?,?,?,?,?,?,?,?)`, st.RunID, st.Index, st.Kind, st.Name, nullJSON(st.Data),
			st.TokensIn, st.TokensOut, st.CostUSD, toMillis(st.StartedAt), toMillis(st.EndedAt)); err != nil {
			return err
		}
		_, err := tx.exec(ctx, `UPDATE runs SET tokens_in = tokens_in + ?, tokens_out = tokens_out + ?,
			cost_usd = cost_usd + ?, updated_at = ? WHERE id = ?`, st.TokensIn, st.TokensOut, st.CostUSD, toMillis(now), st.RunID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("append step to run %s: %w", st.RunID, err)
	}
	return &st, nil
}

// stepsOf is ListSteps in the snapshot that inSnapshot gives.
func stepsOf(ctx context.Context, inSnapshot txFunc, runID string) ([]Step, error) {
	var steps []Step
	err := inSnapshot(func(tx db) error {
		var err error
		steps, err = listSteps(ctx, tx, runID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list steps of run %s: %w", runID, err)
	}
	return steps, nil
}

func listSteps(ctx context.Context, d db, runID string) ([]Step, error) {
	if err := runExists(ctx, d, runID, false); err != nil {
		return nil, err
	}
	rs, err := d.query(ctx, `SELECT idx, kind, name, `+d.dialect().text("data")+`, tokens_in, tokens_out, cost_usd, started_at, ended_at
		FROM steps WHERE run_id = ? ORDER BY idx`, runID)
	if err != nil {
		return nil, err
	}
	return collect(rs, func(row scanner) (Step, error) {
		st := Step{RunID: runID}
		var (
			data           sql.NullString
			started, ended int64
		)
		if err := row.Scan(&st.Index, &st.Kind, &st.Name, &data, &st.TokensIn, &st.TokensOut, &st.CostUSD, &started, &ended); err != nil {
			return st, err
		}
		if data.Valid {
			st.Data = json.RawMessage(data.String)
		}
		st.StartedAt, st.EndedAt = fromMillis(started), fromMillis(ended)
		return st, nil
	})
}

// read runs fn in a read transaction: one consistent snapshot across its queries.
func (s *Store) read(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to lose
	return fn(tx)
}
