package template

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// freeze copies a build's tree read-only and refuses what a template may
// not hold: set-id files, devices, FIFOs (sockets likewise); links are
// copied as links, never followed.
func TestFreeze(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "bin"), 0o777)
	os.WriteFile(filepath.Join(src, "mod.py"), []byte("X = 1\n"), 0o666)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\n"), 0o777)
	os.Symlink("/etc/shadow", filepath.Join(src, "bin", "python3"))
	dst := filepath.Join(t.TempDir(), "out")
	os.Mkdir(dst, 0o755)
	id, size, files, err := freeze(src, dst)
	t.Cleanup(func() { removeTree(dst) })
	if err != nil || len(id) != 64 || size != int64(len("X = 1\n")+len("#!/bin/sh\n")) || files != 5 {
		t.Fatalf("freeze: %q %d %d %v", id, size, files, err)
	}
	for p, want := range map[string]os.FileMode{"mod.py": 0o444, "bin/tool": 0o555, "bin": 0o555 | os.ModeDir, ".": 0o555 | os.ModeDir} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
		if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && st.Uid != 0 {
			t.Errorf("%s is owned by %d", p, st.Uid)
		}
	}
	if target, err := os.Readlink(filepath.Join(dst, "bin", "python3")); err != nil || target != "/etc/shadow" {
		t.Errorf("link: %q %v", target, err)
	}
	// The same tree gives the same id.
	dst2 := filepath.Join(t.TempDir(), "out")
	os.Mkdir(dst2, 0o755)
	t.Cleanup(func() { removeTree(dst2) })
	if id2, _, _, err := freeze(src, dst2); err != nil || id2 != id {
		t.Errorf("again: %s %v, want %s", id2, err, id)
	}

	for name, make := range map[string]func(p string) error{
		"setuid": func(p string) error {
			if err := os.WriteFile(p, nil, 0o755); err != nil {
				return err
			}
			return syscall.Chmod(p, 0o4755)
		},
		"setgid": func(p string) error {
			if err := os.WriteFile(p, nil, 0o755); err != nil {
				return err
			}
			return syscall.Chmod(p, 0o2755)
		},
		"fifo":   func(p string) error { return syscall.Mkfifo(p, 0o644) },
		"device": func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3) },
	} {
		bad := t.TempDir()
		if err := make(filepath.Join(bad, "x")); err != nil {
			t.Logf("%s: cannot make one here: %v", name, err)
			continue
		}
		out := filepath.Join(t.TempDir(), "out")
		os.Mkdir(out, 0o755)
		_, _, _, err := freeze(bad, out)
		removeTree(out)
		var ue *UnsafeFileError
		if !errors.As(err, &ue) || ue.Path != "x" {
			t.Errorf("%s: %v, want an UnsafeFileError", name, err)
		}
	}
}
