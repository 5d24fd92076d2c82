package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

func newService(t *testing.T, script llmtest.Script) (*Service, *store.Store) {
	t.Helper()
	srv := llmtest.NewOpenAIServer(t, script)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc := New(&Options{
		Store: st,
		Provider: func(ctx context.Context, model string) (llm.Provider, error) {
			return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: srv.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
		},
		NewSession: func(ctx context.Context) (Session, error) {
			return session.New(ctx, &session.Options{})
		},
	})

	t.Cleanup(svc.Close)
	return svc, st
}

func writeCall(path, content string) llmtest.ToolCall {
	b, _ := json.Marshal(map[string]string{"path": path, "content": content})
	return llmtest.ToolCall{Name: agent.ToolWriteFile, Arguments: string(b)}
}

// An app run's final files, exported, unpack to an app whose tests pass in
// a fresh sandbox.
func TestAppRunExportsWorkingApp(t *testing.T) {
	app := "from flask import Flask, jsonify\napp = Flask(__name__)\n\n@app.get('/health')\ndef health():\n    return jsonify(ok=True)\n"
	test := "from app import app\n\ndef test_health():\n    assert app.test_client().get('/health').get_json() == {'ok': True}\n"
	svc, st := newService(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{writeCall("app.py", app), writeCall("test_app.py", test), writeCall("requirements.txt", "flask\n"), writeCall("README.md", "# health\n")}},
		{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolRunShell, Arguments: `{"command":"python3 -m pytest -q"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolFinish, Arguments: `{"summary":"health endpoint"}`}}},
	})
	var seen []string
	run, rep, err := svc.Run(context.Background(), Request{Task: "health API", Mode: agent.ModeApp, OnEvent: func(e agent.Event) { seen = append(seen, e.Type) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != agent.StatusDone || run.Status != "done" || run.Steps != 3 || run.TokensIn == 0 {
		t.Fatalf("run %+v report %+v", run, rep)
	}
	var zip bytes.Buffer
	if err := st.ExportRun(context.Background(), run.ID, &zip); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	arts, err := st.ListArtifacts(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range arts {
		full, _ := st.Artifact(context.Background(), run.ID, a.Path)
		names = append(names, a.Path)
		os.WriteFile(filepath.Join(dir, a.Path), full.Data, 0o644)
	}
	if strings.Join(names, ",") != "README.md,app.py,requirements.txt,test_app.py" {
		t.Errorf("artifacts %v", names)
	}
	var out bytes.Buffer
	res, err := jail.Run(context.Background(), &jail.Config{Path: jail.DefaultPython, Args: []string{"python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"},
		Workspace: dir, Stdout: &out, Stderr: &out, Limits: jail.Limits{Timeout: time.Minute}})
	if err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "1 passed") {
		t.Errorf("the exported app's tests in a fresh sandbox: %v %+v\n%s", err, res, out.String())
	}
	steps, _ := st.ListSteps(context.Background(), run.ID)
	events, _ := st.ListEvents(context.Background(), run.ID, 0, 0)
	if len(steps) < 6 || len(events) < len(seen) {
		t.Errorf("history: %d steps, %d events stored, %d seen", len(steps), len(events), len(seen))
	}
}

func TestWatchReplaysThenFollows(t *testing.T) {
	svc, _ := newService(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolExecutePython, Arguments: `{"code":"import time; time.sleep(1); print('done')"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolFinish, Arguments: `{"summary":"ok"}`}}},
	})
	run, err := svc.Start(context.Background(), Request{Task: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := svc.Watch(context.Background(), run.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seq []int64
	last := ""
	for e := range ch {
		seq = append(seq, e.Seq)
		last = e.Type
	}
	for i, s := range seq {
		if s != int64(i+1) {
			t.Fatalf("events out of order or missing: %v", seq)
		}
	}
	if last != agent.EventFinished {
		t.Errorf("last event %q", last)
	}
	if _, err := svc.Watch(context.Background(), "nope", 0); err == nil {
		t.Error("watching an unknown run")
	}
}

// A run's session lives in the manager under SessionOwner, out of every
// API caller's reach, until the run closes it.
func TestManagerSessions(t *testing.T) {
	mgr := session.NewManager(&session.ManagerOptions{})
	defer mgr.Close()
	s, err := ManagerSessions(mgr)(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := mgr.List(SessionOwner); len(got) != 1 {
		t.Fatalf("run sessions: %d, want 1", len(got))
	}
	if got := mgr.List(""); len(got) != 0 {
		t.Errorf("a caller without a token sees %d run sessions", len(got))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mgr.List(SessionOwner); len(got) != 0 {
		t.Errorf("after Close: %d run sessions", len(got))
	}
}
