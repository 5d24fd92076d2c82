package workspace

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"time"
)

// What internal/snapshot needs beyond files: every entry with its mode
// (directories and symlinks too), and putting symlinks, modes and times
// back. Every path is resolved inside the workspace's os.Root, like the
// rest of the package: a symlink is read or created, never followed out.

// WalkTree calls fn for every directory, regular file and symlink in the
// workspace (not the root itself), a directory before its contents, in
// name order. Symlinks are not followed; FIFOs, sockets and devices are
// passed over; an entry removed while walking is passed over.
func (w *Workspace) WalkTree(fn func(Entry) error) error {
	return fs.WalkDir(w.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return mapErr(p, err)
		}
		if p == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil // removed meanwhile
		}
		e := entryOf(p, fi)
		if e.Type == "other" {
			return nil
		}
		return fn(e)
	})
}

// Readlink returns the target of symlink p, without following it.
func (w *Workspace) Readlink(p string) (string, error) {
	rel, err := Clean(p)
	if err != nil {
		return "", err
	}
	t, err := w.root.Readlink(rel)
	return t, mapErr(p, err)
}

// Symlink creates a symlink at p pointing to target (which may lead
// anywhere: the workspace never follows it out), creating p's parents.
// An existing entry at p is an error.
func (w *Workspace) Symlink(target, p string) error {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return &PathError{p, errors.New("is the workspace itself")}
	}
	if err := w.mkdirAll(parentOf(rel)); err != nil {
		return err
	}
	if err := w.root.Symlink(target, rel); err != nil {
		return mapErr(p, err)
	}
	if w.opts.OwnerSet {
		if err := w.root.Lchown(rel, w.opts.UID, w.opts.GID); err != nil {
			return mapErr(p, err)
		}
	}
	return nil
}

// Chmod sets the permission bits of file or directory p (setuid and
// setgid bits are dropped: nothing restored may gain privileges). A
// symlink at p is refused rather than followed.
func (w *Workspace) Chmod(p string, mode fs.FileMode) error {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return mapErr(p, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return &PathError{p, errors.New("is a symlink")}
	}
	return mapErr(p, w.root.Chmod(rel, mode&(fs.ModePerm|fs.ModeSticky)))
}

// Chtimes sets the modification (and access) time of file or directory p.
// A symlink at p is refused rather than followed.
func (w *Workspace) Chtimes(p string, mtime time.Time) error {
	defer w.changed()
	rel, err := Clean(p)
	if err != nil {
		return err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return mapErr(p, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return &PathError{p, errors.New("is a symlink")}
	}
	return mapErr(p, w.root.Chtimes(rel, mtime, mtime))
}

func parentOf(rel string) string {
	for i := len(rel) - 1; i >= 0; i-- {
		if rel[i] == '/' {
			return rel[:i]
		}
	}
	return "."
}

// Bulk writes many files in a row (a snapshot's restore): the workspace's
// usage is measured once and then counted as files are written, where
// Write walks the whole workspace before each file (quadratic over
// thousands of files). The same caps apply; nothing else may write to the
// workspace meanwhile, or the count is wrong. Its other methods are the
// Workspace's.
type Bulk struct {
	*Workspace
	used int64
}

// Bulk starts a run of writes.
func (w *Workspace) Bulk() (*Bulk, error) {
	used, err := w.Usage()
	if err != nil {
		return nil, err
	}
	return &Bulk{Workspace: w, used: used}, nil
}

// Write is Workspace.Write, counting the usage.
func (b *Bulk) Write(p string, r io.Reader) (int64, error) {
	defer b.changed()
	rel, err := Clean(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, &PathError{p, errors.New("is the workspace itself")}
	}
	var old int64
	if fi, err := b.root.Lstat(rel); err == nil {
		if fi.IsDir() {
			return 0, &PathError{p, errors.New("is a directory")}
		}
		if fi.Mode().IsRegular() {
			old = fi.Size()
		}
	}
	dir := path.Dir(rel)
	made := b.firstMissing(dir)
	if err := b.mkdirAll(dir); err != nil {
		return 0, err
	}
	n, err := b.writeUsed(p, rel, dir, r, b.used)
	if err != nil {
		if made != "" {
			_ = b.root.RemoveAll(made)
		}
		return 0, err
	}
	b.used += n - old
	return n, nil
}
