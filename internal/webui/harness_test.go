package webui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/server"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	os.Exit(m.Run())
}

// newServer starts the real API server, with the UI mounted as
// `sandloop serve` mounts it, and a scripted model behind the runs service.
func newServer(t *testing.T, token string, script llmtest.Script) *httptest.Server {
	t.Helper()
	rs := runstest.New(t, script)
	opts := server.Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Keepalive: time.Second, PublicMounts: Mounts()}
	if token != "" {
		opts.Tokens = []string{token}
	}
	srv, err := server.New(opts)
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
