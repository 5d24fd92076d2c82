package store

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The run history's SQL is written once (runs.go, steps.go, events.go,
// artifacts.go, export.go) against db, which each backend adapts: SQLite
// through database/sql, PostgreSQL through pgx. Queries use ? placeholders
// (PostgreSQL's adapter numbers them); what differs between the two
// dialects is in dialect. Transactions stay each backend's own: SQLite
// serializes writers on one connection, PostgreSQL locks the run's row.

// txFunc runs fn in one backend's transaction: a write (which the shared
// SQL may lock runs in), or a read snapshot.
type txFunc func(fn func(db) error) error

// db is a connection pool or a transaction of either backend.
type db interface {
	exec(ctx context.Context, q string, args ...any) (rowsAffected int64, err error)
	// execEach runs q once per argument list, in one round trip where
	// the backend can.
	execEach(ctx context.Context, q string, argLists [][]any) error
	query(ctx context.Context, q string, args ...any) (rows, error)
	queryRow(ctx context.Context, q string, args ...any) scanner
	dialect() *dialect
}

// rows is a query's result, as both *sql.Rows and pgx.Rows give it.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type scanner interface{ Scan(dest ...any) error }

// dialect is what the shared SQL says differently to each database.
type dialect struct {
	// text reads a JSON column as text (NULL stays NULL).
	text func(col string) string
	// lock is appended to a SELECT of a run's row in a write transaction,
	// so the writers of one run take turns ("": SQLite has one writer).
	lock string
	// noLimit is the LIMIT argument meaning all rows.
	noLimit any
	// greatest is the function of the larger of two values.
	greatest string
	// lessonsFTS is the full-text table kept beside lessons by the writes
	// that change them (SQLite's FTS5), or "" where the index follows
	// the table by itself (PostgreSQL's generated tsvector column).
	lessonsFTS string
}

var (
	sqliteDialect = &dialect{text: func(col string) string { return col }, noLimit: -1, greatest: "max", lessonsFTS: "lessons_fts"}
	pgDialect     = &dialect{text: func(col string) string { return col + "::text" }, lock: " FOR UPDATE", noLimit: nil, greatest: "GREATEST"}
)

// isNoRows reports a single-row query that found nothing, in either backend.
func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows) }

// collect scans every row with scan, closing rows.
func collect[T any](rs rows, scan func(scanner) (T, error)) ([]T, error) {
	defer rs.Close()
	out := []T{}
	for rs.Next() {
		v, err := scan(rs)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}

// sqlDB adapts a SQLite *sql.DB or *sql.Tx.
type sqlDB struct {
	q interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
		PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	}
}

func (d sqlDB) dialect() *dialect { return sqliteDialect }

func (d sqlDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.q.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDB) execEach(ctx context.Context, q string, argLists [][]any) error {
	stmt, err := d.q.PrepareContext(ctx, q)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, args := range argLists {
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

func (d sqlDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	rs, err := d.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rs}, nil
}

func (d sqlDB) queryRow(ctx context.Context, q string, args ...any) scanner {
	return d.q.QueryRowContext(ctx, q, args...)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// pgDB adapts a PostgreSQL pool or transaction.
type pgDB struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}
}

func (d pgDB) dialect() *dialect { return pgDialect }

func (d pgDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := d.q.Exec(ctx, numbered(q), args...)
	return tag.RowsAffected(), err
}

func (d pgDB) execEach(ctx context.Context, q string, argLists [][]any) error {
	var b pgx.Batch
	q = numbered(q)
	for _, args := range argLists {
		b.Queue(q, args...)
	}
	return d.q.SendBatch(ctx, &b).Close()
}

func (d pgDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	return d.q.Query(ctx, numbered(q), args...)
}

func (d pgDB) queryRow(ctx context.Context, q string, args ...any) scanner {
	return d.q.QueryRow(ctx, numbered(q), args...)
}

var numberedCache sync.Map // query with ? → query with $1, $2, ...

// numbered turns q's ? placeholders into PostgreSQL's $1, $2, ... (the
// shared queries hold no ? inside string literals).
func numbered(q string) string {
	if v, ok := numberedCache.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	out := b.String()
	numberedCache.Store(q, out)
	return out
}
