package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// readerOrNil keeps a nil *os.File from becoming a non-nil io.Reader.
func readerOrNil(f *os.File) io.Reader {
	if f == nil {
		return nil
	}
	return f
}

// copyInto copies the file or directory p into the workspace ws at the
// same relative path (data/sales.csv stays data/sales.csv). A path that
// leaves the current directory (absolute, or with ..) lands under its base
// name.
func copyInto(p, ws string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	rel := filepath.Clean(p)
	if !filepath.IsLocal(rel) {
		rel = filepath.Base(rel)
	}
	target := filepath.Join(ws, rel)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return errors.New("not a regular file or directory")
		}
		return copyFile(p, target)
	}
	return copyTree(p, target)
}

// Limits on what run copies of the script's directory by itself.
const (
	maxModuleFiles = 1000
	maxModuleBytes = 32 << 20
)

// copyModules copies what `import` finds next to a script — its
// directory's .py files and packages (directories with __init__.py) — into
// ws, within maxModuleFiles and maxModuleBytes. It returns a note when it
// stopped at a limit.
func copyModules(dir, ws string) string {
	des, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	files, bytes := 0, int64(0)
	over := false
	add := func(src, rel string) bool {
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			return true
		}
		if files+1 > maxModuleFiles || bytes+fi.Size() > maxModuleBytes {
			over = true
			return false
		}
		files, bytes = files+1, bytes+fi.Size()
		target := filepath.Join(ws, rel)
		if os.MkdirAll(filepath.Dir(target), 0o755) == nil {
			_ = copyFile(src, target)
		}
		return true
	}
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") || name == "__pycache__" {
			continue
		}
		src := filepath.Join(dir, name)
		switch {
		case de.Type().IsRegular() && strings.HasSuffix(name, ".py"):
			add(src, name)
		case de.IsDir():
			if _, err := os.Lstat(filepath.Join(src, "__init__.py")); err != nil {
				continue
			}
			_ = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return nil
				}
				if d.IsDir() && p != src && (strings.HasPrefix(d.Name(), ".") || d.Name() == "__pycache__") {
					return fs.SkipDir
				}
				rel, _ := filepath.Rel(dir, p)
				if !d.IsDir() && !add(p, rel) {
					return fs.SkipAll
				}
				return nil
			})
		}
		if over {
			return fmt.Sprintf("the script's directory has more Python modules than run copies by itself (%d files, %s): the rest were left out; give what the script needs with --with", maxModuleFiles, formatSize(maxModuleBytes))
		}
	}
	return ""
}

// caches are what programs leave behind that --out leaves out unless
// --keep-caches.
var caches = []string{".cache", ".config", ".local", "__pycache__", ".ipython", ".matplotlib", ".pytest_cache"}

// copyOut copies the workspace to --out, first checking that it overwrites
// nothing (unless --force): files that exist with other content are listed
// and nothing is copied.
func (s *scriptRun) copyOut(ws string, stderr io.Writer) error {
	skip := func(d fs.DirEntry) bool { return !s.keepCaches && slices.Contains(caches, d.Name()) }
	var clash []string
	if !s.force {
		err := filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if skip(d) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, _ := filepath.Rel(ws, p)
			if same, exists := sameFile(p, filepath.Join(s.out, rel)); exists && !same {
				clash = append(clash, rel)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("copy workspace to %s: %w", s.out, err)
		}
	}
	if len(clash) > 0 {
		list := strings.Join(clash[:min(len(clash), 5)], ", ")
		if len(clash) > 5 {
			list += fmt.Sprintf(" and %d more", len(clash)-5)
		}
		return usagef("--out %s: the run would overwrite %d existing file(s) (%s); nothing was copied: pass --force to overwrite, or choose another directory", s.out, len(clash), list)
	}
	if err := copyTreeSkip(ws, s.out, skip); err != nil {
		return fmt.Errorf("copy workspace to %s: %w", s.out, err)
	}
	return nil
}

// sameFile reports whether dst exists and holds what src holds.
func sameFile(src, dst string) (same, exists bool) {
	di, err := os.Lstat(dst)
	if err != nil {
		return false, false
	}
	si, err := os.Lstat(src)
	if err != nil || !di.Mode().IsRegular() || di.Size() != si.Size() || si.Size() > 64<<20 {
		return false, true
	}
	a, err1 := os.ReadFile(src)
	b, err2 := os.ReadFile(dst)
	return err1 == nil && err2 == nil && bytes.Equal(a, b), true
}
