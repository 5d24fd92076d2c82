package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/gateway/restoretest"
)

// onlyReader hides every method of a reader but Read: a body the client
// cannot rewind.
type onlyReader struct{ io.Reader }

// TestClientFollowsARestore (a gateway, PostgreSQL and two real hosts:
// restoretest): the first request of a lost session meets the
// restore (a 307 from the gateway) with a body the client cannot rewind
// (an upload streamed from a plain reader): the client sends it again to
// the restored session, tells OnRestored once what came back, and sends
// every later call of the old id to the new one (JSON, a stream, a
// session's description). A second client, which meets a later 307 of
// the same id (no summary on it), still learns what came back, and
// re-sends a seekable body (a file) by seeking it back.
func TestClientFollowsARestore(t *testing.T) {
	cell := restoretest.New(t, nil)
	cell.Lose(t)
	var mu sync.Mutex
	var got []client.Restore
	c, err := client.New(cell.URL, &client.Options{Token: cell.Token, OnRestored: func(r client.Restore) {
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
	f, err := c.Upload(ctx, cell.Session, "up/data.bin", onlyReader{bytes.NewReader(data)})
	if err != nil {
		t.Fatalf("upload through the restore: %v", err)
	}
	if f.Size != int64(len(data)) {
		t.Errorf("uploaded %d bytes, want %d", f.Size, len(data))
	}
	newID := c.SessionID(cell.Session)
	if newID == cell.Session || newID == "" {
		t.Fatalf("SessionID(%s) = %q after the restore", cell.Session, newID)
	}
	mu.Lock()
	if len(got) != 1 || got[0].From != cell.Session || got[0].To != newID ||
		!strings.Contains(got[0].Summary, "files exact") || !strings.Contains(got[0].Summary, "answer") {
		t.Errorf("OnRestored got %+v, want one restore %s → %s saying files exact and the variable answer", got, cell.Session, newID)
	}
	mu.Unlock()

	back, err := c.ReadFile(ctx, newID, "up/data.bin")
	if err != nil || !bytes.Equal(back, data) {
		t.Errorf("the uploaded file on the restored session: %d bytes, %v; want the %d sent", len(back), err, len(data))
	}
	r, err := c.Execute(ctx, cell.Session, "print(answer, open('kept.txt').read())", nil)
	if err != nil || strings.TrimSpace(r.Stdout) != "42 kept" {
		t.Errorf("execute by the old id: %v %+v", err, r)
	}
	var events int
	r, err = c.ExecuteStream(ctx, cell.Session, "answer + 1", nil, func(client.Event) { events++ })
	if err != nil || r.Text() != "43" || events == 0 {
		t.Errorf("stream by the old id: %v %+v (%d events)", err, r, events)
	}
	s, err := c.GetSession(ctx, cell.Session)
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
	c2, _ := client.New(cell.URL, &client.Options{Token: cell.Token, OnRestored: func(r client.Restore) { later = append(later, r) }})
	p := filepath.Join(t.TempDir(), "seek.txt")
	os.WriteFile(p, []byte("sent twice, whole"), 0o600)
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := c2.Upload(ctx, cell.Session, "seek.txt", fh); err != nil {
		t.Fatalf("upload of a file through a later redirect: %v", err)
	}
	if b, err := c2.ReadFile(ctx, cell.Session, "seek.txt"); err != nil || string(b) != "sent twice, whole" {
		t.Errorf("the file re-sent after seeking back: %q, %v", b, err)
	}
	if len(later) != 1 || later[0].To != newID || !strings.Contains(later[0].Summary, "variables restored: answer") {
		t.Errorf("second client's OnRestored got %+v, want %s with what came back", later, newID)
	}
}
