// Package store keeps the history of agent runs: runs, their steps, an
// append-only event log for replay, and the final files. History is the
// interface; Store keeps it in SQLite (the embedded default for one
// machine) and Postgres in PostgreSQL (a cell's shared database, which also
// holds the cell's hosts and sessions tables, cluster.go). Both pass one
// test suite, and share the history's SQL: it is written once against a
// small dialect-neutral layer (dialect.go: ? placeholders, row scanning
// and collecting, the few phrases the two databases say differently),
// while each backend keeps its own connections and transactions.
//
// The database is in WAL mode so that readers (the web UI, `sandloop runs`) never wait
// for the agent writing. Writes go through one connection, which serializes them in
// this process without SQLITE_BUSY; other processes writing the same file (the CLI
// while a server runs) wait on the busy timeout, and transactions take the write lock
// up front (BEGIN IMMEDIATE) so two writers cannot deadlock upgrading a read lock.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver (pure Go: the binary stays static)
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrNotFound is returned (wrapped) for a run, or a file of a run, that does not exist.
var ErrNotFound = errors.New("not found")

// ErrAmbiguous is returned by LookupRunID when a prefix matches several runs.
var ErrAmbiguous = errors.New("ambiguous run id prefix")

// Options configures a Store. The zero value is ready to use.
type Options struct {
	// BusyTimeout is how long a write waits for another process's write lock.
	// If zero, 5s.
	BusyTimeout time.Duration
	// Readers is the size of the read connection pool. If zero, 4.
	Readers int
	// Logger receives migrations and slow oddities. If nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now. Tests set it.
	Now func() time.Time
}

// Store is a run history in one SQLite file. It is safe for concurrent use.
type Store struct {
	w   *sql.DB // one connection: the single writer
	r   *sql.DB // readers
	log *slog.Logger
	now func() time.Time
}

// Open opens (creating if needed) the database at path and brings its schema up to
// date. opts may be nil.
func Open(ctx context.Context, path string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.Readers <= 0 {
		o.Readers = 4
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Store{log: o.Logger, now: o.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}

	// A file: URI so that a path holding '?' or '#' is not read as parameters.
	base := "file:" + (&url.URL{Path: path}).EscapedPath()
	pragmas := url.Values{"_pragma": {
		"busy_timeout(" + strconv.FormatInt(o.BusyTimeout.Milliseconds(), 10) + ")",
		"foreign_keys(1)",
		"journal_mode(WAL)",
		// NORMAL is durable in WAL mode except for the last transactions before a
		// power cut, which is the right trade for a history log.
		"synchronous(NORMAL)",
	}}
	wq := cloneValues(pragmas)
	wq.Set("_txlock", "immediate")
	w, err := sql.Open("sqlite", base+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := connect(ctx, w, o.BusyTimeout); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s.w = w
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}

	rq := cloneValues(pragmas)
	// Readers refuse writes: a stray write through them would bypass the single writer.
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", base+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	r.SetMaxOpenConns(o.Readers)
	r.SetMaxIdleConns(o.Readers)
	s.r = r
	return s, nil
}

// connect opens db's first connection, waiting up to wait while the
// database is busy: turning a new database to WAL (a pragma every
// connection runs) takes a lock SQLite does not wait for, so a second
// program opening the same new database at that moment fails at once.
func connect(ctx context.Context, db *sql.DB, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := db.PingContext(ctx)
		var se *sqlite.Error
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// Close closes the database. Calls after Close fail.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

func (s *Store) nowMillis() time.Time { return s.now().UTC().Truncate(time.Millisecond) }

// inTx and inSnapshot are write and read transactions for the shared SQL.
func (s *Store) inTx(ctx context.Context) txFunc {
	return func(fn func(db) error) error { return s.write(ctx, func(tx *sql.Tx) error { return fn(sqlDB{tx}) }) }
}

func (s *Store) inSnapshot(ctx context.Context) txFunc {
	return func(fn func(db) error) error { return s.read(ctx, func(tx *sql.Tx) error { return fn(sqlDB{tx}) }) }
}

// write runs fn in a write transaction.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// newID returns a random run id: 16 hex digits, short enough to type a prefix of.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(b[:])
}

// Times are stored as Unix milliseconds: sortable, compact, and exact on the way back.
func toMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// nullJSON stores empty JSON as NULL.
func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
