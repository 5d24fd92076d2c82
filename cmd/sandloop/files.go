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
	"time"
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
func (s *scriptRun) copyOut(ws string, _ io.Writer) error {
	clash, err := copyWorkspace(ws, s.out, s.force, s.keepCaches)
	if len(clash) > 0 {
		return usagef("--out %s: the run would overwrite %s; nothing was copied: pass --force to overwrite, or choose another directory", s.out, clashList(clash))
	}
	return err
}

// cacheSkip leaves out the caches (unless keep).
func cacheSkip(keep bool) func(fs.DirEntry) bool {
	return func(d fs.DirEntry) bool { return !keep && slices.Contains(caches, d.Name()) }
}

// copyWorkspace copies the workspace ws to out, caches left out unless
// keepCaches. Unless force, it first lists the files it would overwrite
// (that exist in out with other content): if there are any, it copies
// nothing and returns them.
func copyWorkspace(ws, out string, force, keepCaches bool) (clash []string, err error) {
	skip := cacheSkip(keepCaches)
	if !force {
		err := walkFiles(ws, skip, func(rel string, _ fs.FileInfo) {
			if same, exists := sameFile(filepath.Join(ws, rel), filepath.Join(out, rel)); exists && !same {
				clash = append(clash, rel)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("copy workspace to %s: %w", out, err)
		}
	}
	if len(clash) > 0 {
		return clash, nil
	}
	if err := copyTreeSkip(ws, out, skip); err != nil {
		return nil, fmt.Errorf("copy workspace to %s: %w", out, err)
	}
	return nil, nil
}

// clashList is "3 existing file(s) (a, b, c)", at most five named.
func clashList(files []string) string { return kindList(files, "existing ") }

// fileList is "3 file(s) (a, b, c)", at most five named.
func fileList(files []string) string { return kindList(files, "") }

// kindList is "3 KINDfile(s) (a, b, c)", at most five named.
func kindList(files []string, kind string) string {
	list := strings.Join(files[:min(len(files), 5)], ", ")
	if len(files) > 5 {
		list += fmt.Sprintf(" and %d more", len(files)-5)
	}
	return fmt.Sprintf("%d %sfile(s) (%s)", len(files), kind, list)
}

// fileStamp is what tells a file changed: its size and time of change.
type fileStamp struct {
	size int64
	mod  time.Time
}

// stampFiles stamps each regular file under root but the caches, by its
// path relative to root.
func stampFiles(root string) (map[string]fileStamp, error) {
	out := map[string]fileStamp{}
	err := walkFiles(root, cacheSkip(false), func(rel string, fi fs.FileInfo) {
		out[rel] = fileStamp{fi.Size(), fi.ModTime()}
	})
	return out, err
}

// madeFiles are the files under root, caches left out, that are not in
// before or changed since, sorted. A workspace it cannot read (the
// sandbox's last state) makes none.
func madeFiles(root string, before map[string]fileStamp) []string {
	now, err := stampFiles(root)
	if err != nil {
		return nil
	}
	var made []string
	for rel, st := range now {
		if was, ok := before[rel]; !ok || was.size != st.size || !was.mod.Equal(st.mod) {
			made = append(made, rel)
		}
	}
	slices.Sort(made)
	return made
}

// walkFiles calls fn with each regular file under root (its path relative
// to root), leaving out what skip names.
func walkFiles(root string, skip func(fs.DirEntry) bool, fn func(rel string, fi fs.FileInfo)) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && skip(d) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fn(rel, fi)
		return nil
	})
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
