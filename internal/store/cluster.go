package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A cell's shared state in PostgreSQL: where each session lives and the
// hosts the gateways see. Every change a gateway must not miss is also
// sent on the NotifyChannel, so each gateway's cache can drop it.

// NotifyChannel is the LISTEN/NOTIFY channel of placement changes. A
// payload is "s:ID" (that placement changed or went) or "h:HOST" (that
// host's sessions were fenced).
const NotifyChannel = "sandloop_placements"

// Placement kinds.
const (
	KindSession = "session" // an API session
	KindRun     = "run"     // an agent run (its sandbox lives on the host)
	KindMCP     = "mcp"     // an MCP session (Mcp-Session-Id)
)

// Placement says where a session lives.
type Placement struct {
	ID    string
	Kind  string
	Owner string
	Host  string // the host's name in the cell
	Epoch string // the host process's epoch when the session was made
	// Lost is set once that epoch ended: the session is gone.
	Lost      bool
	CreatedAt time.Time
	// Snapshot is the session's latest durable snapshot ("" if none):
	// a lost session with one is restored from it on another host.
	Snapshot string
	// RestoredAs is the session a lost one was restored as ("" if not).
	RestoredAs string
	// ClosedAt is when the session was deleted through a gateway (zero
	// while it lives): its row stays until Prune, so that its id still
	// leads to its host, which says when and why it closed.
	ClosedAt time.Time
}

// HostRecord is a host as a gateway last saw it.
type HostRecord struct {
	Name   string    `json:"name"`
	URL    string    `json:"url"`
	Epoch  string    `json:"epoch"`
	Ready  bool      `json:"ready"`
	Slots  int       `json:"slots"`
	Used   int       `json:"used"`
	SeenAt time.Time `json:"seen_at"`
}

// PutPlacement records where a new session lives.
func (p *Postgres) PutPlacement(ctx context.Context, pl Placement) error {
	_, err := p.pool.Exec(ctx, `INSERT INTO sessions (id, kind, owner, host, epoch, created_at, lost, snapshot) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)
		ON CONFLICT (id) DO UPDATE SET kind=$2, owner=$3, host=$4, epoch=$5, created_at=$6, lost=$7, snapshot=$8, restored_as='', closed_at=0`,
		pl.ID, pl.Kind, pl.Owner, pl.Host, pl.Epoch, toMillis(p.nowMillis()), pl.Lost, pl.Snapshot)
	if err != nil {
		return fmt.Errorf("record session %s: %w", pl.ID, err)
	}
	return nil
}

// GetPlacement returns where a session lives, or ErrNotFound.
func (p *Postgres) GetPlacement(ctx context.Context, id string) (*Placement, error) {
	pl := Placement{ID: id}
	var created, closed int64
	err := p.pool.QueryRow(ctx, `SELECT kind, owner, host, epoch, lost, created_at, snapshot, restored_as, closed_at FROM sessions WHERE id = $1`, id).
		Scan(&pl.Kind, &pl.Owner, &pl.Host, &pl.Epoch, &pl.Lost, &created, &pl.Snapshot, &pl.RestoredAs, &closed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("session %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("look up session %s: %w", id, err)
	}
	pl.CreatedAt = fromMillis(created)
	if closed != 0 {
		pl.ClosedAt = fromMillis(closed)
	}
	return &pl, nil
}

// SetSnapshot records snap as the latest durable snapshot of session id
// and tells the gateways. A session not recorded is ErrNotFound.
func (p *Postgres) SetSnapshot(ctx context.Context, id, snap string) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE sessions SET snapshot = $2 WHERE id = $1`, id, snap)
		if err != nil {
			return fmt.Errorf("record the snapshot of session %s: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("session %s: %w", id, ErrNotFound)
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, "s:"+id)
		return err
	})
}

// SetRestoredAs records that the lost session id was restored as the
// session to, unless it already was: it returns the session it was
// restored as (to, or the one another gateway recorded first).
func (p *Postgres) SetRestoredAs(ctx context.Context, id, to string) (string, error) {
	var got string
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE sessions SET restored_as = CASE WHEN restored_as = '' THEN $2 ELSE restored_as END
			WHERE id = $1 RETURNING restored_as`, id, to).Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("session %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("record the restore of session %s: %w", id, err)
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, "s:"+id)
		return err
	})
	return got, err
}

// DeletePlacement forgets a session (it was deleted) and tells the gateways.
func (p *Postgres) DeletePlacement(ctx context.Context, id string) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE id = $1`, id); err != nil {
			return fmt.Errorf("forget session %s: %w", id, err)
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, "s:"+id)
		return err
	})
}

// ClosePlacement records that session id was deleted (its row stays
// until Prune: see Placement.ClosedAt) and tells the gateways.
func (p *Postgres) ClosePlacement(ctx context.Context, id string) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE sessions SET closed_at = $2 WHERE id = $1 AND closed_at = 0`, id, toMillis(p.nowMillis())); err != nil {
			return fmt.Errorf("record the close of session %s: %w", id, err)
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, "s:"+id)
		return err
	})
}

// FenceHost marks lost every live session of host whose epoch is not keep
// (keep "" marks all of them: the host is gone) and tells the gateways.
// It returns the placements it marked, so runs among them can be ended.
func (p *Postgres) FenceHost(ctx context.Context, host, keep string) ([]Placement, error) {
	var out []Placement
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE sessions SET lost = true, lost_at = $3 WHERE host = $1 AND epoch <> $2 AND NOT lost AND closed_at = 0
			RETURNING id, kind, owner, epoch`, host, keep, toMillis(p.nowMillis()))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Placement, error) {
			pl := Placement{Host: host, Lost: true}
			return pl, r.Scan(&pl.ID, &pl.Kind, &pl.Owner, &pl.Epoch)
		})
		if err != nil || len(out) == 0 {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, "h:"+host)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fence host %s: %w", host, err)
	}
	return out, nil
}

// PutHost records what a gateway saw of a host.
func (p *Postgres) PutHost(ctx context.Context, h HostRecord) error {
	_, err := p.pool.Exec(ctx, `INSERT INTO hosts (name, url, epoch, ready, slots, used, seen_at) VALUES ($1,$2,$3,$4,$5,$6,$7)
		ON CONFLICT (name) DO UPDATE SET url=$2, epoch=$3, ready=$4, slots=$5, used=$6, seen_at=$7`,
		h.Name, h.URL, h.Epoch, h.Ready, h.Slots, h.Used, toMillis(h.SeenAt))
	if err != nil {
		return fmt.Errorf("record host %s: %w", h.Name, err)
	}
	return nil
}

// GetHost returns the last record of a host, or ErrNotFound.
func (p *Postgres) GetHost(ctx context.Context, name string) (*HostRecord, error) {
	h := HostRecord{Name: name}
	var seen int64
	err := p.pool.QueryRow(ctx, `SELECT url, epoch, ready, slots, used, seen_at FROM hosts WHERE name = $1`, name).
		Scan(&h.URL, &h.Epoch, &h.Ready, &h.Slots, &h.Used, &seen)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("host %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("look up host %s: %w", name, err)
	}
	h.SeenAt = fromMillis(seen)
	return &h, nil
}

// Registration is a host's record of itself in the cell, renewed by its
// heartbeat: for cells whose gateways find hosts in PostgreSQL rather
// than in Kubernetes or a static list.
type Registration struct {
	Name  string // the host's name in the cell (stable across restarts)
	URL   string // its base URL, as gateways reach it
	Epoch string // the host process's epoch
	// Ready is false once the host drains: it takes no new sessions.
	Ready bool
	Slots int
	Used  int
	// Templates are the host's templates, by name.
	Templates []string
	BeatAt    time.Time // when the host last renewed it (set by Heartbeat)
}

// Heartbeat records (or renews) a host's registration, stamped now.
func (p *Postgres) Heartbeat(ctx context.Context, r Registration) error {
	_, err := p.pool.Exec(ctx, `INSERT INTO host_heartbeats (name, url, epoch, ready, slots, used, beat_at, templates) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)
		ON CONFLICT (name) DO UPDATE SET url=$2, epoch=$3, ready=$4, slots=$5, used=$6, beat_at=$7, templates=$8`,
		r.Name, r.URL, r.Epoch, r.Ready, r.Slots, r.Used, toMillis(p.nowMillis()), strings.Join(r.Templates, ","))
	if err != nil {
		return fmt.Errorf("heartbeat of host %s: %w", r.Name, err)
	}
	return nil
}

// Deregister removes a host's registration, if epoch still holds it (a
// newer process of the same name has taken it over otherwise).
func (p *Postgres) Deregister(ctx context.Context, name, epoch string) error {
	if _, err := p.pool.Exec(ctx, `DELETE FROM host_heartbeats WHERE name = $1 AND epoch = $2`, name, epoch); err != nil {
		return fmt.Errorf("deregister host %s: %w", name, err)
	}
	return nil
}

// Registrations returns the hosts whose last heartbeat is at most within
// old, by name.
func (p *Postgres) Registrations(ctx context.Context, within time.Duration) ([]Registration, error) {
	rows, err := p.pool.Query(ctx, `SELECT name, url, epoch, ready, slots, used, beat_at, templates FROM host_heartbeats WHERE beat_at >= $1 ORDER BY name`,
		toMillis(p.nowMillis().Add(-within)))
	if err != nil {
		return nil, fmt.Errorf("list registered hosts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Registration, error) {
		var g Registration
		var beat int64
		var templates string
		err := r.Scan(&g.Name, &g.URL, &g.Epoch, &g.Ready, &g.Slots, &g.Used, &beat, &templates)
		g.BeatAt = fromMillis(beat)
		if templates != "" {
			g.Templates = strings.Split(templates, ",")
		}
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("list registered hosts: %w", err)
	}
	return out, nil
}

// Pruned counts what Prune deleted.
type Pruned struct {
	Sessions, Hosts, Registrations int64
}

// Prune deletes what a cell no longer needs, older than retention: the
// rows of sessions marked lost, or closed, that long ago; of sessions (and MCP
// sessions) created longer ago than maxLifetime + retention (no host
// keeps one past its --max-lifetime, so it has closed: idle-reaped or
// expired on its host, which tells no gateway); of runs placed that long
// ago that are not running (the shared history still has them); and of
// hosts and registrations not seen for that long. maxLifetime 0 keeps
// live sessions' rows.
func (p *Postgres) Prune(ctx context.Context, retention, maxLifetime time.Duration) (Pruned, error) {
	var n Pruned
	now := p.nowMillis()
	cut := toMillis(now.Add(-retention))
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM sessions WHERE lost AND lost_at < $1 OR closed_at <> 0 AND closed_at < $1`, cut)
		if err != nil {
			return err
		}
		n.Sessions = tag.RowsAffected()
		if maxLifetime > 0 {
			if tag, err = tx.Exec(ctx, `DELETE FROM sessions WHERE kind <> $1 AND created_at < $2`, KindRun, toMillis(now.Add(-retention-maxLifetime))); err != nil {
				return err
			}
			n.Sessions += tag.RowsAffected()
		}
		if tag, err = tx.Exec(ctx, `DELETE FROM sessions s WHERE kind = $1 AND created_at < $2
			AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = s.id AND r.status = 'running')`, KindRun, cut); err != nil {
			return err
		}
		n.Sessions += tag.RowsAffected()
		if tag, err = tx.Exec(ctx, `DELETE FROM hosts WHERE seen_at < $1`, cut); err != nil {
			return err
		}
		n.Hosts = tag.RowsAffected()
		if tag, err = tx.Exec(ctx, `DELETE FROM host_heartbeats WHERE beat_at < $1`, cut); err != nil {
			return err
		}
		n.Registrations = tag.RowsAffected()
		return nil
	})
	if err != nil {
		return Pruned{}, fmt.Errorf("prune the cell's tables: %w", err)
	}
	return n, nil
}

// Listen calls fn with every payload sent on NotifyChannel until ctx ends.
// It keeps one connection of its own and reconnects when it breaks (the
// server restarted); after every (re)connection it calls fn("") first,
// since notifications sent meanwhile were missed: the caller drops
// everything it cached. connected, if not nil, learns each change of state.
func (p *Postgres) Listen(ctx context.Context, fn func(payload string), connected func(bool)) {
	if connected == nil {
		connected = func(bool) {}
	}
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := p.listenOnce(ctx, fn, connected)
		connected(false)
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("placement notifications lost; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (p *Postgres) listenOnce(ctx context.Context, fn func(string), connected func(bool)) error {
	conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	connected(true)
	fn("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n.Payload)
	}
}
