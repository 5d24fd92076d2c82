package server

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

func TestSessionsOfATemplate(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-api", "through the API")
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{"api"} {
			st.Remove(n)
		}
		os.RemoveAll(dir)
	})
	if _, err := st.Build(context.Background(), "api", template.Spec{Pip: []string{"sandloop-tmpl-api"}, Preload: []string{"sandloop_tmpl_api"}}, ix.BuildOptions()); err != nil {
		t.Fatal(err)
	}
	pool := template.NewPool(st, nil)
	t.Cleanup(pool.Close)
	ts := newTestServer(t, session.ManagerOptions{Templates: pool}, Options{Templates: pool})

	var list struct{ Templates []templateJSON }
	ts.do(t, "GET", "/v1/templates", "", &list)
	if len(list.Templates) != 1 || list.Templates[0].Name != "api" || list.Templates[0].Packages[0].Name != "sandloop-tmpl-api" || !strings.HasPrefix(list.Templates[0].Python, "3.") {
		t.Fatalf("list: %+v", list)
	}

	var s sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions", `{"template": "api"}`, &s); resp.StatusCode != 201 || s.Template != "api" {
		t.Fatalf("create: %d %+v", resp.StatusCode, s)
	}
	if r := ts.exec(t, s.ID, "import sandloop_tmpl_api; sandloop_tmpl_api.VALUE"); r.MainResult()["text/plain"] != "'through the API'" {
		t.Fatalf("import in the template's session: %+v", r)
	}
	plain := ts.create(t, "")
	if r := ts.exec(t, plain, "import sandloop_tmpl_api"); r.Error == nil || r.Error.Name != "ModuleNotFoundError" {
		t.Errorf("a default session imports the template's package: %+v", r)
	}

	// A server's default template: sessions that name none get it;
	// {"template": ""} asks for the plain environment.
	ds := newTestServer(t, session.ManagerOptions{Templates: pool, DefaultTemplate: "api"}, Options{Templates: pool})
	for _, tc := range []struct{ body, want string }{{`{}`, "api"}, {``, "api"}, {`{"template": null}`, "api"}, {`{"template": ""}`, ""}, {`{"template": "api"}`, "api"}} {
		var got sessionJSON
		if resp := ds.do(t, "POST", "/v1/sessions", tc.body, &got); resp.StatusCode != 201 || got.Template != tc.want {
			t.Errorf("default template, create %s: %d %+v", tc.body, resp.StatusCode, got)
			continue
		}
		r := ds.exec(t, got.ID, "import sandloop_tmpl_api")
		if (r.Error == nil) != (tc.want == "api") {
			t.Errorf("default template, create %s: import: %+v", tc.body, r.Error)
		}
		ds.do(t, "DELETE", "/v1/sessions/"+got.ID, "", nil)
	}

	if resp := ts.do(t, "DELETE", "/v1/templates/api", "", nil); resp.StatusCode != 409 || errCode(t, resp) != "template_in_use" {
		t.Fatalf("delete in use: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "POST", "/v1/sessions", `{"template": "nope"}`, nil); resp.StatusCode != 404 || errCode(t, resp) != "template_not_found" {
		t.Fatalf("unknown template: %d", resp.StatusCode)
	}
	var one templateJSON
	if resp := ts.do(t, "GET", "/v1/templates/api", "", &one); resp.StatusCode != 200 || one.Sessions != 1 {
		t.Fatalf("get: %d %+v", resp.StatusCode, one)
	}
	if resp := ts.do(t, "DELETE", "/v1/sessions/"+s.ID, "", nil); resp.StatusCode != 204 {
		t.Fatalf("delete session: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "DELETE", "/v1/templates/api", "", nil); resp.StatusCode != 204 {
		t.Fatalf("delete unused: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "GET", "/v1/templates/api", "", nil); resp.StatusCode != 404 {
		t.Fatalf("get after delete: %d", resp.StatusCode)
	}
}
