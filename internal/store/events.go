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
	if err := validJSON("event data", data); err != nil {
		return nil, err
	}
	ev := Event{RunID: runID, Type: typ, Data: data, Time: s.now().UTC().Truncate(time.Millisecond)}
	err := s.write(ctx, func(tx *sql.Tx) error {
		if err := runExists(ctx, tx, runID); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?`, runID).Scan(&ev.Seq); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO events (run_id, seq, at, type, data) VALUES (?,?,?,?,?)`,
			runID, ev.Seq, toMillis(ev.Time), typ, nullJSON(data))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("append event to run %s: %w", runID, err)
	}
	return &ev, nil
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
