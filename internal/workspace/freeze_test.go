package workspace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// TestCopyTree copies a tree with a subdirectory, modes, times, a symlink
// and a FIFO: all but the FIFO (reported) come across as they were, the
// symlink not followed; Unchanged holds until a file changes.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "d/e"), 0o750))
	must(os.WriteFile(filepath.Join(src, "d/e/f.txt"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "top"), make([]byte, 1<<20), 0o600))
	must(os.Symlink("/etc/passwd", filepath.Join(src, "out")))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	must(os.Chtimes(filepath.Join(src, "d/e/f.txt"), old, old))
	must(os.Chtimes(filepath.Join(src, "d"), old, old))
	sw, err := Open(src, nil)
	must(err)
	defer sw.Close()
	dw, err := Open(dst, nil)
	must(err)
	defer dw.Close()
	c, err := CopyTree(dw, sw)
	must(err)
	if c.Files != 2 || c.Bytes != 5+1<<20 || len(c.Skipped) != 1 || c.Skipped[0] != "fifo" {
		t.Errorf("copied %d files, %d bytes, skipped %q: want 2, %d, [fifo]", c.Files, c.Bytes, c.Skipped, 5+1<<20)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "d/e/f.txt")); err != nil || string(b) != "hello" {
		t.Errorf("copied file: %q %v", b, err)
	}
	for p, want := range map[string]os.FileMode{"d": 0o750 | os.ModeDir, "d/e/f.txt": 0o640, "top": 0o600} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want mode %v", p, fi.Mode(), err, want)
		}
	}
	for _, p := range []string{"d", "d/e/f.txt"} {
		if fi, err := os.Lstat(filepath.Join(dst, p)); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("%s: modified %v, want %v", p, fi.ModTime(), old)
		}
	}
	if l, err := os.Readlink(filepath.Join(dst, "out")); err != nil || l != "/etc/passwd" {
		t.Errorf("symlink: %q %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("the FIFO was copied: %v", err)
	}
	// Copied just now: racy, never unchanged. A copy made later is.
	if c.Unchanged(sw) {
		t.Error("a copy of files changed within the racy window is called unchanged")
	}
	time.Sleep(2 * racyWindow)
	must(os.RemoveAll(dst))
	must(os.Mkdir(dst, 0o755))
	dw2, err := Open(dst, nil)
	must(err)
	defer dw2.Close()
	c, err = CopyTree(dw2, sw)
	must(err)
	if !c.Unchanged(sw) {
		t.Error("unchanged files are called changed")
	}
	must(os.WriteFile(filepath.Join(src, "d/e/f.txt"), []byte("HELLO"), 0o640))
	if c.Unchanged(sw) {
		t.Error("a rewritten file is called unchanged")
	}
	time.Sleep(2 * racyWindow)
	c, err = CopyTree(mustEmpty(t), sw)
	must(err)
	if !c.Unchanged(sw) {
		t.Error("unchanged files are called changed")
	}
	must(os.WriteFile(filepath.Join(src, "new"), nil, 0o600))
	if c.Unchanged(sw) {
		t.Error("a new file is not seen")
	}

	// Update brings a copy up to date with what changed since: a file
	// rewritten, one removed, a directory replaced by a file, a new one.
	dw3 := mustEmpty(t)
	c, err = CopyTree(dw3, sw)
	must(err)
	must(os.WriteFile(filepath.Join(src, "top"), []byte("short now"), 0o644))
	must(os.Remove(filepath.Join(src, "new")))
	must(os.RemoveAll(filepath.Join(src, "d/e")))
	must(os.WriteFile(filepath.Join(src, "d/e"), []byte("a file"), 0o600))
	must(os.Mkdir(filepath.Join(src, "n"), 0o700))
	must(os.WriteFile(filepath.Join(src, "n/x"), []byte("x"), 0o600))
	must(os.Chtimes(filepath.Join(src, "n/x"), old, old))
	n, err := c.Update(dw3, sw)
	must(err)
	if n == 0 {
		t.Error("Update copied nothing")
	}
	want := testutil.Tree(t, src, true)
	delete(want, "fifo")
	if d := diffTrees(want, testutil.Tree(t, dw3.root.Name(), true)); d != "" {
		t.Errorf("after Update the copy differs:\n%s", d)
	}
	if c.Files != 3 || len(c.Skipped) != 1 {
		t.Errorf("after Update: %d files, skipped %q; want 3, [fifo]", c.Files, c.Skipped)
	}
}

func mustEmpty(t *testing.T) *Workspace {
	w, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}
