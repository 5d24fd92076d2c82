package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// TestCellRestoreLostHost: a gateway, two hosts, PostgreSQL and a real S3
// server (SeaweedFS) as the cell's snapshot store. A session with a
// variable and a file is snapshotted through the gateway; its host is
// killed (-9); the next request for it through the gateway is answered
// 307 to a new session on the other host, restored from the snapshot
// (file exact, variable back, Sandloop-Restored says so); following the
// redirect works, and the old id keeps leading there. Another token: 404.
// A session of the killed host without a snapshot: 410.
func TestCellRestoreLostHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, SeaweedFS and 3 sandloop processes")
	}
	const key, s3secret = "sandloop-test", "sandloop-test-secret"
	endpoint := startWeed(t, key, s3secret)
	c := newCell(t)
	c.env = []string{"SANDLOOP_DATABASE_URL=", "SANDLOOP_TOKEN=", "SANDLOOP_GATEWAY_SECRET=",
		"AWS_ACCESS_KEY_ID=" + key, "AWS_SECRET_ACCESS_KEY=" + s3secret}
	c.pg = pgtest.Start(t)
	c.db = c.pg.NewDatabase(t)
	c.secret = filepath.Join(t.TempDir(), "secret")
	os.WriteFile(c.secret, []byte("a-shared-secret-of-the-cell-0123456789abcdef\n"), 0o600)
	const other = "cell-test-other-token-0123456789"
	snaps := "s3://" + endpoint + "/cell/snaps?insecure=1"

	var (
		addrs []string
		gw    *proc
		id    string // snapshotted
		bare  string // not snapshotted, on the same host
		hib   string // hibernated, on the same host
		snap  string
	)
	c.phase("start", 3*time.Minute, func(t *testing.T) {
		for i := range 2 {
			addrs = append(addrs, freeAddr(t))
			c.hosts = append(c.hosts, c.start(fmt.Sprintf("host%d", i), addrs[i], "serve", "--gateway-secret-file", c.secret, "--database", c.db,
				"--pool", "0", "--data-dir", c.t.TempDir(), "--snapshot-store", snaps))
		}
		c.hostCSV = "http://" + strings.Join(addrs, ",http://")
		gw = c.start("gateway", freeAddr(t), "gateway", "--gateway-secret-file", c.secret, "--database", c.db,
			"--hosts", c.hostCSV, "--token", c.token, "--token", other, "--health-interval", "200ms", "--lost-after", "5s")
		c.gws = []*proc{gw}
		c.waitFor("the gateway sees 2 ready hosts", func() bool {
			var h struct {
				Ready int `json:"hosts_ready"`
			}
			c.call(gw, "GET", "/healthz", nil, &h)
			return h.Ready == 2
		})
	})

	c.phase("snapshot", 3*time.Minute, func(t *testing.T) {
		id = c.create(gw)
		host := c.hostOf(id)
		// Sessions on the same host: one never snapshotted, one hibernated.
		// (The gateway places by free slots: the sessions that land on
		// the other host are kept until then, so that it fills and the
		// first one's host is chosen.)
		var elsewhere []string
		sameHost := func() string {
			for range 40 {
				if s := c.create(gw); s != "" && c.hostOf(s) == host {
					return s
				} else if s != "" {
					elsewhere = append(elsewhere, s)
				}
			}
			t.Fatal("no session landed on the first one's host in 40 tries")
			return ""
		}
		bare, hib = sameHost(), sameHost()
		for _, s := range elsewhere {
			c.call(gw, "DELETE", "/v1/sessions/"+s, nil, nil)
		}
		if st, r := c.exec(gw, hib, "x = 7\nopen('f.txt','w').write('hib')"); st != 200 || r.Status != "ok" {
			t.Fatalf("execute: %d %+v", st, r)
		}
		var hsn struct {
			ID string `json:"id"`
		}
		if st := c.call(gw, "POST", "/v1/sessions/"+hib+"/snapshots", nil, &hsn); st != http.StatusCreated {
			t.Fatalf("snapshot: %d", st)
		}
		var hs struct {
			State string `json:"state"`
		}
		if st := c.call(gw, "POST", "/v1/sessions/"+hib+"/hibernate", nil, &hs); st != 200 || hs.State != "hibernated" {
			t.Fatalf("hibernate through the gateway: %d %+v", st, hs)
		}
		// The host recorded the hibernation's snapshot in the cell.
		var hsnap string
		if err := pgQuery(c, `SELECT snapshot FROM sessions WHERE id = $1`, hib, &hsnap); err != nil || hsnap == "" || hsnap == hsn.ID {
			t.Fatalf("sessions.snapshot of the hibernated %s = %q (%v), want its hibernation's, not %s", hib, hsnap, err, hsn.ID)
		}
		// It wakes: the hibernation's snapshot is deleted, the cell still
		// names it; a restore falls back to the newest one stored.
		if st, r := c.exec(gw, hib, "print(x)"); st != 200 || strings.TrimSpace(r.Stdout) != "7" {
			t.Fatalf("wake: %d %+v", st, r)
		}
		if st, r := c.exec(gw, id, "import os, hashlib\nos.makedirs('d', exist_ok=True)\nopen('d/a.bin','wb').write(os.urandom(1 << 20))\nh = hashlib.sha256(open('d/a.bin','rb').read()).hexdigest()\nanswer = 42\nprint(h)"); st != 200 || r.Status != "ok" {
			t.Fatalf("execute: %d %+v", st, r)
		}
		var sn struct {
			ID string `json:"id"`
		}
		if st := c.call(gw, "POST", "/v1/sessions/"+id+"/snapshots", map[string]string{"name": "before-loss"}, &sn); st != http.StatusCreated || sn.ID == "" {
			t.Fatalf("snapshot through the gateway: %d %+v", st, sn)
		}
		snap = sn.ID
		// The cell records it.
		var got string
		if err := pgQuery(c, `SELECT snapshot FROM sessions WHERE id = $1`, id, &got); err != nil || got != snap {
			t.Fatalf("sessions.snapshot of %s = %q (%v), want %s", id, got, err, snap)
		}
	})

	var newID string
	c.phase("kill and restore", 3*time.Minute, func(t *testing.T) {
		victim := c.hostOf(id)
		vi := indexOf(addrs, victim)
		if vi < 0 {
			t.Fatalf("session %s is on %q, not one of %v", id, victim, addrs)
		}
		c.hosts[vi].signal(syscall.SIGKILL)
		c.hosts[vi].wait(c)
		// No redirects followed: the 307 itself is checked.
		noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		var resp *http.Response
		var body []byte
		c.waitFor("the lost session is restored (307)", func() bool {
			req := c.request(gw, "POST", "/v1/sessions/"+id+"/execute", strings.NewReader(`{"code":"print(answer)"}`))
			req.Header.Set("Content-Type", "application/json")
			r, err := noFollow.Do(req)
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode == http.StatusBadGateway {
				return false // the host is not yet declared lost
			}
			resp, body = r, b
			return true
		})
		if resp.StatusCode != http.StatusTemporaryRedirect {
			t.Fatalf("lost session with a snapshot: %d %s, want 307", resp.StatusCode, body)
		}
		newID = resp.Header.Get("Sandloop-Session-Id")
		if newID == "" || newID == id || resp.Header.Get("Location") != "/v1/sessions/"+newID+"/execute" || resp.Header.Get("Sandloop-Restored-From") != id {
			t.Fatalf("redirect headers: %v", resp.Header)
		}
		said := resp.Header.Get("Sandloop-Restored")
		if !strings.Contains(said, "files exact") || !strings.Contains(said, "answer") {
			t.Errorf("Sandloop-Restored = %q, want files exact and the variable answer", said)
		}
		if h := c.hostOf(newID); h == c.hostOf(id) {
			t.Errorf("restored on the lost host %s", h)
		}
		// Following the redirect (as clients do) runs the code there: the
		// variable and the file came back.
		st, r := c.exec(gw, id, "print(answer, hashlib.sha256(open('d/a.bin','rb').read()).hexdigest() == h)")
		if st != 200 || r.Status != "ok" || strings.TrimSpace(r.Stdout) != "42 True" {
			t.Errorf("through the old id, redirected: %d %+v", st, r)
		}
		// The old id leads to the same session, not another restore.
		req := c.request(gw, "GET", "/v1/sessions/"+id, nil)
		r2, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r2.Body.Close()
		if r2.StatusCode != http.StatusTemporaryRedirect || r2.Header.Get("Sandloop-Session-Id") != newID {
			t.Errorf("second request of the old id: %d -> %q, want 307 -> %s", r2.StatusCode, r2.Header.Get("Sandloop-Session-Id"), newID)
		}
		// The one hibernated and woken comes back too, from its explicit
		// snapshot (its hibernation's is gone).
		if st, r := c.exec(gw, hib, "print(x, open('f.txt').read())"); st != 200 || r.Status != "ok" || strings.TrimSpace(r.Stdout) != "7 hib" {
			t.Errorf("the hibernated session of the lost host, redirected: %d %+v", st, r)
		}
		var n int
		if err := pgQuery(c, `SELECT count(*) FROM sessions WHERE snapshot = $1 AND NOT lost`, snap, &n); err != nil || n != 1 {
			t.Errorf("live sessions from the snapshot: %d (%v), want 1", n, err)
		}
	})

	c.phase("other token and no snapshot", time.Minute, func(t *testing.T) {
		for _, p := range []string{"/v1/sessions/" + id, "/v1/sessions/" + newID} {
			req, _ := http.NewRequestWithContext(c.ctx, "GET", "http://"+gw.addr+p, nil)
			req.Header.Set("Authorization", "Bearer "+other)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("another token's GET %s: %d, want 404", p, resp.StatusCode)
			}
		}
		st, r := c.exec(gw, bare, "1")
		if st != http.StatusGone || r.Error == nil || r.Error.Code != "host_lost" {
			t.Errorf("lost session without a snapshot: %d %+v, want 410 host_lost", st, r)
		}
		// The restored session is an ordinary one: it can be deleted.
		if st := c.call(gw, "DELETE", "/v1/sessions/"+newID, nil, nil); st != http.StatusNoContent && st != http.StatusOK {
			t.Errorf("delete the restored session: %d", st)
		}
	})
}

// pgQuery reads one value from the cell's database.
func pgQuery(c *cell, q, arg string, out any) error {
	conn, err := pgx.Connect(c.ctx, c.db)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(c.ctx, q, arg).Scan(out)
}
