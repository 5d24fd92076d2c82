package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// netWorld is an HTTPS site under a .invalid name on this machine and a
// server whose sandboxes may be allowed to reach it.
type netWorld struct {
	ts   *testServer
	ca   *egresstest.CA
	site string // site.invalid:PORT
}

func newNetWorld(t *testing.T, pool int) *netWorld {
	t.Helper()
	ca := egresstest.NewCA(t)
	srv := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the site") }), "site.invalid")
	max, err := egress.ParseAllowlist([]string{"*.invalid:*", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	lookup := egresstest.Resolver(map[string][]string{"site.invalid": {"127.0.0.1"}})
	mgr := session.NewManager(&session.ManagerOptions{PoolSize: pool, EgressLookup: lookup})
	h, err := New(&Options{Manager: mgr, Keys: map[string]string{keyA: "owner-a", keyB: "owner-b"}, Network: NetworkOptions{Max: max, Lookup: lookup}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.Close()
		h.Close()
		if err := mgr.Close(); err != nil {
			t.Errorf("manager close: %v", err)
		}
	})
	return &netWorld{ts: &testServer{Server: hs, h: h, mgr: mgr}, ca: ca, site: "site.invalid:" + strconv.Itoa(egresstest.Port(srv))}
}

// fetch runs a cell in c's kernel (or that of code context ctxID) that
// fetches the site and returns what it printed.
func (nw *netWorld) fetch(t *testing.T, c created, ctxID ...string) string {
	t.Helper()
	inContext := ""
	if len(ctxID) > 0 {
		inContext = `,"context_id":"` + ctxID[0] + `"`
	}
	code, _ := json.Marshal(fmt.Sprintf(`
import urllib.request
try:
    print(urllib.request.urlopen("https://%s/", timeout=20).read().decode())
except Exception as e:
    print(e)`, nw.site))
	resp, b := nw.ts.call(t, "POST", "/execute", strings.NewReader(`{"code":`+string(code)+inContext+`,"env_vars":{"SSL_CERT_FILE":"/workspace/ca.pem"}}`),
		"E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter, "E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	if resp.StatusCode != 200 {
		t.Fatalf("execute: %d %s", resp.StatusCode, b)
	}
	var out string
	for _, l := range ndjson(t, b) {
		if l["type"] == "stdout" {
			out += l["text"].(string)
		}
	}
	return strings.TrimSpace(out)
}

func (nw *netWorld) create(t *testing.T, body string) created {
	t.Helper()
	c := nw.ts.create(t, keyA, body)
	if resp, b := nw.ts.envd(t, c, "POST", "/files?path=/workspace/ca.pem", strings.NewReader(string(nw.ca.PEM)), "Content-Type", "application/octet-stream"); resp.StatusCode != 200 {
		t.Fatalf("upload ca.pem: %d %s", resp.StatusCode, b)
	}
	return c
}

func (nw *netWorld) info(t *testing.T, c created) map[string]any {
	t.Helper()
	var info map[string]any
	_, b := nw.ts.control(t, "GET", "/sandboxes/"+c.SandboxID, "", keyA)
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	return info
}

// updateNetwork changes what a running sandbox's kernel may reach, with
// E2B's rules: a domain needs ALL_TRAFFIC denied, the configuration is
// replaced (not merged), getInfo reports it.
func TestUpdateNetwork(t *testing.T) {
	t.Parallel()
	nw := newNetWorld(t, 1)
	// The pooled kernel, its proxy's listener on standby, is armed as the
	// sandbox takes it.
	testutil.WaitFor(t, 60*time.Second, func() error {
		if n := nw.ts.mgr.Stats().PoolReady; n != 1 {
			return fmt.Errorf("%d pooled kernels", n)
		}
		return nil
	})
	c := nw.create(t, `{}`)
	if !nw.ts.h.lookup(c.SandboxID).ms.FromPool {
		t.Error("the sandbox did not take the pooled kernel")
	}
	refused := "403 sandloop: egress to " + nw.site + " is not allowed"
	if got := nw.fetch(t, c); !strings.Contains(got, refused) || !strings.Contains(got, "allowed: nothing") {
		t.Fatalf("before the update: %q", got)
	}
	if info := nw.info(t, c); info["allowInternetAccess"] != true || fmt.Sprint(info["network"]) != "map[]" {
		t.Errorf("getInfo of a new sandbox: network %v, allowInternetAccess %v", info["network"], info["allowInternetAccess"])
	}
	put := func(body string) (int, string) {
		t.Helper()
		resp, b := nw.ts.control(t, "PUT", "/sandboxes/"+c.SandboxID+"/network", body, keyA)
		return resp.StatusCode, string(b)
	}
	if st, b := put(`{"allowOut": ["` + nw.site + `", "127.0.0.1"], "denyOut": ["0.0.0.0/0"]}`); st != 204 {
		t.Fatalf("update: %d %s", st, b)
	}
	if got := nw.fetch(t, c); got != "hello from the site" {
		t.Fatalf("after allowing the site: %q", got)
	}
	info := nw.info(t, c)
	if n, _ := json.Marshal(info["network"]); string(n) != `{"allowOut":["`+nw.site+`","127.0.0.1"],"denyOut":["0.0.0.0/0"]}` || info["allowInternetAccess"] != false {
		t.Errorf("getInfo after the update: network %s, allowInternetAccess %v", n, info["allowInternetAccess"])
	}
	// An extra code context follows the sandbox's list.
	resp, b := nw.ts.call(t, "POST", "/contexts", strings.NewReader(`{}`), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
		"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	var cc struct{ ID string }
	if json.Unmarshal(b, &cc); resp.StatusCode != 200 || cc.ID == "" {
		t.Fatalf("create context: %d %s", resp.StatusCode, b)
	}
	if got := nw.fetch(t, c, cc.ID); got != "hello from the site" {
		t.Fatalf("a context made after the update: %q", got)
	}
	// Replace, not merge: {} clears it (open traffic: here, nothing).
	if st, b := put(`{}`); st != 204 {
		t.Fatalf("update {}: %d %s", st, b)
	}
	if got := nw.fetch(t, c); !strings.Contains(got, refused) {
		t.Fatalf("after clearing: %q", got)
	}
	if got := nw.fetch(t, c, cc.ID); !strings.Contains(got, refused) {
		t.Fatalf("the context after clearing: %q", got)
	}
	// allow_internet_access false closes traffic as ALL_TRAFFIC denied does.
	if st, b := put(`{"allowOut": ["` + nw.site + `", "127.0.0.1"], "allow_internet_access": false}`); st != 204 {
		t.Fatalf("update with allow_internet_access: %d %s", st, b)
	}
	if got := nw.fetch(t, c); got != "hello from the site" {
		t.Fatalf("after allow_internet_access false: %q", got)
	}
	for _, tc := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"denyOut": ["example.com"]}`, 400, `invalid denied CIDR "example.com"`},
		{`{"allowOut": ["site.invalid"]}`, 400, `allowOut lists domains (site.invalid): they need "0.0.0.0/0" (ALL_TRAFFIC) in denyOut`},
		{`{"allowOut": ["site.invalid"], "denyOut": ["0.0.0.0/0"], "rules": {"site.invalid": [{"transform": {"headers": {"a": "b"}}}]}}`, 400, "network.rules (header transforms) are not supported"},
		{`{"egressProxy": {"address": "proxy.invalid:3128"}}`, 400, "egressProxy is not supported"},
		{`{"allowOut": ["example.org"], "denyOut": ["0.0.0.0/0"]}`, 403, "example.org: not within what this server allows"},
		{`{"allowOut": ["exa mple"], "denyOut": ["0.0.0.0/0"]}`, 400, "not a host name"},
		{`{"allowOut": 3}`, 400, "invalid JSON body"},
	} {
		st, b := put(tc.body)
		var e struct {
			Code    int
			Message string
		}
		json.Unmarshal([]byte(b), &e)
		if st != tc.status || e.Code != tc.status || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("update %s: %d %s, want %d %q", tc.body, st, b, tc.status, tc.msg)
		}
	}
	// Refused updates changed nothing.
	if got := nw.fetch(t, c); got != "hello from the site" {
		t.Errorf("after refused updates: %q", got)
	}
	for key, id := range map[string]string{keyB: c.SandboxID, keyA: "nope"} {
		resp, b := nw.ts.control(t, "PUT", "/sandboxes/"+id+"/network", `{}`, key)
		if resp.StatusCode != 404 || !strings.Contains(string(b), `"code":404`) {
			t.Errorf("update of %s with key %s: %d %s", id, key, resp.StatusCode, b)
		}
	}

	// At create: the network option holds from the first cell.
	c2 := nw.create(t, `{"network": {"allowOut": ["`+nw.site+`", "127.0.0.1"], "denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false}}`)
	if got := nw.fetch(t, c2); got != "hello from the site" {
		t.Fatalf("created with the site allowed: %q", got)
	}
	if info := nw.info(t, c2); info["allowInternetAccess"] != false || info["network"].(map[string]any)["allowPublicTraffic"] != false {
		t.Errorf("getInfo of a sandbox created with a network: %v", info)
	}
	resp, b = nw.ts.control(t, "POST", "/v2/sandboxes", `{"network": {"denyOut": ["nope.invalid"]}}`, keyA)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid denied CIDR") {
		t.Errorf("create with a domain denied: %d %s", resp.StatusCode, b)
	}
}
