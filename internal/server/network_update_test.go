package server

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/session"
)

// PATCH /v1/sessions/{id}/network changes a running session's allowlist:
// an HTTPS site under a .invalid name on this machine is refused, reached
// after the update, refused after the next; GET shows the list in force.
func TestUpdateNetworkOverHTTP(t *testing.T) {
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the site") }), "site.invalid")
	site := "site.invalid:" + strconv.Itoa(egresstest.Port(srv))
	max, err := egress.ParseAllowlist([]string{"*.invalid:*", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, session.ManagerOptions{EgressLookup: egresstest.Resolver(map[string][]string{"site.invalid": {"127.0.0.1"}})},
		Options{Tokens: []string{tokenA, tokenB}, Egress: EgressOptions{Max: max}})

	var s sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions", `{"network": "allow", "allow": [], "env": {"SSL_CERT_FILE": "/workspace/ca.pem"}}`, &s); resp.StatusCode != 201 {
		t.Fatalf("create with an empty list: %d", resp.StatusCode)
	}
	if s.Mode != "allow" || len(s.Allow) != 0 {
		t.Fatalf("created: %+v", s)
	}
	ts.do(t, "PUT", "/v1/sessions/"+s.ID+"/files/ca.pem", string(ca.PEM), nil)
	fetch := func() string {
		t.Helper()
		r := ts.exec(t, s.ID, fmt.Sprintf(`
import urllib.request
try:
    print(urllib.request.urlopen("https://%s/", timeout=20).read().decode())
except Exception as e:
    print(e)`, site))
		return strings.TrimSpace(r.Stdout + r.Stderr)
	}
	patch := func(body string) sessionJSON {
		t.Helper()
		var out sessionJSON
		if resp := ts.do(t, "PATCH", "/v1/sessions/"+s.ID+"/network", body, &out); resp.StatusCode != 200 {
			t.Fatalf("PATCH %s: %d", body, resp.StatusCode)
		}
		return out
	}
	if got := fetch(); !strings.Contains(got, "403 sandloop: egress to "+site+" is not allowed; allowed: nothing") {
		t.Fatalf("before the update: %q", got)
	}
	if got := patch(`{"allow": ["` + site + `", "127.0.0.1"]}`); strings.Join(got.Allow, ",") != site+",127.0.0.1" || got.Mode != "allow" {
		t.Errorf("PATCH answered %+v", got)
	}
	var now sessionJSON
	ts.do(t, "GET", "/v1/sessions/"+s.ID, "", &now)
	if strings.Join(now.Allow, ",") != site+",127.0.0.1" {
		t.Errorf("GET after the update: allow %v", now.Allow)
	}
	if got := fetch(); got != "hello from the site" {
		t.Fatalf("after the update: %q", got)
	}
	patch(`{"allow": ["127.0.0.1"]}`)
	if got := fetch(); !strings.Contains(got, "403 sandloop: egress to "+site+" is not allowed; allowed: 127.0.0.1") {
		t.Fatalf("after the second update: %q", got)
	}
	var nl struct {
		Allow []string
	}
	ts.do(t, "GET", "/v1/sessions/"+s.ID+"/network", "", &nl)
	if strings.Join(nl.Allow, ",") != "127.0.0.1" {
		t.Errorf("the network log's allowlist: %v", nl.Allow)
	}

	plain := ts.create(t, `{"network": "none"}`)
	for _, c := range []struct {
		id, body string
		status   int
		code     string
		msg      string
	}{
		{s.ID, `{}`, 400, "bad_request", `send {"allow": [...]}`},
		{s.ID, `{"allow": "x"}`, 400, "bad_request", `field "allow" must be`},
		{s.ID, `{"allow": ["exa mple"]}`, 400, "bad_request", "not a host name"},
		{s.ID, `{"allow": ["example.org"]}`, 403, "network_not_allowed", "example.org: not within what this server allows"},
		{s.ID, `{"allow": [], "mode": "x"}`, 400, "bad_request", `unknown field "mode"`},
		{plain, `{"allow": ["site.invalid"]}`, 409, "no_allowlist", `was created with network "none"`},
		{"nope", `{"allow": []}`, 404, "not_found", "not found"},
	} {
		var e struct {
			Error struct{ Code, Message string }
		}
		resp := ts.do(t, "PATCH", "/v1/sessions/"+c.id+"/network", c.body, &e)
		if resp.StatusCode != c.status || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("PATCH %s %s: %d %+v, want %d %s %q", c.id, c.body, resp.StatusCode, e.Error, c.status, c.code, c.msg)
		}
	}
	// Another token's caller cannot change it.
	if resp := ts.do(t, "PATCH", "/v1/sessions/"+s.ID+"/network", `{"allow": []}`, nil, "Authorization", "Bearer "+tokenB); resp.StatusCode != 404 {
		t.Errorf("another owner: %d", resp.StatusCode)
	}
	ts.do(t, "GET", "/v1/sessions/"+s.ID, "", &now)
	if strings.Join(now.Allow, ",") != "127.0.0.1" {
		t.Errorf("after refused updates: allow %v", now.Allow)
	}
}
