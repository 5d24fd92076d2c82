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
	return appendEvents(ctx, runID, events, s.nowMillis(), s.inTx(ctx))
}

// ListEvents returns the run's events with Seq greater than since, in order, at most
// limit of them (if limit is zero, all). An unknown run gives ErrNotFound.
func (s *Store) ListEvents(ctx context.Context, runID string, since int64, limit int) ([]Event, error) {
	return eventsOf(ctx, s.inSnapshot(ctx), runID, since, limit)
}

// appendEvents is AppendEvents in a write transaction that inTx runs.
func appendEvents(ctx context.Context, runID string, events []Event, now time.Time, inTx txFunc) ([]Event, error) {
	out, err := newEvents(runID, now, events)
	if err != nil {
		return nil, err
	}
	err = inTx(func(tx db) error {
		if err := runExists(ctx, tx, runID, true); err != nil {
			return err
		}
		var next int64
		if err := tx.queryRow(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?`, runID).Scan(&next); err != nil {
			return err
		}
		argLists := make([][]any, len(out))
		for i := range out {
			out[i].Seq = next + int64(i)
			argLists[i] = []any{runID, out[i].Seq, toMillis(now), out[i].Type, nullJSON(out[i].Data)}
		}
		return tx.execEach(ctx, `INSERT INTO events (run_id, seq, at, type, data) VALUES (?,?,?,?,?)`, argLists)
	})
	if err != nil {
		return nil, fmt.Errorf("append events to run %s: %w", runID, err)
	}
	return out, nil
}

// eventsOf is ListEvents in the snapshot that inSnapshot gives.
func eventsOf(ctx context.Context, inSnapshot txFunc, runID string, since int64, limit int) ([]Event, error) {
	var events []Event
	err := inSnapshot(func(tx db) error {
		var err error
		events, err = listEvents(ctx, tx, runID, since, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list events of run %s: %w", runID, err)
	}
	return events, nil
}

func listEvents(ctx context.Context, d db, runID string, since int64, limit int) ([]Event, error) {
	if err := runExists(ctx, d, runID, false); err != nil {
		return nil, err
	}
	lim := d.dialect().noLimit
	if limit > 0 {
		lim = limit
	}
	rs, err := d.query(ctx, `SELECT seq, at, type, `+d.dialect().text("data")+` FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
		runID, since, lim)
	if err != nil {
		return nil, err
	}
	return collect(rs, func(row scanner) (Event, error) {
		ev := Event{RunID: runID}
		var (
			at   int64
			data sql.NullString
		)
		if err := row.Scan(&ev.Seq, &at, &ev.Type, &data); err != nil {
			return ev, err
		}
		ev.Time = fromMillis(at)
		if data.Valid {
			ev.Data = json.RawMessage(data.String)
		}
		return ev, nil
	})
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
