package workspace

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newWS(t testing.TB, opts Options) (*Workspace, string) {
	t.Helper()
	dir := t.TempDir()
	w, err := Open(dir, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, dir
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{"": ".", "/": ".", "a/b": "a/b", "/a//b/": "a/b", "./a": "a"} {
		if got, err := Clean(in); err != nil || got != want {
			t.Errorf("Clean(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "../x", "a/../../x", "a/..", "x\x00y"} {
		var pe *PathError
		if _, err := Clean(bad); !errors.As(err, &pe) {
			t.Errorf("Clean(%q) = %v, want a PathError", bad, err)
		}
	}
}

func TestWriteReadListRemove(t *testing.T) {
	w, dir := newWS(t, Options{})
	if _, err := w.Write("src/app.py", strings.NewReader("print(1)\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write("/src/app.py", strings.NewReader("print(2)\n")); err != nil { // replace
		t.Fatal(err)
	}
	b, err := w.ReadFile("src/app.py", 1<<20)
	if err != nil || string(b) != "print(2)\n" {
		t.Fatalf("read back %q %v", b, err)
	}
	if _, err := w.ReadFile("src/app.py", 3); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile over max: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "z.txt"), []byte("zz"), 0o644)
	list, err := w.List("/")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "src" || list[0].Type != "dir" || list[1].Name != "z.txt" || list[1].Size != 2 || list[1].Type != "file" {
		t.Errorf("list: %+v", list)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "src", ".sandloop-upload-*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
	if err := w.Remove("src"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Stat("src/app.py"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after remove: %v", err)
	}
	if err := w.Remove("nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove missing: %v", err)
	}
	// A path that cleans to the root is refused, never "delete everything".
	w.Write("keep.txt", strings.NewReader("x"))
	for _, root := range []string{"", "/", ".", "./", "//.", "a/./."[2:]} {
		if err := w.Remove(root); !errors.Is(err, ErrRoot) {
			t.Errorf("Remove(%q): %v, want ErrRoot", root, err)
		}
	}
	if _, err := w.Stat("keep.txt"); err != nil {
		t.Fatalf("a refused Remove deleted files: %v", err)
	}
	if err := w.Clear(); err != nil {
		t.Fatal(err)
	}
	if list, _ := w.List("."); len(list) != 0 {
		t.Errorf("workspace not emptied: %+v", list)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("root removed: %v", err)
	}
}

// Sandboxed code controls the workspace: it may plant symlinks and FIFOs.
func TestPlantedEscapesFail(t *testing.T) {
	w, dir := newWS(t, Options{})
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link"))
	os.Symlink("../../../../../../../../"+outside, filepath.Join(dir, "reldir"))
	os.Symlink(outside, filepath.Join(dir, "absdir"))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"link", "reldir/secret", "absdir/secret"} {
		if b, err := w.ReadFile(p, 1<<20); err == nil {
			t.Errorf("read %s through a planted symlink: %q", p, b)
		}
	}
	for _, p := range []string{"absdir/new", "reldir/new"} {
		if _, err := w.Write(p, strings.NewReader("x")); err == nil {
			t.Errorf("wrote %s through a planted symlink", p)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Error("a file was created outside the workspace")
	}
	// Writing over a planted symlink replaces the link, not its target.
	if _, err := w.Write("link", strings.NewReader("replaced")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host secret" {
		t.Errorf("host file changed: %q", b)
	}
	done := make(chan error, 1)
	go func() { _, err := w.ReadFile("fifo", 10); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("fifo: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO blocked")
	}
	var buf bytes.Buffer
	if err := w.Archive(context.Background(), &buf, FormatTarGz, "."); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "host secret") {
		t.Error("archive followed a symlink out of the workspace")
	}
}

func TestSizeCaps(t *testing.T) {
	w, _ := newWS(t, Options{MaxFileBytes: 100, MaxTotalBytes: 150})
	if _, err := w.Write("a", strings.NewReader(strings.Repeat("x", 101))); !errors.Is(err, ErrTooLarge) {
		t.Errorf("file cap: %v", err)
	}
	if _, err := w.Write("a", strings.NewReader(strings.Repeat("x", 100))); err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if _, err := w.Write("b", strings.NewReader(strings.Repeat("x", 60))); !errors.As(err, &le) || le.What != "workspace" {
		t.Errorf("workspace cap: %v", err)
	}
	// Replacing a file counts only the difference.
	if _, err := w.Write("a", strings.NewReader(strings.Repeat("y", 100))); err != nil {
		t.Errorf("replace within cap: %v", err)
	}
	if b, _ := w.ReadFile("a", 1000); string(b) != strings.Repeat("y", 100) {
		t.Errorf("content after failed writes: %q", b)
	}
}

func TestArchiveFormats(t *testing.T) {
	w, dir := newWS(t, Options{})
	w.Write("app/main.py", strings.NewReader("print('hi')"))
	w.Write("README.md", strings.NewReader("# app"))
	os.Chmod(filepath.Join(dir, "app", "main.py"), 0o755)
	var tgz, zbuf bytes.Buffer
	if err := w.Archive(context.Background(), &tgz, FormatTarGz, "."); err != nil {
		t.Fatal(err)
	}
	if err := w.Archive(context.Background(), &zbuf, FormatZip, "."); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(&tgz)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var tarNames []string
	contents := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tarNames = append(tarNames, h.Name)
		b, _ := io.ReadAll(tr)
		contents[h.Name] = string(b)
		if h.Name == "app/main.py" && h.Mode&0o100 == 0 {
			t.Error("executable bit lost")
		}
	}
	sort.Strings(tarNames)
	if strings.Join(tarNames, ",") != "README.md,app/,app/main.py" || contents["app/main.py"] != "print('hi')" {
		t.Errorf("tar: %v %v", tarNames, contents)
	}
	zr, err := zip.NewReader(bytes.NewReader(zbuf.Bytes()), int64(zbuf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var zipNames []string
	for _, f := range zr.File {
		zipNames = append(zipNames, f.Name)
	}
	sort.Strings(zipNames)
	if strings.Join(zipNames, ",") != "README.md,app/,app/main.py" {
		t.Errorf("zip: %v", zipNames)
	}
	if err := w.Archive(context.Background(), io.Discard, "rar", "."); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestWalk(t *testing.T) {
	w, dir := newWS(t, Options{})
	for _, p := range []string{"b.txt", "a/x.py", "a/__pycache__/x.pyc", "c/d/e.txt"} {
		if _, err := w.Write(p, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink(t.TempDir(), filepath.Join(dir, "link"))
	var got []string
	skip := func(e Entry) bool { return e.Name == "__pycache__" }
	if err := w.Walk(".", skip, func(e Entry) error { got = append(got, e.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "a/x.py,b.txt,c/d/e.txt" {
		t.Errorf("walk: %v", got)
	}
	n := 0
	if err := w.Walk(".", nil, func(Entry) error {
		n++
		if n == 2 {
			return fs.SkipAll
		}
		return nil
	}); err != nil || n != 2 {
		t.Errorf("SkipAll: n=%d err=%v", n, err)
	}
}

// A write the file system refuses (a full quota mount) fails with a
// LimitError and leaves nothing behind, not even the parents it made.
func TestWriteOverQuotaStoresNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,nr_inodes=8"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	w, err := Open(dir, &Options{MaxTotalBytes: 100 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"a/b/big.bin", bytes.Repeat([]byte("x"), 2<<20)}, // past the bytes
		{"c/d/e/f/g/h/i/j.txt", []byte("x")},              // past the inodes
	} {
		_, err := w.Write(c.name, bytes.NewReader(c.data))
		var le *LimitError
		if !errors.As(err, &le) || le.What != "quota" || !strings.Contains(err.Error(), "nothing was stored") {
			t.Errorf("write %s: %v, want a quota LimitError", c.name, err)
		}
		if des, _ := os.ReadDir(dir); len(des) != 0 {
			t.Errorf("after the refused write of %s the workspace holds %v", c.name, des)
		}
	}
}

func TestRename(t *testing.T) {
	w, dir := newWS(t, Options{})
	if _, err := w.Write("a.txt", strings.NewReader("A")); err != nil {
		t.Fatal(err)
	}
	if err := w.Rename("a.txt", "/deep/er/b.txt"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "deep/er/b.txt")); err != nil || string(b) != "A" {
		t.Fatalf("moved file: %q %v", b, err)
	}
	if _, err := w.Stat("a.txt"); !errors.Is(err, ErrNotFound) {
		t.Errorf("source still there: %v", err)
	}
	if err := w.Rename("nothing", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("rename missing: %v", err)
	}
	for _, c := range [][2]string{{"/", "x"}, {"deep", "/"}, {"deep", "../x"}} {
		var pe *PathError
		if err := w.Rename(c[0], c[1]); !errors.As(err, &pe) {
			t.Errorf("Rename(%q, %q) = %v, want a PathError", c[0], c[1], err)
		}
	}
	os.Symlink("/etc", filepath.Join(dir, "out"))
	if err := w.Rename("deep", "out/x"); err == nil {
		t.Error("rename through a planted symlink succeeded")
	}
}
