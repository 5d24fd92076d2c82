package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

// TestPlacementByTemplate: hosts advertise their templates (to the
// gateway's health rounds, and in their registration); a session that
// names a template is placed on a host that has it, one naming a template
// no host has is a clear 404, and one naming none goes anywhere.
func TestPlacementByTemplate(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-gw", "on the right host")
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Remove("gwt"); os.RemoveAll(dir) })
	if _, err := st.Build(context.Background(), "gwt", template.Spec{Pip: []string{"sandloop-tmpl-gw"}}, ix.BuildOptions()); err != nil {
		t.Fatal(err)
	}
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)

	f := newFixture(t, 2)
	f.hosts[1].templates = pool
	f.hosts[1].restart()
	f.gw.Refresh(t.Context())
	withTemplate := f.hosts[1].ts.Listener.Addr().String()

	for range 2 {
		st, body := f.do(tok1, "POST", "/v1/sessions", `{"template": "gwt"}`)
		if st != http.StatusCreated {
			t.Fatalf("create with the template: %d %s", st, body)
		}
		var s struct{ ID, Template string }
		json.Unmarshal([]byte(body), &s)
		pl, err := f.pg.GetPlacement(t.Context(), s.ID)
		if err != nil || pl.Host != withTemplate || s.Template != "gwt" {
			t.Fatalf("placed on %v (%v), template %q; want %s", pl, err, s.Template, withTemplate)
		}
		if st, body := f.do(tok1, "POST", "/v1/sessions/"+s.ID+"/execute", `{"code":"import sandloop_tmpl_gw; print(sandloop_tmpl_gw.VALUE)"}`); st != 200 || !strings.Contains(body, "on the right host") {
			t.Errorf("execute in the template's session: %d %s", st, body)
		}
	}
	if st, body := f.do(tok1, "POST", "/v1/sessions", `{"template": "nowhere"}`); st != http.StatusNotFound || !strings.Contains(body, "template_not_found") || !strings.Contains(body, "no host of this cell has the template nowhere") {
		t.Errorf("a template no host has: %d %s", st, body)
	}
	// No template: either host (host 0 has the room left).
	if _, host := f.create(tok1); host == "" {
		t.Error("a session without a template was not placed")
	}
	var hosts []HostInfo
	_, body := f.do(tok1, "GET", "/v1/hosts", "")
	json.Unmarshal([]byte(body), &hosts)
	for _, h := range hosts {
		if has := slices.Contains(h.Templates, "gwt"); has != (h.Name == withTemplate) {
			t.Errorf("GET /v1/hosts: %s lists templates %v", h.Name, h.Templates)
		}
	}
	// The host's health tells its templates to the gateway only.
	resp, err := http.Get(f.hosts[1].ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var pub map[string]any
	json.NewDecoder(resp.Body).Decode(&pub)
	resp.Body.Close()
	if _, ok := pub["templates"]; ok {
		t.Errorf("the public health answer lists the templates: %v", pub)
	}

	// A registration carries them too, through PostgreSQL.
	if err := f.pg.Heartbeat(t.Context(), store.Registration{Name: "reg-host", URL: "http://reg-host:8080", Epoch: "e", Ready: true, Slots: 2, Templates: []string{"gwt", "other"}}); err != nil {
		t.Fatal(err)
	}
	regs, err := f.pg.Registrations(t.Context(), 1<<62)
	if err != nil || len(regs) != 1 || !slices.Equal(regs[0].Templates, []string{"gwt", "other"}) {
		t.Fatalf("registrations: %+v %v", regs, err)
	}
	d := NewRegistered(f.pg, 1<<62, nil)
	if err := d.Refresh(t.Context()); err != nil || len(d.Targets()) != 1 || !slices.Equal(d.Targets()[0].Templates, []string{"gwt", "other"}) {
		t.Errorf("registered discovery: %+v %v", d.Targets(), err)
	}
}
