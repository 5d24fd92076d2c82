package server

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

func TestNetworkModesOverHTTP(t *testing.T) {
	ca := egresstest.NewCA(t)
	site := ca.Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the site") }), "site.test")
	port := strconv.Itoa(egresstest.Port(site))
	max, err := egress.ParseAllowlist([]string{"*.test:*", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, session.ManagerOptions{EgressLookup: egresstest.Resolver(map[string][]string{"site.test": {"127.0.0.1"}, "api.test": {"127.0.0.1"}})},
		Options{Egress: EgressOptions{Max: max}})
	// The server's own address stays out of reach even with loopback listed.
	ap := netip.MustParseAddrPort(strings.TrimPrefix(ts.URL, "http://"))
	ts.srv.opts.Egress.Policy.Deny = []netip.AddrPort{ap}

	for _, c := range []struct{ body, code, msg string }{
		{`{"network": true}`, "network_not_allowed", "--allow-network"},
		{`{"network": "host"}`, "network_not_allowed", "--allow-network"},
		{`{"network": "internet"}`, "bad_request", `network mode "internet" is not none, allow or host`},
		{`{"network": 3}`, "bad_request", `network must be "none", "allow" or "host"`},
		{`{"network": "allow"}`, "bad_request", `needs "allow": a list of hosts`},
		{`{"network": "none", "allow": ["site.test"]}`, "bad_request", `not "none"`},
		{`{"allow": ["exa mple"]}`, "bad_request", "not a host name"},
		{`{"allow": ["example.org"]}`, "network_not_allowed", "example.org: not within what this server allows"},
		{`{"allow": ["10.0.0.0/8"]}`, "network_not_allowed", "10.0.0.0/8: not within"},
	} {
		var e struct {
			Error struct{ Code, Message string }
		}
		ts.do(t, "POST", "/v1/sessions", c.body, &e)
		if e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: %+v, want %s %q", c.body, e.Error, c.code, c.msg)
		}
	}

	var s sessionJSON
	if resp := ts.do(t, "POST", "/v1/sessions", `{"network": "allow", "allow": ["site.test:`+port+`", "127.0.0.1", "api.test:*"], "env": {"SSL_CERT_FILE": "/workspace/ca.pem"}}`, &s); resp.StatusCode != 201 {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	if s.Mode != "allow" || s.Network || len(s.Allow) != 3 {
		t.Fatalf("session: %+v", s)
	}
	ts.do(t, "PUT", "/v1/sessions/"+s.ID+"/files/ca.pem", string(ca.PEM), nil)
	r := ts.exec(t, s.ID, fmt.Sprintf(`
import urllib.request
print(urllib.request.urlopen("https://site.test:%s/", timeout=20).read().decode())
try:
    urllib.request.urlopen("http://api.test:%d/healthz", timeout=20)
except Exception as e:
    print(e)
`, port, ap.Port()))
	if !strings.Contains(r.Stdout, "hello from the site") || !strings.Contains(r.Stdout, "sandloop's own service") {
		t.Fatalf("execute: %q %q", r.Stdout, r.Stderr)
	}
	var nl struct {
		Mode string
		egress.Log
	}
	// The refusal is logged as its connection closes, which on a busy machine
	// can be just after the program printed it.
	testutil.WaitFor(t, 10*time.Second, func() error {
		ts.do(t, "GET", "/v1/sessions/"+s.ID+"/network", "", &nl)
		if nl.Mode != "allow" || len(nl.Entries) < 2 || !nl.Entries[0].Allowed || nl.Entries[0].Host != "site.test" || nl.Entries[len(nl.Entries)-1].Allowed {
			return fmt.Errorf("network log: %+v", nl)
		}
		return nil
	})
	// A session without an allowlist answers with its mode and no entries.
	plain := ts.create(t, `{}`)
	ts.do(t, "GET", "/v1/sessions/"+plain+"/network", "", &nl)
	if nl.Mode != "none" || nl.Entries == nil || len(nl.Entries) != 0 {
		t.Fatalf("plain session's log: %+v", nl)
	}
}

// A server whose default mode is allow gives it to sessions that ask for
// no mode (its manager's default covers MCP and agent runs too), and an
// explicit "none" still gets none.
func TestDefaultNetworkAllow(t *testing.T) {
	eo := EgressOptions{DefaultMode: egress.ModeAllow, Default: []string{"pypi"}}
	ts := newTestServer(t, session.ManagerOptions{DefaultEgress: eo.DefaultPolicy()}, Options{Egress: eo})
	var s sessionJSON
	ts.do(t, "POST", "/v1/sessions", `{}`, &s)
	if s.Mode != "allow" || strings.Join(s.Allow, ",") != "pypi.org,files.pythonhosted.org" {
		t.Errorf("default session: %+v", s)
	}
	ts.do(t, "POST", "/v1/sessions", `{"network": "none"}`, &s)
	if s.Mode != "none" {
		t.Errorf("explicit none: %+v", s)
	}
	ms, err := ts.mgr.Create(t.Context(), session.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// (Whether it came from the warm pool does not matter: pooled kernels
	// are armed with the proxy when they are handed to an allow session.)
	if ms.NetworkLog() == nil {
		t.Errorf("a manager session without a mode has no network log: it did not get the server's default (allow)")
	}
}
