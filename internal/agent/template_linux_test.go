package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

// TestSystemPromptNamesTheEnvironment: the model is told the session's
// Python version and, in a template's session, the packages the template
// installed (so that it does not pip install them); a default session's
// prompt names no template.
func TestSystemPromptNamesTheEnvironment(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-agent", "for the agent")
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := st.Build(context.Background(), "agentenv", template.Spec{Pip: []string{"sandloop-tmpl-agent==1.0"}}, ix.BuildOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Remove("agentenv") })
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	m := session.NewManager(&session.ManagerOptions{Templates: pool})
	t.Cleanup(func() { m.Close() })

	for _, tc := range []struct {
		name     string
		template string
		want     []string
		not      []string
	}{
		{"template", "agentenv", []string{"Python is " + tm.Python + ",", `template "agentenv"`, "sandloop-tmpl-agent 1.0", "do not pip install"}, nil},
		{"default", "", []string{"Python is " + session.SystemPythonVersion() + "."}, []string{"template", "sandloop-tmpl-agent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := m.Create(context.Background(), session.CreateOptions{Template: tc.template})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			for _, kind := range []providerKind{openAI, anthropic} {
				p, srv := newProvider(t, kind, llmtest.Script{
					{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import sys; print(sys.version.split()[0])"))}},
					{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"done"}`)}},
				})
				rep, err := Run(context.Background(), &Options{Task: "say the version", Provider: p, Session: s})
				if err != nil || rep.Status != StatusDone {
					t.Fatalf("run: %v %+v", err, rep)
				}
				reqs := srv.Requests()
				sys := reqs[0].System()
				for _, w := range tc.want {
					if !strings.Contains(sys, w) {
						t.Errorf("%d: the system prompt lacks %q:\n%s", kind, w, sys)
					}
				}
				for _, n := range tc.not {
					if strings.Contains(sys, n) {
						t.Errorf("%d: the system prompt has %q:\n%s", kind, n, sys)
					}
				}
				// What the prompt says is what the session runs.
				version := tm.Python
				if tc.template == "" {
					version = session.SystemPythonVersion()
				}
				if res := reqs[1].ToolResults(); len(res) == 0 || !strings.Contains(res[len(res)-1].Text, version) {
					t.Errorf("%d: the session's Python is not %s: %+v", kind, version, res)
				}
			}
		})
	}
}
