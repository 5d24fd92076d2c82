package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// Overlay workspaces: the children of a session's fork share one
// read-only copy of its files.
//
// A frozen directory (NewFrozenDir) is a tmpfs of the server's own,
// filled once with the parent's files and then remounted read-only. Each
// child's workspace is its own capped tmpfs as always, with an overlayfs
// mounted over it (QuotaDir.MountOverlay): the frozen directory is the
// lower layer, the upper and work directories are in the child's tmpfs
// (hidden under the overlay, at its root). So a child sees the parent's
// files without copying them; what it writes (a new file, a whole file it
// changes, copied up from the lower layer at its first write, a
// whiteout for each lower file it deletes) lands in its own tmpfs,
// charged to its memory cgroup and bounded by its caps (ENOSPC past them);
// its siblings and the parent never see it. The lower layer is read-only
// to everyone: nothing can change it under a child.
//
// Only as root, on a host tmpfs workspace: an overlay in the quota
// holder's user namespace (a workspace made without root) is not built,
// and such workspaces keep the copy (OverlayUnsupported says why).

// OverlayUnsupported says why a workspace of NewQuotaDir cannot be an
// overlay over a frozen directory here, or "".
func OverlayUnsupported() string {
	if r := hostQuotaUnsupported(); r != "" {
		return "workspaces are not host tmpfs mounts (" + r + ")"
	}
	if !overlayAvailable() {
		return "the kernel has no overlay filesystem (modprobe overlay)"
	}
	return ""
}

// overlayAvailable says whether the kernel knows overlayfs (loading its
// module if it must).
var overlayAvailable = sync.OnceValue(func() bool {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
})

// NewFrozenDir makes a tmpfs directory capped at disk bytes and files
// inodes, owned by this process, to be filled with a workspace's files and
// then frozen (QuotaDir.Freeze) as the lower layer of overlay workspaces.
// Its pages are charged to whoever writes them (the server). Remove
// unmounts it; overlays mounted over it keep it until they are unmounted.
func NewFrozenDir(disk int64, files int) (*QuotaDir, error) {
	if r := OverlayUnsupported(); r != "" {
		return nil, errors.New("frozen workspace copy: " + r)
	}
	l := Limits{Disk: disk, Files: files}.WithDefaults()
	dir, err := ownedTempDir(selfOwner, "frozen")
	if err != nil {
		return nil, fmt.Errorf("create a frozen workspace copy: %w", err)
	}
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", l.Disk, l.Files+1, HostID, HostID)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("mount a frozen workspace copy's tmpfs: %w", err)
	}
	return &QuotaDir{Path: dir, Disk: l.Disk, Files: l.Files, Enforced: true, overhead: 1}, nil
}

// Freeze remounts a directory of NewFrozenDir read-only: from then on no
// one (the server included) can change the files the overlays share.
func (q *QuotaDir) Freeze() error {
	if err := unix.Mount("", q.Path, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("freeze the workspace copy: %w", err)
	}
	return nil
}

// Overlay tells whether the workspace is an overlay (MountOverlay).
func (q *QuotaDir) Overlay() bool { return q.overlay }

// MountOverlay makes the workspace (empty, made by NewQuotaDir as root) an
// overlay whose lower layer is lower (a frozen directory): its files
// appear in the workspace, and whatever is written goes to the
// workspace's own tmpfs. It must be called before a jail attaches the
// workspace (a jail clones the mount on its path when it starts).
//
// Usage then counts the workspace's own tmpfs only: the files written
// or changed (a changed lower file whole: it is copied up at its first
// write), the directories copied up to hold them and a whiteout per
// deleted lower file; not the shared lower files.
func (q *QuotaDir) MountOverlay(lower string) error {
	if !q.Enforced || q.mount != nil || q.holderName != "" || q.overlay {
		return errors.New("an overlay workspace needs a fresh host tmpfs workspace (as root)")
	}
	upper, work := filepath.Join(q.Path, "upper"), filepath.Join(q.Path, "work")
	// The overlay's root takes the upper directory's owner and mode.
	if err := os.Mkdir(upper, 0o755); err != nil {
		return fmt.Errorf("overlay workspace: %w", err)
	}
	if err := os.Chown(upper, HostID, HostID); err != nil {
		return fmt.Errorf("overlay workspace: %w", err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return fmt.Errorf("overlay workspace: %w", err)
	}
	// Room for the layers' own inodes, so the user keeps Files.
	if err := unix.Mount("", q.Path, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("nr_inodes=%d", q.Files+overlayInodes)); err != nil {
		return fmt.Errorf("overlay workspace: make room for its directories: %w", err)
	}
	// redirect_dir=on: a lower directory can be renamed (its new name
	// points at it in an xattr that the sandbox, without CAP_SYS_ADMIN on
	// the host, cannot forge). No index, no metacopy: a copied-up file is
	// whole in the upper layer, nothing refers back to other mounts.
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on,index=off,metacopy=off", lower, upper, work)
	fd, err := unix.Open(q.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("overlay workspace: %w", err)
	}
	layers := os.NewFile(uintptr(fd), q.Path)
	if err := unix.Mount("overlay", q.Path, "overlay", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		layers.Close()
		return fmt.Errorf("mount the overlay workspace: %w", err)
	}
	q.overlay, q.layers = true, layers
	// The inodes the layers' own directories take (the tmpfs's root,
	// upper, work, work/work and what the overlay keeps there) are not
	// the user's files.
	var st unix.Statfs_t
	if err := unix.Statfs(q.Path, &st); err == nil {
		q.overhead = int64(st.Files - st.Ffree)
	}
	return nil
}

// OverlayUnwritten reports whether an overlay workspace (MountOverlay)
// holds nothing of its own: its upper layer is empty, no file, directory,
// whiteout or copy-up (a file opened for writing, a chmod, a touch of a
// shared file all copy it up), so what it shows is exactly its lower
// layer. A write that lands after it looked is not seen, as by any copy
// of a workspace in use.
func (q *QuotaDir) OverlayUnwritten() (bool, error) {
	if q.layers == nil {
		return false, errors.New("not an overlay workspace")
	}
	fd, err := unix.Openat(int(q.layers.Fd()), "upper", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("overlay workspace: its upper layer: %w", err)
	}
	upper := os.NewFile(uintptr(fd), "upper")
	defer upper.Close()
	names, err := upper.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("overlay workspace: its upper layer: %w", err)
	}
	return len(names) == 0, nil
}

// overlayInodes is the inodes an overlay workspace's own layers take
// (measured on 6.18: the root, upper, work, work/work, one the overlay
// keeps from its mount and one at its first whiteout).
const overlayInodes = 6

// unmountAll unmounts every mount stacked on dir (an overlay over a
// tmpfs: two), lazily.
func unmountAll(dir string) error {
	for range 8 {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return nil // no longer a mount point
			}
			return err
		}
	}
	return nil
}
