// Package restoretest starts the smallest real cell that restores a lost
// session: PostgreSQL, two real hosts (real jails and kernels) sharing a
// snapshot directory and a gateway in this process, for the tests of the faces that follow the
// gateway's 307 (client, CLI, web UI).
package restoretest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// Cell is a gateway and a session that has a snapshot, whose host Lose
// closes.
type Cell struct {
	// URL is the gateway's; Token its token.
	URL, Token string
	// Session was snapshotted holding the variable answer = 42 and the
	// file kept.txt ("kept").
	Session string

	pg   *store.Postgres
	lose func()
}

// New starts the cell and the session; t's cleanup stops everything. The
// caller's TestMain runs jail.MaybeInit. mounts, if set, are served by the
// gateway beside the API (the web UI's).
func New(t *testing.T, mounts map[string]http.Handler) *Cell {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL, two hosts and a gateway")
	}
	const secret = "restoretest-secret-0123456789abcdef"
	const token = "restoretest-token-0123456789"
	pgs := pgtest.Start(t)
	pg, err := store.OpenPostgres(t.Context(), pgs.NewDatabase(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	snaps := t.TempDir()
	var static gateway.Static
	hosts := map[string]func(){} // name → close (once)
	for i := range 2 {
		// Each host as sandloop serve makes it (internal/host imports the
		// web UI, which tests this package): a session manager with its
		// own handle on the shared snapshot store, and the API server.
		d, err := snapshot.NewDir(snaps)
		if err != nil {
			t.Fatal(err)
		}
		st, err := snapshot.New(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		mgr := session.NewManager(&session.ManagerOptions{MaxSessions: 4, Snapshots: st})
		srv, err := server.New(&server.Options{Manager: mgr, GatewaySecret: secret, Epoch: fmt.Sprintf("epoch-%d-%p", i, mgr)})
		if err != nil {
			mgr.Close()
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv)
		var once sync.Once
		closeHost := func() {
			once.Do(func() {
				ts.CloseClientConnections()
				ts.Close()
				mgr.Close()
			})
		}
		t.Cleanup(closeHost)
		u, _ := url.Parse(ts.URL)
		hosts[u.Host] = closeHost
		static = append(static, gateway.Target{Name: u.Host, URL: ts.URL})
	}
	gw, err := gateway.New(&gateway.Options{Discovery: static, Cluster: pg, Secret: secret, Tokens: []string{token},
		HealthInterval: 100 * time.Millisecond, LostAfter: time.Second, PublicMounts: mounts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { gw.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	gw.Refresh(t.Context())
	ts := httptest.NewServer(gw)
	t.Cleanup(ts.Close)
	c := &Cell{URL: ts.URL, Token: token, pg: pg}

	var s struct {
		ID string `json:"id"`
	}
	c.call(t, "POST", "/v1/sessions", "", &s)
	var r struct {
		Status string `json:"status"`
	}
	c.call(t, "POST", "/v1/sessions/"+s.ID+"/execute", `{"code": "answer = 42\nopen('kept.txt', 'w').write('kept')"}`, &r)
	if r.Status != "ok" {
		t.Fatalf("execute: %+v", r)
	}
	c.call(t, "POST", "/v1/sessions/"+s.ID+"/snapshots", `{"name": "before-loss"}`, nil)
	pl, err := pg.GetPlacement(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.Session, c.lose = s.ID, hosts[pl.Host]
	return c
}

// Lose closes the session's host and waits until the gateway has declared
// the session lost: its next request is answered by a restore (307).
func (c *Cell) Lose(t *testing.T) {
	t.Helper()
	c.lose()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if pl, err := c.pg.GetPlacement(t.Context(), c.Session); err != nil || !pl.Lost {
			return fmt.Errorf("the gateway has not declared the closed host's session lost (%v)", err)
		}
		return nil
	})
}

// call sends one request to the gateway and wants a 2xx.
func (c *Cell) call(t *testing.T, method, path, body string, out any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, c.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %d", method, path, resp.StatusCode)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}
