package server

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

// GET /v1/info tells a client whether it needs a token and which model
// runs use, or how to configure one.
func TestInfo(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		ts := newRunsServer(t, nil, "tok-0123456789abcdef")
		var in Info
		if resp := ts.do(t, "GET", "/v1/info", "", &in); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if !in.TokenRequired || !in.Runs.Enabled || in.Runs.Model != "openai-compatible/gpt-4o-mini" || in.Runs.ModelError != "" {
			t.Errorf("info %+v", in)
		}
		ts.token = ""
		if resp := ts.do(t, "GET", "/v1/info", "", nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("without the token: %d, want 401", resp.StatusCode)
		}
	})
	t.Run("no model", func(t *testing.T) {
		st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		svc := runs.New(&runs.Options{Store: st, Provider: func(context.Context, string) (llm.Provider, error) {
			return nil, &llm.NoModelError{}
		}})

		t.Cleanup(func() { svc.Close() })
		ts := newTestServer(t, session.ManagerOptions{}, Options{Runs: svc, Store: st})
		var in Info
		ts.do(t, "GET", "/v1/info", "", &in)
		if in.TokenRequired || !in.Runs.Enabled || in.Runs.Model != "" || in.Runs.ModelError != "no model configured: set SANDLOOP_MODEL or --model" {
			t.Errorf("info %+v", in)
		}
	})
	t.Run("no runs", func(t *testing.T) {
		ts := newTestServer(t, session.ManagerOptions{}, Options{})
		var in Info
		ts.do(t, "GET", "/v1/info", "", &in)
		if in.Runs.Enabled || in.Runs.ModelError != "" {
			t.Errorf("info %+v", in)
		}
	})
}
