package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Store keeps templates in a directory: trees/<id>/ (each tree once,
// whatever names share it) and names/<name>.json (a Manifest). Its
// methods are safe for concurrent use within one process; sessions in use
// are counted per process (a server's), so removal from another process
// is not refused while this one's sessions use a template.
type Store struct {
	dir string

	mu    sync.Mutex
	inUse map[string]int // by name
}

// Open opens (making it if needed) the store in dir.
func Open(dir string) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "trees"), filepath.Join(dir, "names"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("templates directory: %w", err)
		}
	}
	return &Store{dir: dir, inUse: map[string]int{}}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) manifestPath(name string) string {
	return filepath.Join(s.dir, "names", name+".json")
}

// Get returns the template called name, or ErrNotFound.
func (s *Store) Get(name string) (*Template, error) {
	if ValidName(name) != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	b, err := os.ReadFile(s.manifestPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	var t Template
	if err := json.Unmarshal(b, &t.Manifest); err != nil {
		return nil, fmt.Errorf("template %s: manifest: %w", name, err)
	}
	if len(t.ID) != 64 || strings.Trim(t.ID, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("template %s: manifest: bad id %q", name, t.ID)
	}
	t.Dir = filepath.Join(s.dir, "trees", t.ID)
	if _, err := os.Stat(t.Dir); err != nil {
		return nil, fmt.Errorf("template %s: its tree: %w", name, err)
	}
	return &t, nil
}

// List returns every template, by name.
func (s *Store) List() ([]*Template, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "names"))
	if err != nil {
		return nil, err
	}
	var out []*Template
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		t, err := s.Get(name)
		if err != nil {
			continue // being replaced or damaged: not listed
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Acquire marks the template in use by one session until release (called
// once) is called: Remove refuses it meanwhile.
func (s *Store) Acquire(name string) (*Template, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.Get(name)
	if err != nil {
		return nil, nil, err
	}
	s.inUse[name]++
	var once sync.Once
	return t, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.inUse[name]--; s.inUse[name] <= 0 {
				delete(s.inUse, name)
			}
		})
	}, nil
}

// InUse is how many sessions use the template.
func (s *Store) InUse(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse[name]
}

// Remove removes the template (and its tree, unless another name shares
// it). It is refused with an *InUseError while sessions use it.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.Get(name)
	if err != nil {
		return err
	}
	if n := s.inUse[name]; n > 0 {
		return &InUseError{Name: name, Sessions: n}
	}
	if err := os.Remove(s.manifestPath(name)); err != nil {
		return err
	}
	s.sweepLocked(t)
	return nil
}

func (s *Store) listLocked() []*Template {
	ts, _ := s.List()
	return ts
}

// install records m under its name, its tree (frozen, at tree) moved in
// unless the store has it already.
func (s *Store) install(m *Manifest, tree string) (*Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.inUse[m.Name]; n > 0 {
		removeTree(tree)
		return nil, &InUseError{Name: m.Name, Sessions: n}
	}
	final := filepath.Join(s.dir, "trees", m.ID)
	if _, err := os.Stat(final); err == nil {
		removeTree(tree)
	} else if err := os.Rename(tree, final); err != nil {
		removeTree(tree)
		return nil, err
	}
	old, _ := s.Get(m.Name)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	tmp := s.manifestPath(m.Name) + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, s.manifestPath(m.Name)); err != nil {
		return nil, err
	}
	if old != nil {
		s.sweepLocked(old)
	}
	return &Template{Manifest: *m, Dir: final}, nil
}

// removeTree removes a frozen tree (its directories are read-only).
func removeTree(dir string) error {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// UnsafeFileError is a file a template may not hold.
type UnsafeFileError struct {
	Path string
	Why  string
}

func (e *UnsafeFileError) Error() string {
	return fmt.Sprintf("template refused: %s is %s", e.Path, e.Why)
}

// freeze copies the tree at src (a build's, which nothing runs in any
// more) to dst, read-only (directories 0555, files 0444 or 0555),
// owned by root when run as root, and returns its digest, size and file
// count. Set-id files, devices, FIFOs and sockets are refused. Symbolic
// links are copied as links (never followed here; in a sandbox they
// resolve in its own root); hard links become separate files.
func freeze(src, dst string) (id string, size int64, files int, err error) {
	type entry struct{ rel, line string }
	var entries []entry
	var dirs []string
	root := os.Geteuid() == 0
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		if mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			return &UnsafeFileError{rel, "set-user-id or set-group-id"}
		}
		files++
		switch {
		case mode.IsDir():
			if err := os.Mkdir(out, 0o755); err != nil && rel != "." {
				return err
			}
			dirs = append(dirs, out)
			entries = append(entries, entry{rel, "d"})
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, out); err != nil {
				return err
			}
			entries = append(entries, entry{rel, "l " + target})
		case mode.IsRegular():
			perm := fs.FileMode(0o444)
			if mode&0o111 != 0 {
				perm = 0o555
			}
			sum, n, err := copyFile(p, out, perm)
			if err != nil {
				return err
			}
			if err := os.Chtimes(out, fi.ModTime(), fi.ModTime()); err != nil {
				return err
			}
			size += n
			entries = append(entries, entry{rel, fmt.Sprintf("f %o %s", perm, sum)})
		default:
			return &UnsafeFileError{rel, "a device, FIFO or socket"}
		}
		if root {
			return os.Lchown(out, 0, 0)
		}
		return nil
	})
	if err != nil {
		return "", 0, 0, err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i], 0o555); err != nil {
			return "", 0, 0, err
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%s\n", e.rel, e.line)
	}
	return hex.EncodeToString(h.Sum(nil)), size, files, nil
}

func copyFile(src, dst string, perm fs.FileMode) (string, int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|syscallNoFollow, 0)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	return writeHashed(in, dst, perm)
}

// writeHashed copies r to a new file dst, gives it perm once whole, and
// returns its sha256 and size.
func writeHashed(r io.Reader, dst string, perm fs.FileMode) (string, int64, error) {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, perm)
	}
	return hex.EncodeToString(h.Sum(nil)), n, err
}
