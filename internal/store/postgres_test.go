package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// TestPostgres runs the shared suite against a real PostgreSQL server,
// each test in a database of its own.
func TestPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	b := backend{
		fresh: func(t *testing.T) string { return srv.NewDatabase(t) },
		openRaw: func(ctx context.Context, db string, opts *Options) (History, error) {
			return OpenHistory(ctx, db, opts)
		},
		checkSchema: func(t *testing.T, h History) {
			var version, tables int
			p := h.(*Postgres)
			if err := p.pool.QueryRow(t.Context(), `SELECT version FROM sandloop_schema`).Scan(&version); err != nil || version != len(pgMigrations) {
				t.Errorf("schema version = %d (%v), want %d", version, err, len(pgMigrations))
			}
			if err := p.pool.QueryRow(t.Context(), `SELECT count(*) FROM sandloop_schema`).Scan(&tables); err != nil || tables != 1 {
				t.Errorf("%d version rows (%v)", tables, err)
			}
		},
	}
	runShared(t, b)

	t.Run("NewerSchemaRefused", func(t *testing.T) {
		db := srv.NewDatabase(t)
		p := b.open(t, db, nil).(*Postgres)
		if _, err := p.pool.Exec(t.Context(), fmt.Sprintf(`UPDATE sandloop_schema SET version = %d`, len(pgMigrations)+1)); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenPostgres(t.Context(), db, nil); err == nil || !strings.Contains(err.Error(), "newer") {
			t.Errorf("err = %v, want a refusal of the newer schema", err)
		}
	})
	t.Run("BadURL", func(t *testing.T) {
		_, err := OpenPostgres(t.Context(), "postgres://u:secret@[bad", nil)
		if err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("err = %v, want an error that does not show the password", err)
		}
	})
}
