package jail

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Workspace quotas.
//
// A session's workspace is a fresh directory with a tmpfs mounted on it,
// capped in bytes (size=) and in inodes (nr_inodes=). The kernel enforces
// both on every write, whoever writes: the sandboxed code (cold jail,
// pooled kernel or zygote fork alike, since each binds or clones that same
// mount), a subprocess it starts, or the server's own uploads. A write
// past the cap fails with ENOSPC inside the sandbox; nothing is truncated
// silently and the host's disk is never touched. tmpfs was chosen over
// the alternatives because it keeps the workspace an ordinary directory
// of the host (the files API, archive and export, agent snapshots and
// --out go on using paths and os.Root) and needs no host setup: an ext4
// or xfs project quota needs a filesystem mounted with prjquota and root
// to set it; a loop-mounted image needs root, a loop device and a
// filesystem's fixed overhead per session. The price: the workspace is
// memory-backed, charged to the memory cgroup of whoever writes it (the
// session's own, for code in the sandbox), so Disk counts against the
// session's memory limit and the default Disk leaves room for Python
// beside it.
//
// Mounting on a host directory needs CAP_SYS_ADMIN in the host's mount
// namespace. Without it (not root) the same tmpfs, with the same caps, is
// made in a user namespace of a helper's and held by a descriptor
// (quota_userns_linux.go says how and why), or, on kernels that cannot
// clone a detached mount (before 6.15), mounted in the mount namespace of
// a holder process that also starts the workspace's jails
// (quota_holder_linux.go); either way the workspace's Path is a directory
// under /proc/self/fd/, valid in this process only. Only where neither can
// work (user namespaces forbidden; root without CAP_SYS_ADMIN, in a
// container) is the directory an ordinary one: the cap then applies only
// to uploads through the files API (QuotaDir.Enforced says which), and
// doctor says so.

// HolderForceEnv, set to 1, makes workspaces without root use the holder (quota_holder_linux.go)
// even where the kernel can clone a detached mount: for tests of the
// holder on newer kernels.
const HolderForceEnv = "SANDLOOP_TEST_QUOTA_HOLDER"

// QuotaDir is a workspace directory capped in bytes and files.
type QuotaDir struct {
	// Path is the workspace's directory: a host directory, or (made in a
	// user namespace) one under /proc/self/fd/, valid in this process
	// only. Start knows either.
	Path string
	// Disk and Files are the caps.
	Disk  int64
	Files int
	// Enforced reports that the kernel enforces the caps on every write
	// (a tmpfs is mounted on Path). If false, Reason says why not.
	Enforced bool
	Reason   string

	removed sync.Once
	// Made in a user namespace: the detached tmpfs, the directory in it
	// that is the workspace.
	mount *os.File
	sub   string
	// Made by the holder (quota_holder_linux.go): the workspace's tmpfs's
	// directory under the holder's base (mount is then the tmpfs's root).
	holderName string
	// overlay: an overlay is mounted over the tmpfs (MountOverlay).
	overlay bool
	// layers is the tmpfs's root under the overlay (O_PATH, opened before
	// it was mounted over), to look at the upper layer (OverlayUnwritten).
	layers *os.File
	// overhead is the inodes the workspace's own directories take (the
	// root; the directory in it): not the user's files.
	overhead int64
}

// Usage is what a workspace holds.
type Usage struct {
	Bytes int64 `json:"bytes"` // bytes of storage in use
	Files int64 `json:"files"` // files, directories and symlinks, the root not counted
}

// walkUsage counts a directory that is not a quota mount: the sizes of its
// regular files and the number of its entries.
func walkUsage(dir string) (Usage, error) {
	var u Usage
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if p == dir {
			return nil
		}
		u.Files++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				u.Bytes += fi.Size()
			}
		}
		return nil
	})
	return u, err
}

func removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
