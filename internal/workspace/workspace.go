// Package workspace gives the server safe access to a sandbox's files: every
// path is resolved inside the workspace (os.Root), so a symlink or ".."
// planted by sandboxed code never leads out of it, and nothing blocks on a
// FIFO or a device. A [CheckpointStore] keeps deduplicated copies of a
// workspace's files outside it and puts them back (session checkpoints).
package workspace

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Errors callers may branch on.
var (
	ErrNotFound = errors.New("no such file or directory")
	ErrTooLarge = errors.New("too large")
	// ErrNotRegular: the path is a directory, FIFO, socket or device.
	ErrNotRegular = errors.New("not a regular file")
)

// PathError reports a path that cannot be used, and why.
type PathError struct {
	Path string
	Err  error
}

func (e *PathError) Error() string { return fmt.Sprintf("path %q: %v", e.Path, e.Err) }
func (e *PathError) Unwrap() error { return e.Err }

// ArgumentError reports a bad argument other than a path (the shape every
// package's bad-input error has: what is wrong, and why).
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// LimitError reports a size cap that a write would exceed.
type LimitError struct {
	What  string // "file", "workspace", or "quota" (the file system said it is full)
	Limit int64
}

func (e *LimitError) Error() string {
	if e.What == "quota" {
		return "the workspace is full (its quota of bytes or of files is reached): nothing was stored"
	}
	return fmt.Sprintf("the %s size limit of %d bytes would be exceeded", e.What, e.Limit)
}
func (e *LimitError) Unwrap() error { return ErrTooLarge }

// Options bound what may be written. Zero values mean the defaults.
type Options struct {
	// MaxFileBytes caps one file written through the workspace. If zero, 100 MiB.
	MaxFileBytes int64
	// MaxTotalBytes caps the workspace's total size after a write. If zero, 1 GiB.
	MaxTotalBytes int64
	// UID and GID, when OwnerSet, own the files and directories written,
	// so that the sandbox user can change them.
	OwnerSet bool
	UID, GID int
	// CreateAsOwner, with OwnerSet, creates files and directories as UID
	// and GID (the thread's filesystem ids), not only chowns them after:
	// for a filesystem mounted in a sandbox's user namespace (its /tmp),
	// where the server's own ids are not mapped and creating fails
	// (EOVERFLOW); renames too. It also does so with the sandbox user's
	// rights.
	CreateAsOwner bool
	// Usage, if set, reports the bytes the workspace holds (for
	// MaxTotalBytes) instead of a walk of its files: for an overlay
	// workspace, whose shared lower files are not its own.
	Usage func() (int64, error)
	// Changed, if set, is called after each call that may have changed
	// the workspace (a write, mkdir, remove, rename, symlink, chmod or
	// chtimes; failed ones too: one may have changed part), once it
	// returns: a session's automatic snapshots learn of changes made
	// through a handle opened before they started.
	Changed func()
}

// Workspace is one directory, accessed without ever leaving it.
type Workspace struct {
	root *os.Root
	opts Options
}

// Open opens dir.
func Open(dir string, o *Options) (*Workspace, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = 100 << 20
	}
	if opts.MaxTotalBytes == 0 {
		opts.MaxTotalBytes = 1 << 30
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &Workspace{root: r, opts: opts}, nil
}

// Close releases the workspace's directory handle.
func (w *Workspace) Close() error { return w.root.Close() }

// changed calls Options.Changed (deferred by each call that may change
// the workspace).
func (w *Workspace) changed() {
	if w.opts.Changed != nil {
		w.opts.Changed()
	}
}

// Clean validates a client-supplied path and returns it relative to the
// workspace root ("." for the root). Leading slashes are allowed ("/a" is
// "a"); "..", NUL bytes and empty components are not.
func Clean(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", &PathError{p, errors.New("contains a NUL byte")}
	}
	rel := strings.TrimLeft(p, "/")
	if rel == "" || rel == "." {
		return ".", nil
	}
	for _, part := range strings.Split(rel, "/") {
		if part == ".." {
			return "", &PathError{p, errors.New(`".." is not allowed`)}
		}
	}
	c := path.Clean(rel)
	if c == "." || strings.HasPrefix(c, "../") {
		return ".", nil
	}
	return c, nil
}

// mapErr turns os errors into the package's.
func mapErr(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return &PathError{p, ErrNotFound}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &PathError{p, &LimitError{What: "quota"}}
	case strings.Contains(err.Error(), "path escapes"):
		return &PathError{p, errors.New("leads outside the workspace (symlink or ..)")}
	}
	return &PathError{p, err}
}

// Entry describes one file or directory.
type Entry struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	// FileMode is the full mode, for callers that need more than Mode's text.
	FileMode fs.FileMode `json:"-"`
}

func entryOf(p string, fi fs.FileInfo) Entry {
	return Entry{Path: p, Name: path.Base(p), Type: TypeOf(fi.Mode()), Size: fi.Size(), Mode: fi.Mode().String(), ModTime: fi.ModTime().UTC(), FileMode: fi.Mode()}
}

// TypeOf is an Entry's Type for mode: file, dir, symlink or other.
func TypeOf(mode fs.FileMode) string {
	switch {
	case mode.IsRegular():
		return "file"
	case mode.IsDir():
		return "dir"
	case mode&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

// List returns the entries of directory p, sorted by name.
func (w *Workspace) List(p string) ([]Entry, error) {
	rel, err := Clean(p)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Stat(rel)
	if err != nil {
		return nil, mapErr(p, err)
	}
	if !fi.IsDir() {
		return []Entry{entryOf(rel, fi)}, nil
	}
	des, err := fs.ReadDir(w.root.FS(), rel)
	if err != nil {
		return nil, mapErr(p, err)
	}
	out := make([]Entry, 0, len(des))
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, entryOf(path.Join(rel, de.Name()), info))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Stat describes p without following a final symlink.
func (w *Workspace) Stat(p string) (Entry, error) {
	rel, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return Entry{}, mapErr(p, err)
	}
	return entryOf(rel, fi), nil
}

// Open opens regular file p for reading. It never blocks on a FIFO and
// never opens a device.
func (w *Workspace) Open(p string) (*os.File, Entry, error) {
	rel, err := Clean(p)
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Entry{}, mapErr(p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Entry{}, mapErr(p, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, Entry{}, &PathError{p, ErrNotRegular}
	}
	return f, entryOf(rel, fi), nil
}

// ReadFile reads regular file p, failing if it is larger than max bytes.
func (w *Workspace) ReadFile(p string, max int64) ([]byte, error) {
	f, e, err := w.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if e.Size > max {
		return nil, &PathError{p, &LimitError{"file", max}}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, mapErr(p, err)
	}
	if int64(len(b)) > max {
		return nil, &PathError{p, &LimitError{"file", max}}
	}
	return b, nil
}

// Write creates or replaces file p with r's bytes, creating parent
// directories. The new content appears atomically; on any error (a size
// cap included) the old file is left as it was.
func (w *Workspace) Write(p string, r io.Reader) (int64, error) {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, &PathError{p, errors.New("is the workspace itself")}
	}
	if fi, err := w.root.Lstat(rel); err == nil && fi.IsDir() {
		return 0, &PathError{p, errors.New("is a directory")}
	}
	dir := path.Dir(rel)
	made := w.firstMissing(dir)
	n, err := w.write(p, rel, dir, r)
	if err != nil && made != "" {
		_ = w.root.RemoveAll(made) // store nothing: not even the parents
	}
	return n, err
}

// firstMissing returns the outermost directory of dir's path that does
// not exist yet, or "".
func (w *Workspace) firstMissing(dir string) string {
	missing := ""
	for d := dir; d != "." && d != "/"; d = path.Dir(d) {
		if _, err := w.root.Lstat(d); err == nil {
			break
		}
		missing = d
	}
	return missing
}

func (w *Workspace) write(p, rel, dir string, r io.Reader) (int64, error) {
	if err := w.mkdirAll(dir); err != nil {
		return 0, err
	}
	used, err := w.Usage()
	if err != nil {
		return 0, err
	}
	return w.writeUsed(p, rel, dir, r, used)
}

// writeUsed writes with used the workspace's usage now (Bulk counts it
// instead of walking the workspace before each file).
func (w *Workspace) writeUsed(p, rel, dir string, r io.Reader, used int64) (int64, error) {
	if old, err := w.root.Lstat(rel); err == nil && old.Mode().IsRegular() {
		used -= old.Size()
	}
	limit := w.opts.MaxFileBytes
	what := "file"
	if room := w.opts.MaxTotalBytes - used; room < limit {
		limit, what = max(room, 0), "workspace"
	}
	tmp := path.Join(dir, ".sandloop-upload-"+rand.Text())
	var f *os.File
	err := w.creating(func() (err error) {
		f, err = w.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		return err
	})
	if err != nil {
		return 0, mapErr(p, err)
	}
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > limit {
		cap := w.opts.MaxFileBytes
		if what == "workspace" {
			cap = w.opts.MaxTotalBytes
		}
		err = &PathError{p, &LimitError{what, cap}}
	}
	if err == nil {
		err = w.chown(tmp)
	}
	if err == nil {
		err = w.creating(func() error { return w.root.Rename(tmp, rel) })
	}
	if err != nil {
		_ = w.root.Remove(tmp)
		var pe *PathError
		if errors.As(err, &pe) {
			return 0, err
		}
		return 0, mapErr(p, err)
	}
	return n, nil
}

func (w *Workspace) mkdirAll(dir string) error {
	if dir == "." {
		return nil
	}
	if err := w.creating(func() error { return w.root.MkdirAll(dir, 0o755) }); err != nil {
		return mapErr(dir, err)
	}
	// Give each new component to the sandbox user.
	for d := dir; d != "." && d != "/"; d = path.Dir(d) {
		if err := w.chown(d); err != nil {
			return err
		}
	}
	return nil
}

// creating runs fn, which creates a file or directory, as the owner
// where Options.CreateAsOwner says so.
func (w *Workspace) creating(fn func() error) error {
	if !w.opts.OwnerSet || !w.opts.CreateAsOwner {
		return fn()
	}
	return asIDs(w.opts.UID, w.opts.GID, fn)
}

func (w *Workspace) chown(p string) error {
	if !w.opts.OwnerSet {
		return nil
	}
	if err := w.root.Lchown(p, w.opts.UID, w.opts.GID); err != nil {
		return mapErr(p, err)
	}
	return nil
}

// Mkdir creates directory p and its parents.
func (w *Workspace) Mkdir(p string) error {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	return w.mkdirAll(rel)
}

// ErrRoot: the path names the workspace root where a file or subdirectory
// is required.
var ErrRoot = errors.New(`names the workspace root, not a file or directory in it (to empty the workspace, delete its entries one by one)`)

// Remove deletes file or directory p (recursively). The root itself is
// refused ("", "/", ".", "a/.."): a path that cleans to nothing is far more
// often a client's bug than a wish to delete everything; Clear does that.
func (w *Workspace) Remove(p string) error {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return &PathError{p, ErrRoot}
	}
	if _, err := w.root.Lstat(rel); err != nil {
		return mapErr(p, err)
	}
	return mapErr(p, w.root.RemoveAll(rel))
}

// Clear deletes everything in the workspace, keeping the root.
func (w *Workspace) Clear() error {
	defer w.changed()
	des, err := fs.ReadDir(w.root.FS(), ".")
	if err != nil {
		return mapErr(".", err)
	}
	for _, de := range des {
		if err := w.root.RemoveAll(de.Name()); err != nil {
			return mapErr(de.Name(), err)
		}
	}
	return nil
}

// Usage is the total size of the regular files in the workspace (or
// what Options.Usage says).
func (w *Workspace) Usage() (int64, error) {
	if w.opts.Usage != nil {
		return w.opts.Usage()
	}
	var total int64
	err := fs.WalkDir(w.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}

// Walk calls fn for every regular file under directory p, in name order,
// descending into the directories that skipDir (if set) does not reject.
// Symlinks are not followed. A directory removed while walking is passed
// over; fn returning fs.SkipAll ends the walk without an error.
func (w *Workspace) Walk(p string, skipDir func(Entry) bool, fn func(Entry) error) error {
	err := w.walk(p, skipDir, fn)
	if errors.Is(err, fs.SkipAll) {
		return nil
	}
	return err
}

func (w *Workspace) walk(p string, skipDir func(Entry) bool, fn func(Entry) error) error {
	list, err := w.List(p)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	for _, e := range list {
		switch e.Type {
		case "dir":
			if skipDir != nil && skipDir(e) {
				continue
			}
			if err := w.walk(e.Path, skipDir, fn); err != nil {
				return err
			}
		case "file":
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// Rename moves file or directory src to dst, creating dst's parent
// directories; a file at dst is replaced.
func (w *Workspace) Rename(src, dst string) error {
	defer w.changed()
	rs, err := Clean(src)
	if err != nil {
		return err
	}
	rd, err := Clean(dst)
	if err != nil {
		return err
	}
	for _, p := range [][2]string{{src, rs}, {dst, rd}} {
		if p[1] == "." {
			return &PathError{p[0], errors.New("is the workspace itself")}
		}
	}
	if _, err := w.root.Lstat(rs); err != nil {
		return mapErr(src, err)
	}
	if err := w.mkdirAll(path.Dir(rd)); err != nil {
		return err
	}
	return mapErr(dst, w.creating(func() error { return w.root.Rename(rs, rd) }))
}
