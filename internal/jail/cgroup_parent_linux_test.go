package jail

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGroupParentDescriptor checks that the group* calls go through the
// parent's descriptor, and that a parent removed and made again (its
// descriptor then names a deleted directory) is opened again rather than
// failing every later call.
func TestGroupParentDescriptor(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "hierarchy")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forgetParent(filepath.Join(parent, "x")) })
	g := filepath.Join(parent, "sandloop-a")
	if err := groupMkdir(g); err != nil {
		t.Fatal(err)
	}
	if v, ok := groupParents.Load(parent + "/"); !ok || v.(int) < 0 {
		t.Fatalf("no descriptor held for %s: %v", parent, v)
	}
	if err := os.WriteFile(filepath.Join(g, "pids.max"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := groupWrite(g, "pids.max", "64"); err != nil {
		t.Fatal(err)
	}
	if got := groupRead(g, "pids.max"); got != "64" {
		t.Fatalf("read back %q", got)
	}
	if err := groupWrite(g, "missing", "1"); !os.IsNotExist(err) {
		t.Fatalf("a file the group lacks: %v, want not-exist (writeLimits skips those)", err)
	}
	if err := groupMkdir(g); !os.IsExist(err) {
		t.Fatalf("mkdir again: %v, want exists", err)
	}
	// (A cgroup's interface files go with it; here they are files.)
	if err := os.Remove(filepath.Join(g, "pids.max")); err != nil {
		t.Fatal(err)
	}
	if err := groupRmdir(g); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", g, err)
	}
	// The hierarchy's directory is made again: a new directory.
	if err := os.Remove(parent); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	g = filepath.Join(parent, "sandloop-b")
	if err := groupMkdir(g); err != nil {
		t.Fatalf("mkdir after the parent was made again: %v", err)
	}
	if _, err := os.Stat(g); err != nil {
		t.Fatal(err)
	}
	if err := groupRmdir(g); err != nil {
		t.Fatal(err)
	}
}
