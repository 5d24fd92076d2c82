package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Event is one entry of a run's append-only event log, the same events the run
// streamed live, kept so that a client joining late (or reconnecting with SSE's
// Last-Event-ID) can replay them.
type Event struct {
	RunID string `json:"run_id"`
	// Seq numbers the run's events from 1, without gaps; it is the SSE event id.
	Seq  int64           `json:"seq"`
	Time time.Time       `json:"time"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// AppendEvent adds an event to the run's log and returns it with its Seq and Time.
func (s *Store) AppendEvent(ctx context.Context, runID, typ string, data json.RawMessage) (*Event, error) {
	evs, err := s.AppendEvents(ctx, runID, []Event{{Type: typ, Data: data}})
	if err != nil {
		return nil, err
	}
	return &evs[0], nil
}

// AppendEvents adds several events in one transaction, for a caller that buffers a
// burst of output: a transaction costs far more than a row. Only Type and Data of
// the given events are used; the returned copies carry RunID, Seq and Time.
func (s *Store) AppendEvents(ctx context.Context, runID string, events []Event) ([]Event, error) {
	now := s.now().UTC().Truncate(time.Millisecond)
	out, err := newEvents(runID, now, events)
	if err != nil {
		return nil, err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		if err := runExists(ctx, tx, runID); err != nil {
			return err
		}
		var next int64
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?`, runID).Scan(&next); err != nil {
			return err
		}
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO events (run_id, seq, at, type, data) VALUES (?,?,?,?,?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for i := range out {
			out[i].Seq = next + int64(i)
			if _, err := stmt.ExecContext(ctx, runID, out[i].Seq, toMillis(now), out[i].Type, nullJSON(out[i].Data)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("append events to run %s: %w", runID, err)
	}
	return out, nil
}

// ListEvents returns the run's events with Seq greater than since, in order, at most
// limit of them (if limit is zero, all). An unknown run gives ErrNotFound.
func (s *Store) ListEvents(ctx context.Context, runID string, since int64, limit int) ([]Event, error) {
	var events []Event
	err := s.read(ctx, func(tx *sql.Tx) error {
		var err error
		events, err = listEvents(ctx, tx, runID, since, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list events of run %s: %w", runID, err)
	}
	return events, nil
}

func listEvents(ctx context.Context, tx *sql.Tx, runID string, since int64, limit int) ([]Event, error) {
	if err := runExists(ctx, tx, runID); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, at, type, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
		runID, since, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	events := []Event{}
	for rows.Next() {
		ev := Event{RunID: runID}
		var (
			at   int64
			data sql.NullString
		)
		if err := rows.Scan(&ev.Seq, &at, &ev.Type, &data); err != nil {
			return nil, err
		}
		ev.Time = fromMillis(at)
		if data.Valid {
			ev.Data = json.RawMessage(data.String)
		}
		events = append(events, ev)
	}
	return events, rows.Err()
}

// newEvents checks the events' JSON and returns the copies to store, without Seq.
func newEvents(runID string, now time.Time, events []Event) ([]Event, error) {
	out := make([]Event, len(events))
	for i, e := range events {
		if err := validJSON("event data", e.Data); err != nil {
			return nil, err
		}
		out[i] = Event{RunID: runID, Type: e.Type, Data: e.Data, Time: now}
	}
	return out, nil
}
