package main

import (
	"path/filepath"
	"testing"

	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// TestOpenStoreSwitchesBackend: --database or SANDLOOP_DATABASE_URL with a
// postgres:// URL selects PostgreSQL; nothing selects SQLite in --data-dir.
func TestOpenStoreSwitchesBackend(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewDatabase(t)
	dir := t.TempDir()
	cases := []struct {
		name, flag, env string
		postgres        bool
	}{
		{"default", "", "", false},
		{"flag", url, "", true},
		{"env", "", url, true},
		{"sqlite file by flag", filepath.Join(dir, "other.db"), "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SANDLOOP_DATABASE_URL", tc.env)
			st, err := openStore(t.Context(), dir, tc.flag)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, ok := st.(*store.Postgres); ok != tc.postgres {
				t.Errorf("got %T, want postgres=%v", st, tc.postgres)
			}
			if _, err := st.CreateRun(t.Context(), store.Run{Task: "t"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
