package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// TestRegisteredCell wires a cell without Kubernetes or a host list: a
// host started with --register keeps a heartbeat row in PostgreSQL, a
// gateway started with --registered-hosts finds it there and places
// sessions on it; the draining host says not ready in its row, and its row
// is gone once it exits.
func TestRegisteredCell(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a host and a gateway")
	}
	c := newCell(t)
	c.env = []string{"SANDLOOP_DATABASE_URL=", "SANDLOOP_TOKEN=", "SANDLOOP_GATEWAY_SECRET="}
	c.pg = pgtest.Start(t)
	c.db = c.pg.NewDatabase(t)
	c.secret = filepath.Join(t.TempDir(), "secret")
	os.WriteFile(c.secret, []byte("a-shared-secret-of-the-cell-0123456789abcdef\n"), 0o600)
	hostAddr := freeAddr(t)
	host := c.start("host", hostAddr, "serve", "--gateway-secret-file", c.secret, "--database", c.db, "--register", "http://"+hostAddr,
		"--heartbeat", "100ms", "--max-sessions", "5", "--pool", "0", "--zygote=off", "--drain-timeout", "60s", "--data-dir", t.TempDir())
	type row struct {
		url   string
		ready bool
		slots int
	}
	registration := func() (row, bool) {
		conn, err := pgx.Connect(context.Background(), c.db)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var r row
		err = conn.QueryRow(context.Background(), `SELECT url, ready, slots FROM host_heartbeats WHERE name = $1`, hostAddr).Scan(&r.url, &r.ready, &r.slots)
		return r, err == nil
	}
	c.waitFor("the host's registration", func() bool { _, ok := registration(); return ok })
	if r, _ := registration(); r != (row{"http://" + hostAddr, true, 5}) {
		t.Fatalf("registration %+v", r)
	}
	gw := c.start("gateway", freeAddr(t), "gateway", "--gateway-secret-file", c.secret, "--database", c.db, "--registered-hosts",
		"--token", c.token, "--health-interval", "100ms", "--heartbeat-deadline", "3s")
	c.waitFor("the gateway sees the registered host", func() bool {
		var h struct {
			Ready int `json:"hosts_ready"`
		}
		c.call(gw, "GET", "/healthz", nil, &h)
		return h.Ready == 1
	})
	id := c.create(gw)
	if st, r := c.exec(gw, id, "print(1+1)"); st != http.StatusOK || r.Stdout != "2\n" {
		t.Fatalf("execute through the gateway: %d %+v", st, r)
	}
	if h := c.hostOf(id); h != hostAddr {
		t.Errorf("placed on %q, want %q", h, hostAddr)
	}
	// SIGTERM: the host drains (its session keeps it up) and says so.
	host.signal(syscall.SIGTERM)
	c.waitFor("the draining host's row says not ready", func() bool { r, ok := registration(); return ok && !r.ready })
	if st, r := c.exec(gw, id, "print(2+2)"); st != http.StatusOK || r.Stdout != "4\n" {
		t.Errorf("the session on the draining host: %d %+v", st, r)
	}
	if st := c.call(gw, "POST", "/v1/sessions", nil, nil); st < 400 {
		t.Errorf("a new session with only a draining host: %d", st)
	}
	// The session ends: the host exits and removes its row.
	if st := c.call(gw, "DELETE", "/v1/sessions/"+id, nil, nil); st >= 300 {
		t.Fatalf("delete: %d", st)
	}
	host.wait(c)
	if _, ok := registration(); ok {
		t.Error("the host's row outlived it")
	}
}
