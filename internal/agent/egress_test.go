package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/session"
)

// install_packages in allow mode: pip reaches a local index through the
// session's egress proxy, and the connections land in the run's history.
func TestInstallPackagesThroughTheAllowlist(t *testing.T) {
	ca := egresstest.NewCA(t)
	wheels := t.TempDir()
	egresstest.BuildWheel(t, wheels, "sandloop-agent-demo", "2.0", "from the local index")
	index := ca.Server(t, egresstest.Index(wheels), "pkgs.test")
	port := strconv.Itoa(egresstest.Port(index))
	al, err := egress.ParseAllowlist([]string{"pkgs.test:" + port, "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "ca.pem"), ca.PEM, 0o644)
	s, err := session.New(context.Background(), &session.Options{Workspace: ws, Env: map[string]string{"PIP_CERT": "/workspace/ca.pem"},
		Egress: &egress.Policy{Allow: al}, EgressLookup: egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}})})

	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolInstallPackages, `{"names":["sandloop-agent-demo"]}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import sandloop_agent_demo; print(sandloop_agent_demo.VALUE)"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"ok"}`)}},
	})
	var events []Event
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: s, Allow: al.Entries(),
		PackageIndex: "https://pkgs.test:" + port + "/simple/", OnEvent: func(e Event) { events = append(events, e) }})

	if err != nil {
		t.Fatal(err)
	}
	if res := srv.Requests()[1].ToolResults()[0]; !strings.Contains(res.Text, "installed sandloop-agent-demo") {
		t.Fatalf("install_packages: %q", res.Text)
	}
	if res := srv.Requests()[2].ToolResults(); !strings.Contains(res[len(res)-1].Text, "from the local index") {
		t.Fatalf("import: %+v", res)
	}
	var logged []egress.Entry
	for _, e := range events {
		if e.Type == EventNetwork {
			logged = append(logged, e.Network...)
		}
	}
	if len(logged) == 0 || !logged[0].Allowed || logged[0].Host != "pkgs.test" || logged[0].Method != "CONNECT" {
		t.Fatalf("network events: %+v", logged)
	}
	if rep.Status != StatusDone {
		t.Errorf("report %+v", rep)
	}
}

// An allowlist without the package index (and no other source) is said
// plainly, with the list.
func TestInstallPackagesAllowlistWithoutTheIndex(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolInstallPackages, `{"names":["leftpad-nonexistent"]}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("print('fallback')"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"ok"}`)}},
	})
	if _, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t), Allow: []string{"api.example.org"}}); err != nil {
		t.Fatal(err)
	}
	res := srv.Requests()[1].ToolResults()[0]
	if !strings.Contains(res.Text, "may reach only api.example.org, which does not include the package index (the pypi preset)") {
		t.Errorf("install_packages: %q", res.Text)
	}
}
