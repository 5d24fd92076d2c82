package client_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/client"
)

// Checkpoints, undo, restore, fork, pause and resume through the SDK, on
// the real server.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, &client.CreateOptions{Checkpoints: "auto"})
	text := func(id, code string) string {
		t.Helper()
		r, err := c.Execute(ctx, id, code, nil)
		if err != nil || r.Status != "ok" {
			t.Fatalf("%s: %+v %v", code, r, err)
		}
		return r.Text()
	}
	text(s.ID, "rows = [1, 2, 3]\nopen('data.csv', 'w').write('a\\n')")
	cp, err := c.Checkpoint(ctx, s.ID, "clean")
	if err != nil || cp.Name != "clean" || cp.Files != 1 || cp.ExecutionCount != 1 {
		t.Fatalf("checkpoint: %+v %v", cp, err)
	}
	text(s.ID, "rows.clear()\nimport os; os.remove('data.csv')")
	list, err := c.Checkpoints(ctx, s.ID)
	if err != nil || len(list) < 2 {
		t.Fatalf("checkpoints: %+v %v", list, err)
	}
	r, err := c.Undo(ctx, s.ID)
	if err != nil || r == nil || r.From != "undo" || r.Files != 1 {
		t.Fatalf("undo: %+v %v", r, err)
	}
	if got := text(s.ID, "rows"); got != "[1, 2, 3]" {
		t.Errorf("after undo: %s", got)
	}
	text(s.ID, "rows.append(4)")
	if r, err = c.RestoreCheckpoint(ctx, s.ID, cp.ID); err != nil || !strings.Contains(r.From, cp.ID) {
		t.Fatalf("restore: %+v %v", r, err)
	}
	if got := text(s.ID, "rows"); got != "[1, 2, 3]" {
		t.Errorf("after restore: %s", got)
	}
	got, err := c.GetSession(ctx, s.ID)
	if err != nil || got.Restored == nil || got.State != "running" {
		t.Fatalf("get: %+v %v", got, err)
	}

	kids, r, err := c.Fork(ctx, s.ID, 2, "")
	if err != nil || len(kids) != 2 || r == nil || kids[0].Restored == nil {
		t.Fatalf("fork: %+v %+v %v", kids, r, err)
	}
	for _, k := range kids {
		t.Cleanup(func() { c.DeleteSession(ctx, k.ID) })
	}
	if r.FilesBy != "overlay" && r.FilesBy != "copy" {
		t.Errorf("fork's files_by %q, want overlay or copy", r.FilesBy)
	}
	text(kids[0].ID, "rows.append('kid')")
	if got := text(kids[1].ID, "rows"); got != "[1, 2, 3]" {
		t.Errorf("the sibling sees %s", got)
	}

	p, err := c.Pause(ctx, s.ID)
	if err != nil || p.State != "paused" {
		t.Fatalf("pause: %+v %v", p, err)
	}
	if p, err = c.Resume(ctx, s.ID); err != nil || p.State != "running" {
		t.Fatalf("resume: %+v %v", p, err)
	}
	if err := c.DeleteCheckpoint(ctx, s.ID, cp.ID); err != nil {
		t.Fatal(err)
	}
	// Errors are *APIError: what is missing, and what is too many.
	if _, err := c.RestoreCheckpoint(ctx, s.ID, cp.ID); !client.IsNotFound(err) {
		t.Errorf("restore of a deleted checkpoint: %v", err)
	}
	if _, _, err := c.Fork(ctx, s.ID, 17, ""); apiError(t, err).StatusCode != 400 {
		t.Errorf("fork of 17: %v", err)
	}
	if _, err := c.Undo(ctx, "nosuchsession"); !client.IsNotFound(err) {
		t.Errorf("undo of an unknown session: %v", err)
	}
}
