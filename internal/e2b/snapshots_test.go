package e2b

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot/snapshottest"
)

// Snapshots are their owner's: another key's create from it, delete and
// list find nothing (404, false, not listed); errors have E2B's shape.
func TestSnapshotsOwnerScoped(t *testing.T) {
	st := snapshottest.Dir(t)
	ts := newTestServerWith(t, Options{}, session.ManagerOptions{Snapshots: st})
	a := ts.create(t, keyA, `{}`)
	resp, b := ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"mine"}`, keyA)
	var sn snapshotJSON
	if json.Unmarshal(b, &sn); resp.StatusCode != 201 || !strings.HasPrefix(sn.SnapshotID, "snap-") || len(sn.Names) != 1 {
		t.Fatalf("createSnapshot: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{}`, keyB); resp.StatusCode != 404 || !strings.Contains(string(b), `"code":404`) {
		t.Errorf("another key's snapshot of the sandbox: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "POST", "/v2/sandboxes", `{"templateID":"`+sn.SnapshotID+`"}`, keyB); resp.StatusCode != 404 {
		t.Errorf("another key's create from it: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "GET", "/snapshots", "", keyB); resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("another key's list: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "DELETE", "/templates/"+sn.SnapshotID, "", keyB); resp.StatusCode != 404 {
		t.Errorf("another key's delete: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "GET", "/snapshots?limit=0", "", keyA); resp.StatusCode != 400 || !strings.Contains(string(b), `"code":400`) {
		t.Errorf("limit=0: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "DELETE", "/templates/"+sn.SnapshotID, "", keyA); resp.StatusCode != 204 {
		t.Errorf("delete: %d %s", resp.StatusCode, b)
	}
}
