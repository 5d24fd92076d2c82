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
	start   time.Time // of the last copy or update
	racy    bool      // an entry changed within racyWindow of it: never called unchanged
}

// CopyTree copies every directory, regular file and symlink of src into
// dst (an empty workspace), keeping modes and modification times; dst's
// Options give the owner. FIFOs, sockets and devices are skipped (listed
// in Skipped). Nothing of src is followed out of it, and nothing blocks
// on a FIFO. The copy is plain (no hashing).
func CopyTree(dst, src *Workspace) (*TreeCopy, error) {
	c := &TreeCopy{seen: map[string]fileID{}}
	if _, err := c.Update(dst, src); err != nil {
		return nil, err
	}
	return c, nil
}

// Update makes dst (which c was copied into, and nothing else has
// changed) a copy of src as it is now, copying again only what changed
// in src since (or was changing as it was copied), and returns how many
// entries it copied or removed. It lets a copy made while src was still
// in use be brought up to date in a moment, once src is held still.
func (c *TreeCopy) Update(dst, src *Workspace) (int, error) {
	start := time.Now()
	type dirTime struct {
		p     string
		mtime time.Time
	}
	var dirs []dirTime
	seen := map[string]fileID{}
	changed, files, bytes := 0, 0, int64(0)
	var skipped []string
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
		id := idOf(fi)
		mode := fi.Mode()
		if !mode.IsDir() && !mode.IsRegular() && mode&fs.ModeSymlink == 0 {
			skipped = append(skipped, p)
			return nil
		}
		if mode.IsRegular() {
			files++
			bytes += fi.Size()
		}
		if mode.IsDir() {
			// Its time again at the end: copying into it changes it.
			dirs = append(dirs, dirTime{p, fi.ModTime()})
		}
		old, had := c.seen[p]
		if had && old == id && !c.racyEntry(old) {
			seen[p] = id // as copied
			return nil
		}
		changed++
		if had && (old.mode.Type() != mode.Type() || !mode.IsDir()) {
			if err := dst.root.RemoveAll(p); err != nil {
				return err
			}
		}
		switch {
		case mode.IsDir():
			if p != "." && !(had && old.mode.IsDir()) {
				if err := dst.root.Mkdir(p, 0o700); err != nil {
					return err
				}
			}
			if err := dst.root.Chmod(p, mode&(fs.ModePerm|fs.ModeSticky)); err != nil {
				return err
			}
		case mode.IsRegular():
			if _, err := copyFile(dst, src, p, fi); err != nil {
				return err
			}
		default:
			target, err := src.root.Readlink(p)
			if err != nil {
				return err
			}
			if err := dst.root.Symlink(target, p); err != nil {
				return err
			}
		}
		if err := dst.chown(p); err != nil {
			return err
		}
		seen[p] = id
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("copy the workspace: %w", err)
	}
	// What src no longer has, deepest first.
	var gone []string
	for p := range c.seen {
		if _, ok := seen[p]; !ok {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	for _, p := range slices.Backward(gone) {
		// (Under a directory replaced by a file: gone with it.)
		if err := dst.root.RemoveAll(p); err != nil && !errors.Is(err, syscall.ENOTDIR) {
			return 0, fmt.Errorf("copy the workspace: %w", err)
		}
		changed++
	}
	// Directories last, deepest first: filling them changed their times.
	for _, d := range slices.Backward(dirs) {
		if err := dst.root.Chtimes(d.p, d.mtime, d.mtime); err != nil {
			return 0, fmt.Errorf("copy the workspace: %w", err)
		}
	}
	c.seen, c.start, c.Files, c.Bytes, c.Skipped = seen, start, files, bytes, skipped
	c.racy = false
	for _, id := range seen {
		if c.racyEntry(id) {
			c.racy = true
			break
		}
	}
	return changed, nil
}

// racyEntry says whether the entry with id may have changed, unseen,
// just after the copy looked at it: it changed within racyWindow of the
// copy (timestamps come from a coarse clock), or has no identity.
func (c *TreeCopy) racyEntry(id fileID) bool {
	return id.ino == 0 || time.Unix(0, max(id.mtime, id.ctime)).After(c.start.Add(-racyWindow))
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
