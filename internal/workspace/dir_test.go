package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestOpenDir(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"a/b"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	os.Symlink("a", filepath.Join(dir, "link"))
	os.Symlink(outside, filepath.Join(dir, "out"))
	w, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		p    string
		want error
	}{
		{".", nil}, {"a/b", nil}, {"/a", nil},
		{"file", ErrNotDir}, {"link", ErrNotDir}, {"out", ErrNotDir}, {"missing", ErrNotFound},
		{"../x", nil /* a PathError of Clean */},
	} {
		f, err := w.OpenDir(c.p)
		if f != nil {
			f.Close()
		}
		var pe *PathError
		switch {
		case c.p == "../x":
			if !errors.As(err, &pe) {
				t.Errorf("%s: %v, want a PathError", c.p, err)
			}
		case c.want == nil && err != nil, c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", c.p, err, c.want)
		}
	}
	// A symlink in the middle that leads out is refused too.
	if f, err := w.OpenDir("out/x"); err == nil {
		f.Close()
		t.Error("out/x opened through a symlink out of the workspace")
	}
}
