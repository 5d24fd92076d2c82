package e2b

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

// E2B's create picks a template by its templateID; E2B's own names give
// a default sandbox, and any other name the 404 E2B's SDKs raise as
// their not-found SandboxError.
func TestCreateFromTemplate(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-e2b", "from e2b")
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Remove("datasci"); os.RemoveAll(dir) })
	if _, err := st.Build(context.Background(), "datasci", template.Spec{Pip: []string{"sandloop-tmpl-e2b"}}, ix.BuildOptions()); err != nil {
		t.Fatal(err)
	}
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	mgr := session.NewManager(&session.ManagerOptions{Templates: pool})
	h, err := New(&Options{Manager: mgr, Keys: map[string]string{keyA: "owner-a"}, HasTemplate: pool.Has})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() { hs.Close(); h.Close(); mgr.Close() })
	ts := &testServer{Server: hs, h: h, mgr: mgr}

	run := func(c created, code string) string {
		resp, b := ts.call(t, "POST", "/execute", strings.NewReader(`{"code":`+jsonString(code)+`}`), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
			"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
		if resp.StatusCode != 200 {
			t.Fatalf("execute: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	c := ts.create(t, keyA, `{"templateID":"datasci"}`)
	if c.TemplateID != "datasci" {
		t.Errorf("templateID: %+v", c)
	}
	if out := run(c, "import sandloop_tmpl_e2b; print(sandloop_tmpl_e2b.VALUE)"); !strings.Contains(out, `"text":"from e2b\n"`) {
		t.Errorf("in the template's sandbox: %s", out)
	}
	base := ts.create(t, keyA, `{"templateID":"base"}`)
	if out := run(base, "import sandloop_tmpl_e2b"); !strings.Contains(out, "ModuleNotFoundError") {
		t.Errorf("a base sandbox has the template's package: %s", out)
	}
	resp, b := ts.control(t, "POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`, keyA)
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"code":404`) || !strings.Contains(string(b), "template 'no-such-template' not found") {
		t.Errorf("unknown template: %d %s", resp.StatusCode, b)
	}
}

func jsonString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// TestSDKTemplateBuild drives E2B's template API with E2B's real SDK
// (testdata/sdk/template.mjs): aliasExists, Template.build of pip packages
// and variables (a sandloop template built through a local index), a
// sandbox of it, builds sandloop cannot make refused with their reason,
// deleteSnapshot's 404.
func TestSDKTemplateBuild(t *testing.T) {
	e2btest.SDK(t)
	ix := templatetest.NewIndex(t, "sandloop-tmpl-sdk", "built by the SDK")
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Remove("sdkbuilt"); os.RemoveAll(dir) })
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	mgr := session.NewManager(&session.ManagerOptions{Templates: pool})
	var builds atomic.Int32
	h, err := New(&Options{Manager: mgr, Keys: map[string]string{keyA: "owner-a"}, HasTemplate: pool.Has,
		BuildTemplate: func(ctx context.Context, name string, spec template.Spec) (*template.Template, error) {
			builds.Add(1)
			return st.Build(ctx, name, spec, ix.BuildOptions())
		}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() { hs.Close(); h.Close(); mgr.Close() })
	out, err := e2btest.RunScript(t, e2btest.Env{URL: hs.URL, Key: keyA}, 5*time.Minute, "template.mjs", "sdkbuilt", ix.Dist, ix.Module, ix.Value)
	const steps = 7
	if ok := strings.Count("\n"+string(out), "\nok "); err != nil || ok != steps || !strings.HasSuffix(string(out), "done\n") {
		t.Fatalf("node template.mjs: %v (%d steps ok, want %d)\n%s", err, ok, steps, out)
	}
	if n := builds.Load(); n != 2 {
		t.Errorf("%d builds ran, want 2 (the refused ones must not start)", n)
	}
	tm, err := st.Get("sdkbuilt")
	if err != nil || tm.Env["GREETING"] != "from the template" {
		t.Errorf("the stored template: %v %+v", err, tm)
	}
}
