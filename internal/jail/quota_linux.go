package jail

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NewQuotaDir makes a fresh, empty workspace directory under the system's
// temporary directory, capped at disk bytes and files inodes (zero: the
// defaults of Limits.Disk and Limits.Files). As root the caps are enforced
// by a tmpfs mounted on it, owned by the sandbox user's host id; without
// root the directory is ordinary (Enforced is false). Remove unmounts and
// deletes it.
func NewQuotaDir(disk int64, files int) (*QuotaDir, error) {
	l := Limits{Disk: disk, Files: files}.WithDefaults()
	if err := l.validateQuota(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sandloop-ws-*")
	if err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	q := &QuotaDir{Path: dir, Disk: l.Disk, Files: l.Files}
	if reason := quotaUnsupported(); reason != "" {
		q.Reason = reason
		return q, nil
	}
	// nr_inodes counts the root directory too.
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", l.Disk, l.Files+1, HostID, HostID)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("mount the workspace's tmpfs: %w", err)
	}
	q.Enforced = true
	return q, nil
}

// quotaUnsupported says why workspaces cannot be quota mounts here, or "".
func quotaUnsupported() string {
	if os.Geteuid() != 0 {
		return "needs root (a tmpfs is mounted on each workspace); without it only uploads through the files API are capped"
	}
	if !effectiveCap(unix.CAP_SYS_ADMIN) {
		// Root in a container, which holds no CAP_SYS_ADMIN by default.
		return "needs CAP_SYS_ADMIN (a tmpfs is mounted on each workspace), which this container does not hold; only uploads through the files API are capped"
	}
	return ""
}

// effectiveCap says whether this process holds capability c.
func effectiveCap(c int) bool {
	for _, line := range strings.Split(readFileString("/proc/self/status"), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<uint(c)) != 0
		}
	}
	return false
}

// QuotaSupport says how workspaces are capped on this host, for doctor.
func QuotaSupport() Check {
	if r := quotaUnsupported(); r != "" {
		fix := "run sandloop as root"
		if os.Geteuid() == 0 {
			fix = "give the container CAP_SYS_ADMIN inside its user namespace (--cap-add=SYS_ADMIN with --userns=auto), or accept uncapped workspaces"
		}
		return Check{Fallback: true, Detail: r, Fix: fix}
	}
	return Check{OK: true, Detail: "a size- and inode-capped tmpfs per workspace (ENOSPC on every write past the cap)"}
}

// Usage reports what the workspace holds: from the tmpfs's counters when
// enforced (cheap), by walking the tree otherwise.
func (q *QuotaDir) Usage() (Usage, error) {
	if !q.Enforced {
		return walkUsage(q.Path)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(q.Path, &st); err != nil {
		return Usage{}, fmt.Errorf("workspace usage: %w", err)
	}
	return Usage{
		Bytes: int64(st.Blocks-st.Bfree) * st.Bsize,
		Files: max(int64(st.Files-st.Ffree)-1, 0),
	}, nil
}

// Remove unmounts the workspace (clones of the mount held by running
// jails keep its files until they end) and deletes the directory. It is
// idempotent.
func (q *QuotaDir) Remove() error {
	var err error
	q.removed.Do(func() {
		if q.Enforced {
			if e := unix.Unmount(q.Path, unix.MNT_DETACH); e != nil && !errors.Is(e, unix.EINVAL) && !errors.Is(e, unix.ENOENT) {
				err = fmt.Errorf("unmount workspace: %w", e)
				return
			}
		}
		err = removeDir(q.Path)
	})
	return err
}
