package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

func TestChoose(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2)).IntN
	if i := choose(nil, rnd); i != -1 {
		t.Errorf("no candidates: %d", i)
	}
	if i := choose([]candidate{{name: "a", free: 0}, {name: "b", free: -1}}, rnd); i != -1 {
		t.Errorf("all full: %d", i)
	}
	if i := choose([]candidate{{name: "a", free: 0}, {name: "b", free: 3}}, rnd); i != 1 {
		t.Errorf("one open: %d", i)
	}
	// Without kernels ready, the freest host always wins.
	for range 100 {
		if i := choose([]candidate{{name: "a", free: 1}, {name: "b", free: 10}, {name: "c", free: 5}, {name: "d", free: 0}}, rnd); i != 1 {
			t.Fatalf("picked %d, not the freest host", i)
		}
	}
	// Equals are picked about as often as each other.
	counts := make([]int, 4)
	cands := []candidate{{name: "a", free: 5, ready: 2}, {name: "b", free: 5, ready: 2}, {name: "c", free: 5, ready: 1}, {name: "d", free: 5, ready: 2}}
	for range 3000 {
		counts[choose(cands, rnd)]++
	}
	if counts[2] != 0 || min(counts[0], counts[1], counts[3]) < 800 {
		t.Errorf("counts = %v, want about 1000 each for a, b and d, none for c", counts)
	}
	// Kernels ready come before free slots: the one with more ready wins
	// even with fewer free slots; a negative estimate of ready kernels
	// counts as none; a full host is never picked for its ready kernels.
	for range 100 {
		if i := choose([]candidate{{name: "a", free: 50, ready: 0}, {name: "b", free: 2, ready: 1}}, rnd); i != 1 {
			t.Fatalf("picked the host with no kernel ready")
		}
		if i := choose([]candidate{{name: "a", free: 50, ready: -3}, {name: "b", free: 40, ready: 0}}, rnd); i != 0 {
			t.Fatalf("a negative estimate of ready kernels counted below none")
		}
		if i := choose([]candidate{{name: "a", free: 0, ready: 5}, {name: "b", free: 1, ready: 0}}, rnd); i != 1 {
			t.Fatalf("picked a full host")
		}
	}
}

// TestPickSpreadsBurst: a burst picked all at once (as its requests come,
// before any host answers) goes to the ready kernels, each time to the
// host with the most left (pool and spares, less the creates waiting
// there), then by free slots; a placement the host refused is taken back,
// unless a health answer has come since.
func TestPickSpreadsBurst(t *testing.T) {
	hs := &hosts{m: map[string]*host{
		"a": {name: "a", epoch: "e", reachable: true, slots: 20, pool: 4, spares: 2, starting: 1}, // 5 ready
		"b": {name: "b", epoch: "e", reachable: true, slots: 20, used: 6, pool: 1, spares: 1},     // 2 ready
		"c": {name: "c", epoch: "e", reachable: true, slots: 20, draining: true, pool: 9},
	}}
	rnd := rand.New(rand.NewPCG(3, 4)).IntN
	var got []string
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 10 {
		wg.Go(func() {
			name, _ := hs.pick(nil, "", false, rnd)
			mu.Lock()
			got = append(got, name)
			mu.Unlock()
		})
	}
	wg.Wait()
	per := map[string]int{}
	for _, n := range got {
		per[n]++
	}
	// The ready kernels first, each to the host with the most left: a's
	// 5 and b's 2 take the first 7; then free slots, a's 14 against
	// b's 12: 2 more to a, the last to either.
	if per["c"] != 0 || per["a"] < 7 || per["b"] < 2 || per["a"]+per["b"] != 10 {
		t.Errorf("picks per host %v, want a 7 or 8, b 2 or 3, none on the draining c", per)
	}
	if n, _ := hs.pick(map[string]bool{"a": true, "b": true}, "", false, rnd); n != "" {
		t.Errorf("picked %q with every ready host excluded", n)
	}
	// The placement counts at once; a refused one is taken back.
	before := hs.m["b"].placed
	name, round := hs.pick(map[string]bool{"a": true}, "", false, rnd)
	if name != "b" || hs.m["b"].placed != before+1 {
		t.Fatalf("pick: %q, b placed %d, want b, %d", name, hs.m["b"].placed, before+1)
	}
	hs.unpick("b", round)
	if hs.m["b"].placed != before {
		t.Errorf("unpick left b placed %d, want %d", hs.m["b"].placed, before)
	}
	// After a health answer (a new round), an old pick is not taken back:
	// the host's figures count it.
	_, round = hs.pick(map[string]bool{"a": true}, "", false, rnd)
	hs.m["b"].round++
	hs.m["b"].placed = 0
	hs.unpick("b", round)
	if hs.m["b"].placed != 0 {
		t.Errorf("unpick of an old round changed placed to %d", hs.m["b"].placed)
	}
}

func TestRoutesCache(t *testing.T) {
	c := newRoutes(3)
	c.put(store.Placement{ID: "s1", Host: "h1"})
	c.put(store.Placement{ID: "s2", Host: "h1"})
	c.put(store.Placement{ID: "s3", Host: "h2"})
	c.notify("s:s3")
	if _, ok := c.get("s3"); ok {
		t.Error("s:ID did not drop the entry")
	}
	c.notify("h:h1")
	if _, ok := c.get("s1"); ok || c.len() != 0 {
		t.Errorf("h:HOST left %d entries", c.len())
	}
	for i := range 5 {
		c.put(store.Placement{ID: fmt.Sprint(i), Host: "h"})
	}
	if c.len() > 3 {
		t.Errorf("cache holds %d entries over its bound of 3", c.len())
	}
	c.notify("")
	if c.len() != 0 {
		t.Error("a reconnection did not drop everything")
	}
}

// swapHost is a real sandloop host (server + session manager with real
// jails) behind an address that survives "restarts": restart replaces the
// process's state and epoch, as a restarted pod at the same name would.
type swapHost struct {
	t   testing.TB
	h   atomic.Pointer[server.Server]
	ts  *httptest.Server
	gen int
	// maxSessions is the host's --max-sessions. If zero, 3.
	maxSessions int
	// templates, if set, are the host's templates (from its next restart).
	templates *template.Pool
	// runs, if set, gives the host a runs service and its run history
	// (from its next restart), made from the options it is passed.
	runs func(*runs.Options) (*runs.Service, store.History)
	// pg is the cell's PostgreSQL (newFixture's).
	pg *store.Postgres
	// pool is the host's warm pool (--pool); zygote, if set, forks its
	// kernels (from its next restart).
	pool   int
	zygote session.Zygote
	// fixed selects the pool before issue 26 (session.ManagerOptions.FixedPool).
	fixed bool
	// closeTimeout, if set, is the host's session.ManagerOptions.CloseTimeout.
	closeTimeout time.Duration
}

const secret = "test-secret-0123456789abcdef0123456789"

func newHost(t testing.TB, configure ...func(*swapHost)) *swapHost {
	sh := &swapHost{t: t, maxSessions: 3}
	for _, c := range configure {
		c(sh)
	}
	if _, ok := t.(*testing.B); ok {
		sh.maxSessions = 200
	}
	sh.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sh.h.Load().ServeHTTP(w, r) }))
	t.Cleanup(sh.ts.Close)
	sh.restart()
	return sh
}

func (sh *swapHost) restart() {
	sh.gen++
	mo := &session.ManagerOptions{MaxSessions: sh.maxSessions, PoolSize: sh.pool, Zygote: sh.zygote, FixedPool: sh.fixed, CloseTimeout: sh.closeTimeout}
	so := &server.Options{GatewaySecret: secret, Epoch: fmt.Sprintf("epoch-%p-%d", sh, sh.gen)}
	if sh.templates != nil {
		mo.Templates, so.Templates = sh.templates, sh.templates
	}
	mgr := session.NewManager(mo)
	sh.t.Cleanup(func() { mgr.Close() })
	so.Manager = mgr
	var srv *server.Server
	if sh.runs != nil {
		// As a cell's host wires it (internal/host): previews named under
		// the host's own loopback name, renamed as asked for.
		_, port, _ := net.SplitHostPort(sh.ts.Listener.Addr().String())
		so.Runs, so.Store = sh.runs(&runs.Options{NewSession: runs.ManagerSessions(mgr), Cell: sh.pg, PreviewURL: func(id string, p int, exp time.Time) string {
			return srv.PreviewURL("localhost:"+port, id, p, exp)
		}})
		sh.t.Cleanup(so.Runs.Close) // before the manager's
	}
	srv, err := server.New(so)
	if err != nil {
		sh.t.Fatal(err)
	}
	sh.h.Store(srv)
}

type fixture struct {
	t     testing.TB
	gw    *Gateway
	ts    *httptest.Server
	pg    *store.Postgres
	dsn   string // pg's database
	hosts []*swapHost
}

func newFixture(t testing.TB, hosts int, configure ...func(*swapHost)) *fixture {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	pg, err := store.OpenPostgres(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	f := &fixture{t: t, pg: pg, dsn: dsn}
	var static Static
	for range hosts {
		h := newHost(t, append([]func(*swapHost){func(sh *swapHost) { sh.pg = pg }}, configure...)...)
		f.hosts = append(f.hosts, h)
		static = append(static, Target{Name: h.ts.Listener.Addr().String(), URL: h.ts.URL})
	}
	// Health rounds only when the test asks: a gateway with a stale view.
	f.gw, err = New(&Options{Discovery: static, Cluster: pg, Secret: secret, Tokens: []string{"token-one-0123456789", "token-two-0123456789"},
		HealthInterval: time.Hour, LostAfter: time.Hour})

	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.gw.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	f.gw.Refresh(t.Context())
	f.ts = httptest.NewServer(f.gw)
	t.Cleanup(f.ts.Close)
	return f
}

func (f *fixture) do(token, method, path, body string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.ts.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// health is host i's /healthz, asked directly.
func (f *fixture) health(i int) (server.Health, error) {
	var st server.Health
	resp, err := http.Get(f.hosts[i].ts.URL + "/healthz")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (f *fixture) create(token string) (string, string) {
	st, body := f.do(token, "POST", "/v1/sessions", "")
	if st != http.StatusCreated {
		f.t.Fatalf("create: %d %s", st, body)
	}
	var s struct{ ID string }
	json.Unmarshal([]byte(body), &s)
	pl, err := f.pg.GetPlacement(f.t.Context(), s.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	return s.ID, pl.Host
}

const tok1, tok2 = "token-one-0123456789", "token-two-0123456789"

// TestEpochFencing: a host restarted behind the gateway's back is caught by
// the epoch every request carries: the old session answers 410 (never
// another session, never a hang) and the table marks it lost.
func TestEpochFencing(t *testing.T) {
	f := newFixture(t, 1)
	id, _ := f.create(tok1)
	if st, body := f.do(tok1, "POST", "/v1/sessions/"+id+"/execute", `{"code":"print(1+1)"}`); st != 200 || !strings.Contains(body, `"stdout":"2\n"`) {
		t.Fatalf("execute: %d %s", st, body)
	}
	deleted, _ := f.create(tok1)
	if st, _ := f.do(tok1, "DELETE", "/v1/sessions/"+deleted, ""); st != http.StatusNoContent {
		t.Fatalf("delete: %d", st)
	}
	f.hosts[0].restart() // the gateway has not noticed (no health round)
	st, body := f.do(tok1, "POST", "/v1/sessions/"+id+"/execute", `{"code":"1"}`)
	if st != http.StatusGone || !strings.Contains(body, `"host_lost"`) {
		t.Fatalf("after the restart: %d %s, want 410 host_lost", st, body)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		pl, err := f.pg.GetPlacement(t.Context(), id)
		if err != nil || !pl.Lost {
			return fmt.Errorf("the table does not mark the session lost: %+v %v", pl, err)
		}
		return nil
	})
	// Now even without asking the host: 410 from the table.
	if st, _ := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusGone {
		t.Errorf("lost session: %d", st)
	}
	// A health round learns the new epoch; new sessions work.
	f.gw.Refresh(t.Context())
	// A session deleted before the restart was not lost: the gateway,
	// whose host no longer knows it, says when it closed.
	if pl, err := f.pg.GetPlacement(t.Context(), deleted); err != nil || pl.Lost || pl.ClosedAt.IsZero() {
		t.Errorf("the deleted session's placement after the fence: %+v %v, want closed, not lost", pl, err)
	}
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+deleted, ""); st != http.StatusNotFound || !strings.Contains(body, "was closed at") || !strings.Contains(body, "deleted by its owner") {
		t.Errorf("the deleted session after its host's restart: %d %s, want 404 saying it was closed", st, body)
	}
	id2, _ := f.create(tok1)
	if st, _ := f.do(tok1, "GET", "/v1/sessions/"+id2, ""); st != 200 {
		t.Errorf("new session after the restart: %d", st)
	}
}

// TestHostLostByAnotherGateway: a host stops answering; another gateway
// of the cell declares it lost first (its health rounds run apart from
// this one's), marking its sessions lost in the table. This gateway,
// which sees the host unreachable but has not declared it lost itself
// nor heard of it yet, answers 410 from the table at once, as the other
// does, not 502 until its own LostAfter.
func TestHostLostByAnotherGateway(t *testing.T) {
	f := newFixture(t, 1)
	id, host := f.create(tok1)
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != 200 {
		t.Fatalf("get: %d %s", st, body)
	}
	f.hosts[0].ts.Close()
	f.gw.Refresh(t.Context()) // unreachable now; lost only after an hour
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusBadGateway {
		t.Fatalf("before any gateway declared the host lost: %d %s, want 502", st, body)
	}
	// The other gateway's fence, as this one sees it before the table's
	// notification reaches it (under load it may take a while): the
	// table marks the session lost, the route cache still holds it.
	conn, err := pgx.Connect(t.Context(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), `UPDATE sessions SET lost = true WHERE host = $1`, host); err != nil {
		t.Fatal(err)
	}
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusGone || !strings.Contains(body, `"host_lost"`) {
		t.Errorf("once another gateway declared the host lost: %d %s, want 410 host_lost", st, body)
	}
}

// TestPlacementSkipsRefusingHosts: a draining host (which the gateway still
// thinks ready) refuses; the session goes to the other host. When no host
// can take it, the client gets a clear 429/503, not a hang.
func TestPlacementSkipsRefusingHosts(t *testing.T) {
	f := newFixture(t, 2)
	f.hosts[0].h.Load().Drain()
	// Asking for more than a host may give is a clear 4xx from the host, passed on.
	if st, body := f.do(tok1, "POST", "/v1/sessions", `{"memory_mb": 1000000}`); st != http.StatusBadRequest || !strings.Contains(body, "limit_too_high") {
		t.Errorf("an oversized session: %d %s", st, body)
	}
	for range 3 {
		_, host := f.create(tok1)
		if host != f.hosts[1].ts.Listener.Addr().String() {
			t.Errorf("placed on the draining host")
		}
	}
	// Host 1 is now full (3 sessions), host 0 draining.
	st, body := f.do(tok1, "POST", "/v1/sessions", "")
	if st != http.StatusTooManyRequests && st != http.StatusServiceUnavailable {
		t.Errorf("a full cell: %d %s", st, body)
	}
	if !strings.Contains(body, `"error"`) {
		t.Errorf("not the API's error shape: %s", body)
	}
}

// TestOwnershipAndAuth: tokens as on serve; another token's session is not
// found; hosts refuse requests without the gateway's secret.
func TestOwnershipAndAuth(t *testing.T) {
	f := newFixture(t, 1)
	id, _ := f.create(tok1)
	if st, _ := f.do(tok2, "GET", "/v1/sessions/"+id, ""); st != http.StatusNotFound {
		t.Errorf("another token's session: %d, want 404", st)
	}
	if st, _ := f.do("wrong-token-0123456789", "GET", "/v1/sessions/"+id, ""); st != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", st)
	}
	if st, body := f.do(tok2, "GET", "/v1/sessions", ""); st != 200 || strings.Contains(body, id) {
		t.Errorf("another token's list: %d %s", st, body)
	}
	if st, body := f.do(tok1, "GET", "/v1/sessions", ""); st != 200 || !strings.Contains(body, id) {
		t.Errorf("own list: %d %s", st, body)
	}
	resp, err := http.Post(f.hosts[0].ts.URL+"/v1/sessions", "application/json", bytes.NewReader(nil))
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a host took a request without the secret: %v", resp.StatusCode)
	}
	// serve's front checks (server.Front), each with the API's error shape.
	for _, c := range []struct {
		host, path, header, value, code string
	}{
		{"evil.example", "/v1/sessions", "Authorization", "Bearer " + tok1, `"bad_host"`},
		{"", "/v1/sessions", "Origin", "http://evil.example", `"cross_origin"`},
		{"", "/v1/sessions/" + id + "/files/../../x", "Authorization", "Bearer " + tok1, `"bad_path"`},
		{"", "/v2/nothing", "Authorization", "Bearer " + tok1, `"not_found"`},
		{"", "/v1/sessions", "Authorization", "Bearer wrong-token-0123456789", `"unauthorized"`},
	} {
		req, _ := http.NewRequest("POST", f.ts.URL+c.path, nil)
		req.URL.Path = c.path // unclean, as a raw client sends it
		if c.host != "" {
			req.Host = c.host
		}
		req.Header.Set(c.header, c.value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || !strings.Contains(string(b), c.code) {
			t.Errorf("%s %s with %s: %d %s, want %s", c.host, c.path, c.header, resp.StatusCode, b, c.code)
		}
	}
	// The web UI asks what the server wants before anything else: the
	// gateway checks tokens, whatever its hosts say.
	if st, body := f.do(tok1, "GET", "/v1/info", ""); st != 200 || !strings.Contains(body, `"token_required":true`) || !strings.Contains(body, `"runs":`) {
		t.Errorf("info: %d %s", st, body)
	}
	if st, _ := f.do("", "GET", "/v1/info", ""); st != http.StatusUnauthorized {
		t.Errorf("info without a token: %d, want 401", st)
	}
	if st, body := f.do(tok1, "GET", "/v1/hosts", ""); st != 200 || !strings.Contains(body, `"ready":true`) {
		t.Errorf("hosts: %d %s", st, body)
	}
	// Deleting marks the placement closed: the id still leads to its
	// host, which says when and why it closed and keeps its events; the
	// gateway says it too once the host no longer does.
	if st, _ := f.do(tok1, "DELETE", "/v1/sessions/"+id, ""); st >= 300 {
		t.Fatalf("delete: %d", st)
	}
	if pl, err := f.pg.GetPlacement(t.Context(), id); err != nil || pl.ClosedAt.IsZero() {
		t.Errorf("a deleted session's placement: %+v %v, want it marked closed", pl, err)
	}
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusNotFound || !strings.Contains(body, "was closed at") || !strings.Contains(body, "deleted by its owner") {
		t.Errorf("a deleted session: %d %s, want 404 saying when and why it closed", st, body)
	}
	if st, body := f.do(tok1, "GET", "/v1/sessions/"+id+"/events", ""); st != 200 || !strings.Contains(body, `"type":"closed"`) {
		t.Errorf("a deleted session's events: %d %s, want its close", st, body)
	}
	if st, body := f.do(tok2, "GET", "/v1/sessions/"+id, ""); st != http.StatusNotFound || strings.Contains(body, "closed") {
		t.Errorf("another token's deleted session: %d %s, want a plain 404", st, body)
	}
	if st, _ := f.do(tok1, "DELETE", "/v1/sessions/"+id, ""); st != http.StatusNotFound {
		t.Errorf("a second delete: %d, want 404", st)
	}
	// A session its host closed on its own (here: deleted on the host
	// directly), then deleted through the gateway: the host's 404 says
	// why; the gateway forgets it rather than say it was deleted now.
	gone, _ := f.create(tok1)
	pl, err := f.pg.GetPlacement(t.Context(), gone)
	if err != nil {
		t.Fatal(err)
	}
	u, _, _, _ := f.gw.hosts.get(pl.Host)
	req, _ := http.NewRequest("DELETE", u.JoinPath("/v1/sessions", gone).String(), nil)
	req.Header.Set(server.HeaderGatewaySecret, secret)
	req.Header.Set(server.HeaderOwner, pl.Owner)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete on the host: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if st, body := f.do(tok1, "DELETE", "/v1/sessions/"+gone, ""); st != http.StatusNotFound || !strings.Contains(body, "was closed at") {
		t.Errorf("a delete of a session its host closed: %d %s, want the host's 404", st, body)
	}
	if _, err := f.pg.GetPlacement(t.Context(), gone); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the placement of a session its host closed, after a delete through the gateway: %v, want it forgotten", err)
	}
	if hostKeepsClosed != session.ClosedEventsKept {
		t.Errorf("hostKeepsClosed %v, the host's %v", hostKeepsClosed, session.ClosedEventsKept)
	}
}

// TestForkThroughGateway: the sessions a fork makes on its parent's host
// are recorded, so the gateway routes them as any session (and another
// token does not reach them).
func TestForkThroughGateway(t *testing.T) {
	f := newFixture(t, 2)
	id, host := f.create(tok1)
	if st, body := f.do(tok1, "POST", "/v1/sessions/"+id+"/execute", `{"code":"x = 41"}`); st != 200 {
		t.Fatalf("execute: %d %s", st, body)
	}
	st, body := f.do(tok1, "POST", "/v1/sessions/"+id+"/fork", `{"count":2}`)
	var fork struct{ Sessions []struct{ ID string } }
	if json.Unmarshal([]byte(body), &fork); st != http.StatusCreated || len(fork.Sessions) != 2 {
		t.Fatalf("fork: %d %s", st, body)
	}
	for _, k := range fork.Sessions {
		pl, err := f.pg.GetPlacement(t.Context(), k.ID)
		if err != nil || pl.Host != host || pl.Kind != store.KindSession {
			t.Errorf("the fork %s's placement: %+v %v, want on %s", k.ID, pl, err, host)
		}
		if st, body := f.do(tok1, "POST", "/v1/sessions/"+k.ID+"/execute", `{"code":"x + 1"}`); st != 200 || !strings.Contains(body, `"42"`) {
			t.Errorf("execute in the fork %s: %d %s", k.ID, st, body)
		}
		if st, _ := f.do(tok2, "GET", "/v1/sessions/"+k.ID, ""); st != http.StatusNotFound {
			t.Errorf("another token's fork: %d, want 404", st)
		}
	}
	if st, _ := f.do(tok1, "DELETE", "/v1/sessions/"+fork.Sessions[0].ID, ""); st != http.StatusNoContent {
		t.Errorf("delete a fork: %d", st)
	}
	if pl, err := f.pg.GetPlacement(t.Context(), fork.Sessions[0].ID); err != nil || pl.ClosedAt.IsZero() {
		t.Errorf("a deleted fork's placement: %+v %v, want it marked closed", pl, err)
	}
}

// TestBurstSpreadsByReadyKernels: a burst larger than either host's warm
// pool, sent at once through a real gateway to two real hosts with pools
// of 4 and 1, is spread over both: first to the ready kernels, always to
// the host with the most left, then by free slots. (Before, placements
// were counted only once a host answered, so the whole burst went to the
// host that looked best before it: 10 of 10 on the first.)
func TestBurstSpreadsByReadyKernels(t *testing.T) {
	pools := []int{4, 1}
	i := 0
	f := newFixture(t, len(pools), func(sh *swapHost) {
		sh.pool, sh.maxSessions = pools[i], 12
		i++
	})
	testutil.WaitFor(t, 2*time.Minute, func() error {
		for i := range f.hosts {
			if st, err := f.health(i); err != nil || st.PoolReady < pools[i] || st.Starting > 0 {
				return fmt.Errorf("host %d: %+v %v, want its pool of %d full", i, st, err, pools[i])
			}
		}
		return nil
	})
	f.gw.Refresh(t.Context())
	const burst = 10
	hostIndex := map[string]int{}
	for i, h := range f.hosts {
		hostIndex[h.ts.Listener.Addr().String()] = i
	}
	var (
		mu      sync.Mutex
		perHost = make([]int, len(f.hosts))
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for range burst {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest("POST", f.ts.URL+"/v1/sessions", nil)
			req.Header.Set("Authorization", "Bearer "+tok1)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var s struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != http.StatusCreated {
				t.Errorf("create: %s %v", resp.Status, err)
				return
			}
			pl, err := f.pg.GetPlacement(context.Background(), s.ID)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			perHost[hostIndex[pl.Host]]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	// The ready kernels take 5 (4 and 1), then free slots 8 against 11:
	// 3 to the second, the last 2 to either; so 5-6 and 4-5.
	if perHost[0]+perHost[1] != burst || perHost[0] < 4 || perHost[1] < 4 {
		t.Errorf("sessions per host %v, want the burst of %d spread (each host at least 4)", perHost, burst)
	}
}
