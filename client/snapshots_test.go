package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

// Snapshots through the SDK on a real server with a snapshot store: take,
// list, restore into a new session, hibernate and wake, delete.
func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	url := newServer(t, &host.Config{MaxSessions: 8, DataDir: t.TempDir()})
	c := newClient(t, url, nil)
	s := newSession(t, c, nil)
	if r, err := c.Execute(ctx, s.ID, "rows = [1, 2]\nopen('a.txt', 'w').write('a')", nil); err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	snap, err := c.Snapshot(ctx, s.ID, "v1")
	if err != nil || snap.Name != "v1" || snap.Files != 1 || !slices.Contains(snap.Variables, "rows") {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	list, err := c.Snapshots(ctx, s.ID)
	if err != nil || len(list) != 1 || list[0].ID != snap.ID {
		t.Fatalf("snapshots: %+v %v", list, err)
	}
	got, err := c.GetSnapshot(ctx, snap.ID)
	if err != nil || len(got.FileList) != 1 || got.FileList[0].Path != "a.txt" {
		t.Fatalf("get: %+v %v", got, err)
	}
	n, err := c.RestoreSnapshot(ctx, snap.ID, nil)
	if err != nil || n.Restored == nil || n.Restored.Snapshot != snap.ID || !slices.Contains(n.Restored.Variables, "rows") {
		t.Fatalf("restore: %+v %v", n, err)
	}
	t.Cleanup(func() { c.DeleteSession(ctx, n.ID) })
	if r, err := c.Execute(ctx, n.ID, "rows, open('a.txt').read()", nil); err != nil || r.Text() != "([1, 2], 'a')" {
		t.Errorf("restored: %+v %v", r, err)
	}
	h, err := c.Hibernate(ctx, n.ID)
	if err != nil || h.State != "hibernated" {
		t.Fatalf("hibernate: %+v %v", h, err)
	}
	if r, err := c.Execute(ctx, n.ID, "rows", nil); err != nil || r.Text() != "[1, 2]" {
		t.Errorf("after the wake: %+v %v", r, err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	var ae *client.APIError
	if _, err := c.GetSnapshot(ctx, snap.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("deleted snapshot: %v", err)
	}
}
