package jail

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOverlayWorkspace: a workspace over a frozen directory shows its
// files, takes writes and deletes in its own capped tmpfs (the frozen one
// read-only and untouched), counts only those, and leaves nothing once
// removed; a dead owner's stacked overlay is swept.
func TestOverlayWorkspace(t *testing.T) {
	if r := OverlayUnsupported(); r != "" {
		t.Skip(r)
	}
	lower, err := NewFrozenDir(4<<20, 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lower.Remove() })
	if err := os.WriteFile(filepath.Join(lower.Path, "a"), []byte("shared"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := lower.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower.Path, "b"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("a write to the frozen directory: %v, want EROFS", err)
	}
	q, err := NewQuotaDir(1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Remove() })
	if err := q.MountOverlay(lower.Path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(q.Path, "a")); err != nil || string(b) != "shared" {
		t.Errorf("the shared file in the overlay: %q %v", b, err)
	}
	if u, err := q.Usage(); err != nil || u != (Usage{}) {
		t.Errorf("usage of an overlay that wrote nothing: %+v %v, want zero", u, err)
	}
	if err := os.WriteFile(filepath.Join(q.Path, "big"), make([]byte, 2<<20), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("2 MiB into a 1 MiB workspace: %v, want ENOSPC", err)
	}
	os.Remove(filepath.Join(q.Path, "big"))
	if err := os.Remove(filepath.Join(q.Path, "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(lower.Path, "a")); err != nil {
		t.Errorf("a delete in the overlay reached the frozen directory: %v", err)
	}
	// The whiteout takes an inode (the first one two); the rest of the
	// 16 fit.
	n := 0
	for ; n < 30; n++ {
		if err := os.WriteFile(filepath.Join(q.Path, fmt.Sprint("f", n)), nil, 0o644); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if n < 14 || n > 16 {
		t.Errorf("%d files fit beside the whiteout, want 14-16 (16 files a workspace, a whiteout takes one or two)", n)
	}
	if u, _ := q.Usage(); u.Files < int64(n) || u.Files > int64(n)+2 {
		t.Errorf("usage %+v with %d files and a whiteout", u, n)
	}
	if err := q.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, m := range readMountinfo() {
		if m.point == q.Path {
			t.Errorf("%s still mounted after Remove", q.Path)
		}
	}
	if _, err := os.Stat(q.Path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there after Remove (%v)", q.Path, err)
	}

	// A dead sandloop's overlay workspace: both mounts swept.
	tmp := t.TempDir()
	owner := deadOwner(t)
	p := filepath.Join(tmp, "sandloop-ws-"+owner+"-1")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(p) })
	left := &QuotaDir{Path: p, Enforced: true, Files: 16}
	if err := left.MountOverlay(lower.Path); err != nil {
		t.Fatal(err)
	}
	if n := sweepQuotaDirs(tmp); n != 1 {
		t.Errorf("swept %d, want the dead owner's overlay workspace", n)
	}
	for _, m := range readMountinfo() {
		if m.point == p {
			t.Errorf("%s still mounted after the sweep", p)
		}
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there after the sweep (%v)", p, err)
	}
}
