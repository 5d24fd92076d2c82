package webui

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	os.Exit(m.Run())
}

// newServer starts the real API server, with the UI mounted as
// `sandloop serve` mounts it, and a scripted model behind the runs service.
func newServer(t *testing.T, token string, script llmtest.Script) *httptest.Server {
	t.Helper()
	llmSrv := llmtest.NewOpenAIServer(t, script)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := session.NewManager(session.ManagerOptions{})
	svc := runs.New(runs.Options{
		Store: st,
		Provider: func(ctx context.Context, model string) (llm.Provider, error) {
			return llm.NewOpenAI(llm.OpenAIOptions{BaseURL: llmSrv.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
		},
		NewSession: runs.ManagerSessions(mgr),
	})
	opts := server.Options{Manager: mgr, Runs: svc, Store: st, Keepalive: time.Second, PublicMounts: Mounts()}
	if token != "" {
		opts.Tokens = []string{token}
	}
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		svc.Close()
		mgr.Close()
	})
	return hs
}

var _ http.Handler = Handler()

// jsonArgs is a tool call's arguments with one string field.
func jsonArgs(key, value string) string {
	b, _ := json.Marshal(map[string]string{key: value})
	return string(b)
}
