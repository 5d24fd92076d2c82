package template

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// LayerError is a layer entry refused: what an image may not do.
type LayerError struct {
	Layer int // from 1
	Entry string
	Why   string
}

func (e *LayerError) Error() string {
	return fmt.Sprintf("image refused: layer %d, entry %q: %s", e.Layer, e.Entry, e.Why)
}

// unpacker applies an image's layers to a staging directory (the future
// template tree) and nothing else: every path is resolved with openat2
// and RESOLVE_IN_ROOT below the directory's descriptor, as if it were
// "/", so no symbolic link an earlier entry made, absolute or climbing
// with "..", leads a write, a removal or a hard link out of it.
//
// What an image may not bring is refused (an entry named with an
// absolute path or "..", a hard link to such a name, a whiteout of "."
// or "..", more bytes or files than the bounds) or neutralised and
// counted (set-user-id and set-group-id bits dropped; device nodes and
// FIFOs not made; a relative symbolic link that climbs above the root
// rewritten to the absolute path it means inside the sandbox, so the
// stored tree has no link that leads out of it from where it lies).
// Files end 0444 or 0555, directories 0555, all owned by the server's
// user; modification times are kept (Python's byte-code checks them).
type unpacker struct {
	root     int // O_PATH descriptor of the staging directory
	maxSize  int64
	maxFiles int
	size     int64
	files    int

	setid, devices, links int

	layer   int
	touched map[string]bool // this layer's entries, for an opaque whiteout
	dirs    map[string]int64
}

func newUnpacker(dir string, maxSize int64, maxFiles int) (*unpacker, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &unpacker{root: fd, maxSize: maxSize, maxFiles: maxFiles, dirs: map[string]int64{}}, nil
}

func (u *unpacker) close() { unix.Close(u.root) }

// neutralised says what the unpacker changed, for the manifest.
func (u *unpacker) neutralised() []string {
	var out []string
	if u.setid > 0 {
		out = append(out, fmt.Sprintf("%d set-user-id or set-group-id bit(s) dropped", u.setid))
	}
	if u.devices > 0 {
		out = append(out, fmt.Sprintf("%d device node(s) or FIFO(s) not made", u.devices))
	}
	if u.links > 0 {
		out = append(out, fmt.Sprintf("%d symbolic link(s) climbing above the root made absolute", u.links))
	}
	return out
}

// entryName cleans a layer entry's name: relative, without "..".
func entryName(raw string) (string, error) {
	if strings.ContainsRune(raw, 0) {
		return "", errors.New("a NUL in its name")
	}
	if strings.HasPrefix(raw, "/") {
		return "", errors.New("an absolute path")
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", errors.New(`".." in its path`)
		}
	}
	n := path.Clean(raw)
	if n == "." {
		return "", nil
	}
	return n, nil
}

func resolveFlags() uint64 {
	return unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
}

// openDir opens the directory dir (relative; "" is the root) inside the
// root, making the missing ones.
func (u *unpacker) openDir(dir string) (int, error) {
	if dir == "" || dir == "." {
		return unix.Openat2(u.root, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags()})
	}
	fd, err := unix.Openat2(u.root, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags()})
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	parent, err := u.openDir(path.Dir(dir))
	if err != nil {
		return -1, err
	}
	defer unix.Close(parent)
	if err := u.count(0); err != nil {
		return -1, err
	}
	if err := unix.Mkdirat(parent, path.Base(dir), 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return unix.Openat2(parent, path.Base(dir), &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveFlags()})
}

func (u *unpacker) count(bytes int64) error {
	u.files++
	if u.files > u.maxFiles {
		return &ImageSizeError{"files", int64(u.maxFiles)}
	}
	if u.size += bytes; u.size > u.maxSize {
		return &ImageSizeError{"bytes", u.maxSize}
	}
	return nil
}

// removeAt removes name in the directory parent, a subtree included,
// never following a link (unlinkat removes the link itself).
func removeAt(parent int, name string) error {
	err := unix.Unlinkat(parent, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Fchmod(fd, 0o755)
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
}

// apply applies one layer's tar stream (layer counts from 1).
func (u *unpacker) apply(r io.Reader, layer int) error {
	u.layer, u.touched = layer, map[string]bool{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &LayerError{layer, "", "not a tar stream: " + err.Error()}
		}
		if err := u.entry(tr, h); err != nil {
			var le *LayerError
			var se *ImageSizeError
			if errors.As(err, &le) || errors.As(err, &se) {
				return err
			}
			return &LayerError{layer, h.Name, err.Error()}
		}
	}
}

func (u *unpacker) refuse(h *tar.Header, why string) error {
	return &LayerError{u.layer, h.Name, why}
}

func (u *unpacker) entry(tr *tar.Reader, h *tar.Header) error {
	name, err := entryName(h.Name)
	if err != nil {
		return u.refuse(h, err.Error())
	}
	dir, base := path.Dir(name), path.Base(name)
	if name == "" {
		return nil // the root itself
	}
	if strings.HasPrefix(base, ".wh.") {
		return u.whiteout(h, dir, base)
	}
	parent, err := u.openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	u.touched[name] = true

	// What a lower layer left here goes, unless both are directories
	// (a directory entry then only restates it).
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if !(h.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR) {
			if err := removeAt(parent, base); err != nil {
				return err
			}
		}
	}
	mode := h.FileInfo().Mode()
	if mode&(os.ModeSetuid|os.ModeSetgid) != 0 {
		u.setid++
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := u.count(0); err != nil {
			return err
		}
		if err := unix.Mkdirat(parent, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
	case tar.TypeReg, tar.TypeRegA:
		if h.Size < 0 {
			return u.refuse(h, "a negative size")
		}
		if err := u.count(h.Size); err != nil {
			return err
		}
		fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		_, err = io.CopyN(f, tr, h.Size)
		perm := uint32(0o444)
		if mode&0o111 != 0 {
			perm = 0o555
		}
		if err == nil {
			err = f.Chmod(os.FileMode(perm))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := u.count(0); err != nil {
			return err
		}
		target := h.Linkname
		if target == "" || strings.ContainsRune(target, 0) || len(target) > 4095 {
			return u.refuse(h, "a symbolic link with an empty or invalid target")
		}
		if climbs(dir, target) {
			// Inside the sandbox ".." stops at "/": the same link, made
			// absolute, means the same there, and no longer leads out of
			// the tree from where it lies on the host.
			target = path.Join("/", dir, target)
			u.links++
		}
		if err := unix.Symlinkat(target, parent, base); err != nil {
			return err
		}
	case tar.TypeLink:
		old, err := entryName(h.Linkname)
		if err != nil || old == "" {
			why := "a hard link to the root"
			if err != nil {
				why = "a hard link to " + err.Error()
			}
			return u.refuse(h, why)
		}
		if err := u.count(0); err != nil {
			return err
		}
		oldParent, err := u.openDir(path.Dir(old))
		if err != nil {
			return u.refuse(h, "a hard link to a missing file: "+err.Error())
		}
		defer unix.Close(oldParent)
		var ost unix.Stat_t
		if err := unix.Fstatat(oldParent, path.Base(old), &ost, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return u.refuse(h, fmt.Sprintf("a hard link to %s, which the image does not have", old))
		}
		if ost.Mode&unix.S_IFMT == unix.S_IFDIR {
			return u.refuse(h, "a hard link to a directory")
		}
		// Both ends are in the tree: linkat without following names the
		// entry itself, never what a link there points to.
		if err := unix.Linkat(oldParent, path.Base(old), parent, base, 0); err != nil {
			return err
		}
		return nil // the times are the target's
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.devices++
		return nil
	default:
		return u.refuse(h, fmt.Sprintf("an entry of type %q, which an image template cannot hold", h.Typeflag))
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if h.Typeflag == tar.TypeDir {
		u.dirs[name] = h.ModTime.UnixNano()
	}
	return unix.UtimesNanoAt(parent, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// climbs reports a relative link target that, from dir, goes above the root.
func climbs(dir, target string) bool {
	if strings.HasPrefix(target, "/") {
		return false
	}
	depth := 0
	if dir != "." && dir != "" {
		depth = len(strings.Split(dir, "/"))
	}
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if depth--; depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

// whiteout applies a whiteout entry: ".wh.NAME" removes NAME of the
// layers below; ".wh..wh..opq" empties its directory of them. Both act
// inside the tree only.
func (u *unpacker) whiteout(h *tar.Header, dir, base string) error {
	parent, err := unix.Openat2(u.root, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags()})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if base == ".wh..wh..opq" {
		return u.opaque(parent, dir)
	}
	target := strings.TrimPrefix(base, ".wh.")
	if target == "" || target == "." || target == ".." || strings.HasPrefix(target, ".wh.") {
		return u.refuse(h, "a whiteout of "+strconvQuote(target)+", which is not a name in its directory")
	}
	return removeAt(parent, target)
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }

// opaque removes what the layers below left in dir (parent is its
// descriptor), keeping this layer's entries.
func (u *unpacker) opaque(parent int, dir string) error {
	fd, err := unix.Openat(parent, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if dir == "." {
			p = n
		}
		if u.touched[p] {
			var st unix.Stat_t
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				err = u.opaque(sub, p)
				unix.Close(sub)
				if err != nil {
					return err
				}
			}
			continue
		}
		if err := removeAt(fd, n); err != nil {
			return err
		}
	}
	return nil
}

// seal makes the tree's directories read-only (0555) with their times,
// deepest first (but the tree's own: without root, a directory that is
// not writable cannot be renamed into the store; BuildImage seals it once
// installed), and returns the tree's digest, size and entry count in
// the form freeze uses (paths, kinds, link targets, file modes and
// contents; no link followed, no file opened but regular ones).
func (u *unpacker) seal(dir string) (id string, size int64, files int, err error) {
	type entry struct{ rel, line string }
	var entries []entry
	var walk func(fd int, rel string) error
	walk = func(fd int, rel string) error {
		dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(dfd), rel)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			p := n
			if rel != "." {
				p = rel + "/" + n
			}
			var st unix.Stat_t
			if err := unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			files++
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				entries = append(entries, entry{p, "d"})
				sub, err := unix.Openat(dfd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				err = walk(sub, p)
				if err == nil {
					err = unix.Fchmodat(dfd, n, 0o555, 0)
				}
				if err == nil {
					if t, ok := u.dirs[p]; ok {
						ts := []unix.Timespec{unix.NsecToTimespec(t), unix.NsecToTimespec(t)}
						err = unix.UtimesNanoAt(dfd, n, ts, unix.AT_SYMLINK_NOFOLLOW)
					}
				}
				unix.Close(sub)
				if err != nil {
					return err
				}
			case unix.S_IFLNK:
				buf := make([]byte, 4096)
				k, err := unix.Readlinkat(dfd, n, buf)
				if err != nil {
					return err
				}
				entries = append(entries, entry{p, "l " + string(buf[:k])})
			case unix.S_IFREG:
				rfd, err := unix.Openat(dfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
				if err != nil {
					return err
				}
				rf := os.NewFile(uintptr(rfd), n)
				h := sha256.New()
				k, err := io.Copy(h, rf)
				rf.Close()
				if err != nil {
					return err
				}
				size += k
				entries = append(entries, entry{p, fmt.Sprintf("f %o %s", st.Mode&0o777, hex.EncodeToString(h.Sum(nil)))})
			default:
				return fmt.Errorf("template tree: %s is neither a file, a directory nor a link", p)
			}
		}
		return nil
	}
	if err := walk(u.root, "."); err != nil {
		return "", 0, 0, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })
	h := sha256.New()
	fmt.Fprintf(h, "image\n")
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%s\n", e.rel, e.line)
	}
	return hex.EncodeToString(h.Sum(nil)), size, files, nil
}
