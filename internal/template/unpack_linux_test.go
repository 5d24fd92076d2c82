package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ent is one entry of a hand-made layer.
type ent struct {
	name, body, link string
	typ              byte
	mode             int64
	size             int64 // if nonzero, the header's size (no body)
}

func layerTar(t *testing.T, es ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// unpackLayers applies the layers to a new tree inside a directory that
// also holds a "host" file beside the tree, which nothing may touch.
func unpackLayers(t *testing.T, maxSize int64, layers ...[]byte) (tree string, u *unpacker, err error) {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { removeTree(dir) })
	if err := os.WriteFile(filepath.Join(dir, "host-file"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree = filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	u, err = newUnpacker(tree, maxSize, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.close)
	for i, l := range layers {
		if err = u.apply(bytes.NewReader(l), i+1); err != nil {
			return tree, u, err
		}
	}
	return tree, u, nil
}

func hostUntouched(t *testing.T, tree string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tree, "..", "host-file"))
	if err != nil || string(b) != "host" {
		t.Fatalf("the file beside the tree changed: %q, %v", b, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(tree))
	if len(ents) != 2 {
		t.Fatalf("something was written beside the tree: %v", ents)
	}
}

func TestUnpackRefuses(t *testing.T) {
	cases := []struct {
		name   string
		layers [][]ent
		want   string
	}{
		{"absolute path", [][]ent{{{name: "/host-file", body: "pwned"}}}, "absolute path"},
		{"dot-dot in a path", [][]ent{{{name: "usr/../../host-file", body: "pwned"}}}, `".."`},
		{"hard link to an absolute path", [][]ent{{{name: "x", typ: tar.TypeLink, link: "/etc/passwd"}}}, "hard link to an absolute path"},
		{"hard link climbing out", [][]ent{{{name: "x", typ: tar.TypeLink, link: "../host-file"}}}, `hard link to ".."`},
		{"hard link to a file the image lacks", [][]ent{{{name: "x", typ: tar.TypeLink, link: "etc/passwd"}}}, "does not have"},
		{"whiteout climbing out", [][]ent{{{name: "a/", typ: tar.TypeDir, mode: 0o755}}, {{name: "a/../../.wh.host-file"}}}, `".."`},
		{"whiteout of dot-dot", [][]ent{{{name: "a/", typ: tar.TypeDir, mode: 0o755}}, {{name: "a/.wh.."}}}, "not a name"},
		{"giant file", [][]ent{{{name: "big", body: strings.Repeat("x", 4096)}}}, "more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ls [][]byte
			for _, l := range c.layers {
				ls = append(ls, layerTar(t, l...))
			}
			tree, _, err := unpackLayers(t, 1024, ls...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
			var le *LayerError
			var se *ImageSizeError
			if !errors.As(err, &le) && !errors.As(err, &se) {
				t.Fatalf("err is a %T, want a *LayerError or *ImageSizeError", err)
			}
			hostUntouched(t, tree)
		})
	}
}

func TestUnpackGiantFileStopsEarly(t *testing.T) {
	// A header that claims 1 TiB: refused before a byte is written.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40})
	tree, _, err := unpackLayers(t, 1<<20, b.Bytes())
	var se *ImageSizeError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "--max-size") {
		t.Fatalf("err = %v, want an ImageSizeError naming --max-size", err)
	}
	if _, err := os.Lstat(filepath.Join(tree, "huge")); err == nil {
		t.Fatal("the giant file was made")
	}
	// Many files: the count bound.
	var es []ent
	for i := 0; i < 1100; i++ {
		es = append(es, ent{name: "f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))})
	}
	_, _, err = unpackLayers(t, 1<<30, layerTar(t, es...))
	if !errors.As(err, &se) || se.What != "files" {
		t.Fatalf("err = %v, want a files bound", err)
	}
}

func TestUnpackContains(t *testing.T) {
	l1 := layerTar(t,
		ent{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "etc/passwd", body: "image passwd"},
		// Links out of the root, absolute and climbing.
		ent{name: "abs", typ: tar.TypeSymlink, link: "/"},
		ent{name: "etc/up", typ: tar.TypeSymlink, link: "../../../.."},
		ent{name: "etc/shadow-link", typ: tar.TypeSymlink, link: "../../../../etc/shadow"},
		// Set-id bits, devices and a FIFO.
		ent{name: "su", body: "#!/bin/sh", mode: 0o4755},
		ent{name: "sg", body: "x", mode: 0o2755},
		ent{name: "null", typ: tar.TypeChar, mode: 0o666},
		ent{name: "sda", typ: tar.TypeBlock, mode: 0o660},
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o644},
		ent{name: "hard", typ: tar.TypeLink, link: "etc/passwd"},
	)
	l2 := layerTar(t,
		// Writes through links made by the layer below land inside.
		ent{name: "abs/host-file", body: "through abs"},
		ent{name: "etc/up/host-file2", body: "through up"},
		// A whiteout through a link removes inside only.
		ent{name: "abs/etc/.wh.passwd"},
		// Hard link through a link: to the tree's own file.
		ent{name: "hard2", typ: tar.TypeLink, link: "abs/su"},
	)
	tree, u, err := unpackLayers(t, 1<<20, l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	hostUntouched(t, tree)
	for name, want := range map[string]string{"host-file": "through abs", "host-file2": "through up"} {
		b, err := os.ReadFile(filepath.Join(tree, name))
		if err != nil || string(b) != want {
			t.Errorf("%s in the tree = %q, %v; want %q", name, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(tree, "etc/passwd")); !os.IsNotExist(err) {
		t.Errorf("etc/passwd survived its whiteout: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(tree, "hard")); string(b) != "image passwd" {
		t.Errorf("hard link = %q", b)
	}
	for _, n := range []string{"null", "sda", "fifo"} {
		if _, err := os.Lstat(filepath.Join(tree, n)); !os.IsNotExist(err) {
			t.Errorf("%s was made: %v", n, err)
		}
	}
	for _, n := range []string{"su", "sg", "hard2"} {
		fi, err := os.Lstat(filepath.Join(tree, n))
		if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o555 {
			t.Errorf("%s: %v, %v; want 0555 without set-id bits", n, fi.Mode(), err)
		}
	}
	for name, want := range map[string]string{"abs": "/", "etc/up": "/", "etc/shadow-link": "/etc/shadow"} {
		if got, _ := os.Readlink(filepath.Join(tree, name)); got != want {
			t.Errorf("link %s = %q, want %q", name, got, want)
		}
	}
	got := strings.Join(u.neutralised(), "; ")
	for _, w := range []string{"2 set-user-id", "3 device node", "2 symbolic link"} {
		if !strings.Contains(got, w) {
			t.Errorf("neutralised = %q, want %q in it", got, w)
		}
	}
}

func TestUnpackWhiteouts(t *testing.T) {
	l1 := layerTar(t,
		ent{name: "a/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "a/old", body: "1"},
		ent{name: "a/sub/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "a/sub/deep", body: "1"},
		ent{name: "b/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "b/gone", body: "1"},
		ent{name: "b/kept", body: "1"},
		ent{name: "c", body: "file that becomes a directory"},
	)
	l2 := layerTar(t,
		ent{name: "a/new", body: "2"},
		ent{name: "a/sub/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "a/sub/fresh", body: "2"},
		ent{name: "a/.wh..wh..opq"},
		ent{name: "b/.wh.gone"},
		ent{name: "c/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "c/x", body: "2"},
		ent{name: ".wh.nothing-there"},
	)
	tree, _, err := unpackLayers(t, 1<<20, l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"a/new": true, "a/old": false, "a/sub/fresh": true, "a/sub/deep": false, "b/gone": false, "b/kept": true, "c/x": true} {
		_, err := os.Lstat(filepath.Join(tree, p))
		if (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", p, err == nil, want)
		}
	}
	id1, _, n1, err := (&unpacker{root: mustOpenPath(t, tree), dirs: map[string]int64{}}).seal(tree)
	if err != nil || n1 != 8 {
		t.Fatalf("seal: %v, %d entries", err, n1)
	}
	if fi, _ := os.Stat(filepath.Join(tree, "a")); fi.Mode().Perm() != 0o555 {
		t.Errorf("a is %v after seal, want 0555", fi.Mode())
	}
	// The same tree has the same id.
	tree2, _, _ := unpackLayers(t, 1<<20, l1, l2)
	id2, _, _, _ := (&unpacker{root: mustOpenPath(t, tree2), dirs: map[string]int64{}}).seal(tree2)
	if id1 != id2 || len(id1) != 64 {
		t.Errorf("ids %q and %q of the same tree", id1, id2)
	}
}

func mustOpenPath(t *testing.T, dir string) int {
	u, err := newUnpacker(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.close)
	return u.root
}
