package workspace

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBulkCountsUsage(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, &Options{MaxTotalBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write("pre", strings.NewReader(strings.Repeat("p", 30))); err != nil {
		t.Fatal(err)
	}
	b, err := w.Bulk()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write("a/x", strings.NewReader(strings.Repeat("x", 50))); err != nil {
		t.Fatal(err)
	}
	// 30 + 50 + 30 > 100: refused, and the new parent not left behind.
	_, err = b.Write("b/y", strings.NewReader(strings.Repeat("y", 30)))
	var le *LimitError
	if !errors.As(err, &le) || le.What != "workspace" {
		t.Fatalf("over the cap: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused write left its directory: %v", err)
	}
	// Replacing a file counts its old size out: 30 + 60 ≤ 100.
	if _, err := b.Write("a/x", strings.NewReader(strings.Repeat("z", 60))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write("c", strings.NewReader(strings.Repeat("c", 11))); err == nil {
		t.Fatal("101 bytes written under a cap of 100")
	}
}

func TestTreeSymlinkChmod(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Symlink("/etc/passwd", "d/out"); err != nil {
		t.Fatal(err)
	}
	if l, err := w.Readlink("d/out"); err != nil || l != "/etc/passwd" {
		t.Fatalf("Readlink: %q %v", l, err)
	}
	// Chmod refuses the link rather than follow it out of the workspace.
	if err := w.Chmod("d/out", 0o600); err == nil {
		t.Fatal("chmod through a symlink")
	}
	if _, err := w.Write("d/f", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if err := w.Chmod("d/f", fs.ModeSetuid|fs.ModeSetgid|0o751); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "d/f"))
	if fi.Mode() != 0o751 {
		t.Fatalf("mode %v, want -rwxr-x--x (setuid dropped)", fi.Mode())
	}
	var got []string
	os.Mkdir(filepath.Join(dir, "empty"), 0o755)
	if err := w.WalkTree(func(e Entry) error { got = append(got, e.Type+" "+e.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "dir d,file d/f,symlink d/out,dir empty" {
		t.Fatalf("WalkTree: %v", got)
	}
}
