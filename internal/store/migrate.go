package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are applied in order, each once; PRAGMA user_version records how many
// have been. Never edit one that has shipped: append a new one.
var migrations = []string{
	// 1: the initial schema.
	`
CREATE TABLE runs (
	id         TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	task       TEXT NOT NULL,
	mode       TEXT NOT NULL,
	model      TEXT NOT NULL,
	status     TEXT NOT NULL,
	steps      INTEGER NOT NULL DEFAULT 0,
	tokens_in  INTEGER NOT NULL DEFAULT 0,
	tokens_out INTEGER NOT NULL DEFAULT 0,
	cost_usd   REAL NOT NULL DEFAULT 0,
	summary    TEXT NOT NULL DEFAULT '',
	error      TEXT NOT NULL DEFAULT '',
	report     TEXT CHECK (report IS NULL OR json_valid(report))
) STRICT;
CREATE INDEX runs_by_created ON runs (created_at DESC, id);
CREATE INDEX runs_by_status ON runs (status, created_at DESC);

CREATE TABLE steps (
	run_id     TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	idx        INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	name       TEXT NOT NULL DEFAULT '',
	data       TEXT CHECK (data IS NULL OR json_valid(data)),
	tokens_in  INTEGER NOT NULL DEFAULT 0,
	tokens_out INTEGER NOT NULL DEFAULT 0,
	cost_usd   REAL NOT NULL DEFAULT 0,
	started_at INTEGER NOT NULL,
	ended_at   INTEGER NOT NULL,
	PRIMARY KEY (run_id, idx)
) STRICT;

CREATE TABLE events (
	run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	seq    INTEGER NOT NULL,
	at     INTEGER NOT NULL,
	type   TEXT NOT NULL,
	data   TEXT CHECK (data IS NULL OR json_valid(data)),
	PRIMARY KEY (run_id, seq)
) STRICT;

CREATE TABLE artifacts (
	run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
	path   TEXT NOT NULL,
	mode   INTEGER NOT NULL,
	size   INTEGER NOT NULL,
	data   BLOB NOT NULL,
	PRIMARY KEY (run_id, path)
) STRICT;
`,
	// 2: who started a run (a hash of the server token; '' for the CLI and
	// for servers without tokens).
	`
ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_by_owner ON runs (owner, created_at DESC);
`,
	// 3: lessons (lessons.go).
	lessonsSchema,
	// 4: whether a run's cost leaves out model calls without a price.
	`ALTER TABLE runs ADD COLUMN cost_unknown INTEGER NOT NULL DEFAULT 0;`,
}

// migrate brings the schema up to date. It runs in one write transaction, which
// BEGIN IMMEDIATE makes exclusive among processes, so two programs opening a new
// database at once apply each migration exactly once.
func (s *Store) migrate(ctx context.Context) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		var version int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if version > len(migrations) {
			return fmt.Errorf("the database has schema version %d, newer than this program's %d; upgrade sandloop", version, len(migrations))
		}
		for i := version; i < len(migrations); i++ {
			if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
			s.log.InfoContext(ctx, "applied store migration", "version", i+1)
		}
		if version < len(migrations) {
			// PRAGMA takes no parameters; the value is our own integer.
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations))); err != nil {
				return fmt.Errorf("set schema version: %w", err)
			}
		}
		return nil
	})
}
