package webui

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

// newServer starts the real API server, with the UI mounted as
// `sandloop serve` mounts it, and a scripted model behind the runs service.
func newServer(t *testing.T, token string, script llmtest.Script) *httptest.Server {
	t.Helper()
	rs := runstest.New(t, script)
	return serve(t, token, rs.Manager, rs.Runs, rs.Store)
}

// newServerWithModel is newServer with the runs' model resolved by
// provider (a model server of the test's own, or none at all).
func newServerWithModel(t *testing.T, token string, provider func(ctx context.Context, model string) (llm.Provider, error)) *httptest.Server {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr := session.NewManager(&session.ManagerOptions{})
	svc := runs.New(&runs.Options{Store: st, Provider: provider, NewSession: runs.ManagerSessions(mgr)})
	t.Cleanup(func() {
		svc.Close()
		mgr.Close()
		st.Close()
	})
	return serve(t, token, mgr, svc, st)
}

func serve(t *testing.T, token string, mgr *session.Manager, svc *runs.Service, st store.History) *httptest.Server {
	t.Helper()
	opts := server.Options{Manager: mgr, Runs: svc, Store: st, Keepalive: time.Second, PublicMounts: Mounts()}
	if token != "" {
		opts.Tokens = []string{token}
	}
	srv, err := server.New(&opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { // before the service (cleanups run last first)
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs
}

var _ http.Handler = Handler()

// jsonArgs is a tool call's arguments with one string field.
func jsonArgs(key, value string) string {
	b, _ := json.Marshal(map[string]string{key: value})
	return string(b)
}
