package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// restoreCell is the smallest real setup that answers a restore's 307: a
// gateway and PostgreSQL in this process, two real hosts sharing one
// snapshot directory, and a session with a variable and a file that was
// snapshotted and whose host is then closed (lost to the gateway).
type restoreCell struct {
	url, token string
	old        string // the lost session
}

func newRestoreCell(t *testing.T) *restoreCell {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL, two hosts and a gateway")
	}
	const secret = "client-restore-secret-0123456789abcdef"
	const token = "client-restore-token-0123456789"
	pgs := pgtest.Start(t)
	pg, err := store.OpenPostgres(t.Context(), pgs.NewDatabase(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	snaps := t.TempDir()
	var static gateway.Static
	hosts := map[string]func(){} // name → close (once)
	for range 2 {
		h, err := startHost(&host.Config{GatewaySecret: secret, SnapshotStore: snaps, MaxSessions: 4})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		closeHost := func() {
			once.Do(func() {
				if err := h.Close(); err != nil {
					t.Errorf("host close: %v", err)
				}
			})
		}
		t.Cleanup(closeHost)
		u, _ := url.Parse(h.URL())
		hosts[u.Host] = closeHost
		static = append(static, gateway.Target{Name: u.Host, URL: h.URL()})
	}
	gw, err := gateway.New(&gateway.Options{Discovery: static, Cluster: pg, Secret: secret, Tokens: []string{token},
		HealthInterval: 100 * time.Millisecond, LostAfter: time.Second})
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

	c, err := client.New(ts.URL, &client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Execute(t.Context(), s.ID, "answer = 42\nopen('kept.txt', 'w').write('kept')", nil); err != nil || r.Status != client.StatusOK {
		t.Fatalf("execute: %v %+v", err, r)
	}
	if _, err := c.Snapshot(t.Context(), s.ID, "before-loss"); err != nil {
		t.Fatal(err)
	}
	pl, err := pg.GetPlacement(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	hosts[pl.Host]()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if pl, err := pg.GetPlacement(t.Context(), s.ID); err != nil || !pl.Lost {
			return fmt.Errorf("the gateway has not declared the closed host's session lost (%v)", err)
		}
		return nil
	})
	return &restoreCell{url: ts.URL, token: token, old: s.ID}
}

// onlyReader hides every method of a reader but Read: a body the client
// cannot rewind.
type onlyReader struct{ io.Reader }

// TestClientFollowsARestore: the first request of a lost session meets the
// restore (a 307 from the gateway) with a body the client cannot rewind
// (an upload streamed from a plain reader): the client sends it again to
// the restored session, tells OnRestored once what came back, and sends
// every later call of the old id to the new one (JSON, a stream, a
// session's description). A second client, which meets a later 307 of
// the same id (no summary on it), still learns what came back, and
// re-sends a seekable body (a file) by seeking it back.
func TestClientFollowsARestore(t *testing.T) {
	cell := newRestoreCell(t)
	var mu sync.Mutex
	var got []client.Restore
	c, err := client.New(cell.url, &client.Options{Token: cell.token, OnRestored: func(r client.Restore) {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	data := make([]byte, 1<<20)
	rand.Read(data)
	f, err := c.Upload(ctx, cell.old, "up/data.bin", onlyReader{bytes.NewReader(data)})
	if err != nil {
		t.Fatalf("upload through the restore: %v", err)
	}
	if f.Size != int64(len(data)) {
		t.Errorf("uploaded %d bytes, want %d", f.Size, len(data))
	}
	newID := c.SessionID(cell.old)
	if newID == cell.old || newID == "" {
		t.Fatalf("SessionID(%s) = %q after the restore", cell.old, newID)
	}
	mu.Lock()
	if len(got) != 1 || got[0].From != cell.old || got[0].To != newID ||
		!strings.Contains(got[0].Summary, "files exact") || !strings.Contains(got[0].Summary, "answer") {
		t.Errorf("OnRestored got %+v, want one restore %s → %s saying files exact and the variable answer", got, cell.old, newID)
	}
	mu.Unlock()

	back, err := c.ReadFile(ctx, newID, "up/data.bin")
	if err != nil || !bytes.Equal(back, data) {
		t.Errorf("the uploaded file on the restored session: %d bytes, %v; want the %d sent", len(back), err, len(data))
	}
	r, err := c.Execute(ctx, cell.old, "print(answer, open('kept.txt').read())", nil)
	if err != nil || strings.TrimSpace(r.Stdout) != "42 kept" {
		t.Errorf("execute by the old id: %v %+v", err, r)
	}
	var events int
	r, err = c.ExecuteStream(ctx, cell.old, "answer + 1", nil, func(client.Event) { events++ })
	if err != nil || r.Text() != "43" || events == 0 {
		t.Errorf("stream by the old id: %v %+v (%d events)", err, r, events)
	}
	s, err := c.GetSession(ctx, cell.old)
	if err != nil || s.ID != newID || s.Restored == nil || s.Restored.Snapshot == "" {
		t.Errorf("GetSession(old) = %+v, %v; want session %s restored from a snapshot", s, err, newID)
	}
	mu.Lock()
	if len(got) != 1 {
		t.Errorf("OnRestored called %d times, want once", len(got))
	}
	mu.Unlock()

	// A client that has not met the restore: the gateway's later 307 has
	// no summary; the client reads it from the new session.
	var later []client.Restore
	c2, _ := client.New(cell.url, &client.Options{Token: cell.token, OnRestored: func(r client.Restore) { later = append(later, r) }})
	p := filepath.Join(t.TempDir(), "seek.txt")
	os.WriteFile(p, []byte("sent twice, whole"), 0o600)
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := c2.Upload(ctx, cell.old, "seek.txt", fh); err != nil {
		t.Fatalf("upload of a file through a later redirect: %v", err)
	}
	if b, err := c2.ReadFile(ctx, cell.old, "seek.txt"); err != nil || string(b) != "sent twice, whole" {
		t.Errorf("the file re-sent after seeking back: %q, %v", b, err)
	}
	if len(later) != 1 || later[0].To != newID || !strings.Contains(later[0].Summary, "variables restored: answer") {
		t.Errorf("second client's OnRestored got %+v, want %s with what came back", later, newID)
	}
}
