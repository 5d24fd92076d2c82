package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
	"time"
)

// TreeCopy is what CopyTree copied: a plain copy of a workspace's files,
// directories and symlinks at one moment (the lower layer a fork's
// children share), and how to tell whether the workspace still holds the
// same.
type TreeCopy struct {
	Files   int      // regular files
	Bytes   int64    // their bytes
	Skipped []string // entries not copied: FIFOs, sockets, devices
	seen    map[string]fileID
	racy    bool // an entry changed within racyWindow of the copy: never called unchanged
}

// CopyTree copies every directory, regular file and symlink of src into
// dst (an empty workspace), keeping modes and modification times; dst's
// Options give the owner. FIFOs, sockets and devices are skipped (listed
// in Skipped). Nothing of src is followed out of it, and nothing blocks
// on a FIFO. The copy is plain (no hashing): it is made in the turn of
// the session it copies.
func CopyTree(dst, src *Workspace) (*TreeCopy, error) {
	start := time.Now()
	c := &TreeCopy{seen: map[string]fileID{}}
	type dirTime struct {
		p     string
		mtime time.Time
	}
	var dirs []dirTime
	err := fs.WalkDir(src.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		fi, err := src.root.Lstat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		switch {
		case fi.IsDir():
			if p != "." {
				if err := dst.root.Mkdir(p, 0o700); err != nil {
					return err
				}
			}
			if err := dst.root.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSticky)); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{p, fi.ModTime()})
		case fi.Mode().IsRegular():
			n, err := copyFile(dst, src, p, fi)
			if err != nil {
				return err
			}
			c.Files++
			c.Bytes += n
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := src.root.Readlink(p)
			if err != nil {
				return err
			}
			if err := dst.root.Symlink(target, p); err != nil {
				return err
			}
		default:
			c.Skipped = append(c.Skipped, p)
			return nil
		}
		if err := dst.chown(p); err != nil {
			return err
		}
		c.seen[p] = idOf(fi)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("copy the workspace: %w", err)
	}
	// Directories last, deepest first: filling them changed their times.
	for _, d := range slices.Backward(dirs) {
		if err := dst.root.Chtimes(d.p, d.mtime, d.mtime); err != nil {
			return nil, fmt.Errorf("copy the workspace: %w", err)
		}
	}
	for _, id := range c.seen {
		if id.ino == 0 || time.Unix(0, max(id.mtime, id.ctime)).After(start.Add(-racyWindow)) {
			c.racy = true
			break
		}
	}
	return c, nil
}

// copyFile copies regular file p of src (fi: its Lstat) to dst.
func copyFile(dst, src *Workspace, p string, fi fs.FileInfo) (int64, error) {
	in, err := src.root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := dst.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	err = copyBlob(out, in)
	if err == nil {
		err = out.Chmod(fi.Mode() & fs.ModePerm)
	}
	if err == nil {
		err = setMtime(out, fi.ModTime().UnixNano())
	}
	var n int64
	if err == nil {
		var st fs.FileInfo
		if st, err = out.Stat(); err == nil {
			n = st.Size()
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// Unchanged tells whether w holds exactly what c copied from it: the
// same entries, each with the same inode, size, mode, modification and
// change times. A copy made while an entry was changing is never
// unchanged.
func (c *TreeCopy) Unchanged(w *Workspace) bool {
	if c.racy {
		return false
	}
	n, same := 0, true
	err := fs.WalkDir(w.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() && d.Type()&fs.ModeSymlink == 0 {
			return nil // skipped by the copy, and still not copied
		}
		fi, err := w.root.Lstat(p)
		if err != nil {
			return err
		}
		if id, ok := c.seen[p]; !ok || id != idOf(fi) {
			same = false
			return fs.SkipAll
		}
		n++
		return nil
	})
	return err == nil && same && n == len(c.seen)
}
