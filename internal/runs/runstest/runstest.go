// Package runstest starts a runs service for tests of what is built on it:
// a real run history (SQLite in a temporary directory), a real session
// manager, and a scripted model behind the real OpenAI SDK client.
package runstest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

// Service is a runs service and what it stands on. All of it is closed
// when the test ends.
type Service struct {
	Runs    *runs.Service
	Store   store.History
	Manager *session.Manager
}

// New starts a service whose model answers with script; configure, if
// given, changes its options before it starts.
func New(t *testing.T, script llmtest.Script, configure ...func(*runs.Options)) *Service {
	t.Helper()
	llmSrv := llmtest.NewOpenAIServer(t, script)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr := session.NewManager(&session.ManagerOptions{})
	opts := &runs.Options{
		Store: st,
		Provider: func(ctx context.Context, model string) (llm.Provider, error) {
			return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: llmSrv.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
		},
		NewSession: runs.ManagerSessions(mgr),
	}
	for _, c := range configure {
		c(opts)
	}
	svc := runs.New(opts)

	t.Cleanup(func() {
		svc.Close()
		mgr.Close()
		st.Close()
	})
	return &Service{Runs: svc, Store: st, Manager: mgr}
}
