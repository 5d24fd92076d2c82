package jail

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NewQuotaDir makes a fresh, empty workspace directory under the system's
// temporary directory, capped at disk bytes and files inodes (zero: the
// defaults of Limits.Disk and Limits.Files). As root the caps are enforced
// by a tmpfs mounted on it, owned by the sandbox user's host id; without
// root the directory is ordinary (Enforced is false). Remove unmounts and
// deletes it.
func NewQuotaDir(disk int64, files int) (*QuotaDir, error) {
	return newQuotaDir(disk, files, selfOwner, "")
}

// NewQuotaDirFor is NewQuotaDir for a workspace that outlives this
// process: its name gives the process pid (a keeper's) as its owner, so
// another sandloop sweeps it only once that process is gone. It must be a
// host directory (root; or, where no tmpfs can be made, an ordinary one):
// a workspace held by a descriptor or a holder of ours could not outlive
// us.
func NewQuotaDirFor(disk int64, files int, pid int) (*QuotaDir, error) {
	owner := procOwner(pid)
	if owner == "" {
		return nil, fmt.Errorf("create workspace: process %d is gone", pid)
	}
	if hostQuotaUnsupported() != "" && rootlessQuota() != "" {
		return nil, errors.New("create workspace: a workspace that outlives the server must be a host directory, which needs root")
	}
	return newQuotaDir(disk, files, owner, "")
}

// NewLastingQuotaDir is a workspace whose files a later server may take
// when its owner dies: a durable session's (one a server keeps records
// of, for the next server), on the host (root), named after process pid
// (0: this process; else a keeper's, as NewQuotaDirFor). Once its owner
// is gone, any sandloop's sweep removes it at once if it is empty, but
// otherwise only LeftoverGrace after the first sweep that saw it left:
// the next server takes its files first (Leftover, RemoveLeftover).
// Where workspaces cannot be host directories (not root) it is
// NewQuotaDir's (pid 0) or fails as NewQuotaDirFor does.
func NewLastingQuotaDir(disk int64, files int, pid int) (*QuotaDir, error) {
	if pid == 0 {
		if hostQuotaUnsupported() != "" {
			return NewQuotaDir(disk, files)
		}
		return newQuotaDir(disk, files, selfOwner, lastingKind)
	}
	owner := procOwner(pid)
	if owner == "" {
		return nil, fmt.Errorf("create workspace: process %d is gone", pid)
	}
	if hostQuotaUnsupported() != "" && rootlessQuota() != "" {
		return nil, errors.New("create workspace: a workspace that outlives the server must be a host directory, which needs root")
	}
	return newQuotaDir(disk, files, owner, lastingKind)
}

// LeftoverGrace is how long a sweep spares a lasting workspace
// (NewLastingQuotaDir) that holds files after its owner's death was first
// seen: long enough for a restarted server to take them.
const LeftoverGrace = 15 * time.Minute

const (
	lastingKind = "lasting"
	// goneMarker prefixes the file beside a left lasting workspace that
	// says since when a sweep has seen it left (its mtime).
	goneMarker = "sandloop-gone-"
)

// Leftover says whether path is a lasting workspace (NewLastingQuotaDir)
// that no running process holds for its session: its owner is gone (a
// server's or a keeper's death left it), or its owner is process keeper
// (not 0), a keeper whose jail for the session has ended while no server
// held it (the caller knows). A server restarting on its records may
// take its files (then RemoveLeftover).
func Leftover(path string, keeper int) bool {
	owner, kind, ok := workspaceName(filepath.Base(path))
	if !ok || kind != lastingKind {
		return false
	}
	if ownerRuns(owner) && (keeper == 0 || owner != procOwner(keeper)) {
		return false
	}
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// RemoveLeftover unmounts and removes the left workspace at path (see
// Leftover) and what a sweep noted of it.
func RemoveLeftover(path string, keeper int) error {
	if !Leftover(path, keeper) {
		return fmt.Errorf("%s is no left workspace", path)
	}
	if err := unmountAll(path); err != nil {
		return fmt.Errorf("unmount workspace: %w", err)
	}
	if err := removeDir(path); err != nil {
		return err
	}
	os.Remove(filepath.Join(filepath.Dir(path), goneMarker+filepath.Base(path)))
	return nil
}

// LeftWorkspaces counts the lasting workspaces under the temporary
// directory whose owner's death left them holding files (Leftover): they
// wait for a restarted server to take their files, or LeftoverGrace. bytes
// is what those on tmpfs hold.
func LeftWorkspaces() (n int, bytes int64) {
	return leftWorkspaces(os.TempDir())
}

func leftWorkspaces(dir string) (n int, bytes int64) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || !Leftover(p, 0) || emptyDir(p) {
			continue
		}
		n++
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.TMPFS_MAGIC {
			bytes += int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
	return n, bytes
}

// workspaceName parses the name of a workspace ownedTempDir made: its
// owner and, for a named kind, the kind.
func workspaceName(name string) (owner, kind string, ok bool) {
	rest, ok := strings.CutPrefix(name, "sandloop-ws-")
	if !ok {
		return "", "", false
	}
	owner, rest, ok = strings.Cut(rest, "-")
	pidStr, _, ok2 := strings.Cut(owner, ".")
	if pid, err := strconv.Atoi(pidStr); !ok || !ok2 || err != nil || pid <= 0 {
		return "", "", false
	}
	if k, _, found := strings.Cut(rest, "-"); found {
		kind = k
	}
	return owner, kind, true
}

// ownerRuns says whether the process a workspace's name gives as its
// owner (PID and start time) still runs (a zombie does not).
func ownerRuns(owner string) bool {
	pidStr, _, _ := strings.Cut(owner, ".")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || procOwner(pid) != owner {
		return false
	}
	st := procState(pid)
	return st != 'Z' && st != 'X'
}

// SweepWorkspacesOf unmounts and removes the workspaces NewQuotaDirFor
// made for process pid that are not in keep (paths), and returns how
// many: those of sessions that died while no server held them (their
// kernel ended, or they were still starting when the server was killed).
// The caller must be the only one making workspaces for pid.
func SweepWorkspacesOf(pid int, keep map[string]bool) (removed int) {
	owner := procOwner(pid)
	if owner == "" {
		return 0
	}
	mounted := map[string]bool{}
	for _, m := range readMountinfo() {
		mounted[m.point] = true
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sandloop-ws-"+owner+"-*"))
	for _, d := range dirs {
		if keep[d] {
			continue
		}
		if mounted[d] {
			if err := unmountAll(d); err != nil {
				continue
			}
		}
		if removeDir(d) == nil {
			removed++
		}
	}
	return removed
}

// AdoptQuotaDir is the workspace at path that NewQuotaDirFor made for
// another server, with its caps.
func AdoptQuotaDir(path string, disk int64, files int, enforced bool) *QuotaDir {
	return &QuotaDir{Path: path, Disk: disk, Files: files, Enforced: enforced, overhead: 1}
}

func newQuotaDir(disk int64, files int, owner, kind string) (*QuotaDir, error) {
	l := Limits{Disk: disk, Files: files}.WithDefaults()
	if err := l.validateQuota(); err != nil {
		return nil, err
	}
	hostReason := hostQuotaUnsupported()
	if hostReason != "" {
		// (Neither is for root without CAP_SYS_ADMIN: see
		// usernsQuotaUnsupported.)
		switch rootlessQuota() {
		case quotaDetached:
			return newUserNSQuotaDir(l.Disk, l.Files)
		case quotaHeld:
			return newHolderQuotaDir(l.Disk, l.Files)
		}
	}
	dir, err := ownedTempDir(owner, kind)
	if err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	q := &QuotaDir{Path: dir, Disk: l.Disk, Files: l.Files, overhead: 1}
	if hostReason != "" {
		q.Reason = quotaUnsupported()
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

// OwnedTempDir makes a fresh directory under the system's temporary
// directory whose name says which process owns it (PID and start time),
// so that one left by a sandloop killed before its cleanup can be told
// from a live one's and is removed by the next sandloop (sweepQuotaDirs,
// run here at a process's first call, and again in the background at a
// call sweepEvery or more after the last: a long-running server removes
// what others left, lasting workspaces past their grace included). kind,
// if set, goes into the name.
func OwnedTempDir(kind string) (string, error) {
	return ownedTempDir(selfOwner, kind)
}

func ownedTempDir(owner, kind string) (string, error) {
	sweepNow()
	if kind != "" {
		kind += "-"
	}
	return os.MkdirTemp("", "sandloop-ws-"+owner+"-"+kind+"*")
}

var (
	selfOwner = procOwner(os.Getpid())

	sweepMu    sync.Mutex
	sweptAt    time.Time // the last sweep's start (zero: none yet)
	sweeping   bool      // a background sweep runs
	sweepEvery = 5 * time.Minute
	sweepDone  func() // tests: called after a background sweep
)

// sweepNow sweeps the temporary directory at this process's first call
// (before the caller makes its directory), and in the background at a
// call sweepEvery after the last sweep.
func sweepNow() {
	sweepMu.Lock()
	defer sweepMu.Unlock()
	switch {
	case sweptAt.IsZero():
		sweptAt = time.Now()
		sweepQuotaDirs(os.TempDir())
	case !sweeping && time.Since(sweptAt) >= sweepEvery:
		sweptAt, sweeping = time.Now(), true
		dir, done := os.TempDir(), sweepDone
		go func() {
			sweepQuotaDirs(dir)
			sweepMu.Lock()
			sweeping = false
			sweepMu.Unlock()
			if done != nil {
				done()
			}
		}()
	}
}

// procOwner names a process by PID and start time (clock ticks since
// boot), which a reused PID does not share; "" if it is gone.
func procOwner(pid int) string {
	stat := readFileString("/proc/" + strconv.Itoa(pid) + "/stat")
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	// After "pid (comm)": state is field 3, starttime field 22.
	f := strings.Fields(stat[i+1:])
	if len(f) < 20 {
		return ""
	}
	return strconv.Itoa(pid) + "." + f[19]
}

// sweepQuotaDirs unmounts and removes the workspaces under dir that a
// sandloop killed before its cleanup (kill -9, a crash, a test binary
// timed out) left behind: their owner, named in the directory's name, is
// no longer running. Without it every such workspace would stay mounted,
// holding its files in memory until the host reboots. Directories of live
// processes, and names not in this format, are left alone; so is a
// lasting workspace (NewLastingQuotaDir) that holds files, until
// LeftoverGrace after the first sweep that saw it left (a file beside it
// says when), for the next server to take its files.
func sweepQuotaDirs(dir string) (removed int) {
	entries, _ := os.ReadDir(dir)
	mounted := map[string]bool{}
	for _, m := range readMountinfo() {
		mounted[m.point] = true
	}
	now := time.Now()
	for _, e := range entries {
		if left, ok := strings.CutPrefix(e.Name(), goneMarker); ok {
			// The note of a left workspace a server has since taken.
			if _, err := os.Lstat(filepath.Join(dir, left)); errors.Is(err, fs.ErrNotExist) {
				os.Remove(filepath.Join(dir, e.Name()))
			}
			continue
		}
		owner, kind, ok := workspaceName(e.Name())
		if !ok || !e.IsDir() || ownerRuns(owner) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		marker := filepath.Join(dir, goneMarker+e.Name())
		if kind == lastingKind && !emptyDir(p) {
			fi, err := os.Lstat(marker)
			if err == nil && !ourMarker(fi, now) {
				// Not one a sweep of ours made (another user's, a link, a
				// time ahead of the clock): it says nothing; a new one
				// starts the grace.
				os.Remove(marker)
				err = fs.ErrNotExist
			}
			if errors.Is(err, fs.ErrNotExist) {
				if f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
					f.Close()
				}
				continue
			}
			if err != nil || now.Sub(fi.ModTime()) < LeftoverGrace {
				continue
			}
		}
		if mounted[p] {
			if err := unmountAll(p); err != nil {
				continue
			}
		}
		if removeDir(p) == nil {
			removed++
			os.Remove(marker)
		}
	}
	return removed
}

// ourMarker says whether fi is a note a sweep of this user made: a regular
// file it owns, dated no later than now (give or take a clock's tick).
// The temporary directory is everyone's: a note planted there must
// neither end a left workspace's grace early nor make it last forever.
func ourMarker(fi fs.FileInfo, now time.Time) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode().IsRegular() && int(st.Uid) == os.Geteuid() && !fi.ModTime().After(now.Add(time.Minute))
}

// emptyDir says whether dir holds no entry (false if it cannot be read).
func emptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	return len(names) == 0 && errors.Is(err, io.EOF)
}

// hostQuotaUnsupported says why workspaces cannot be tmpfs mounts on
// host directories here, or "".
func hostQuotaUnsupported() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if !effectiveCap(unix.CAP_SYS_ADMIN) {
		// Root in a container, which holds no CAP_SYS_ADMIN by default.
		return "no CAP_SYS_ADMIN in this container"
	}
	return ""
}

// quotaUnsupported says why workspaces cannot be quota mounts here, either
// way, or "".
func quotaUnsupported() string {
	host := hostQuotaUnsupported()
	if host == "" {
		return ""
	}
	if rootlessQuota() != "" {
		return ""
	}
	userns := usernsQuotaUnsupported()
	if h := holderQuotaUnsupported(); h != userns && os.Geteuid() != 0 {
		userns += "; held by a helper process: " + h
	}
	return fmt.Sprintf("no tmpfs can be mounted for the workspaces (on the host: %s; in a user namespace: %s); only uploads through the files API are capped", host, userns)
}

// How workspaces are capped without CAP_SYS_ADMIN on the host.
const (
	quotaDetached = "detached" // a detached tmpfs each jail clones (quota_userns_linux.go)
	quotaHeld     = "holder"   // a tmpfs in a holder's mount namespace (quota_holder_linux.go)
)

// rootlessQuota says how workspaces are capped without CAP_SYS_ADMIN on
// the host: quotaDetached where the kernel can clone a detached mount
// (6.15 on), else quotaHeld where user namespaces work, else "" (not
// at all). The holder is started only if the detached clone is refused
// (or HolderForceEnv asks for it).
var rootlessQuota = sync.OnceValue(func() string {
	if os.Getenv(HolderForceEnv) != "1" && usernsQuotaUnsupported() == "" {
		return quotaDetached
	}
	if holderQuotaUnsupported() == "" {
		return quotaHeld
	}
	return ""
})

// effectiveCap says whether this process holds capability c.
func effectiveCap(c int) bool {
	// capget of the thread-group leader: the process's set, as
	// /proc/self/status's CapEff shows it, in one system call (it runs
	// for every workspace made).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: int32(os.Getpid())}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return c < 64 && data[c/32].Effective&(1<<uint(c%32)) != 0
}

// QuotaSupport says how workspaces are capped on this host, for doctor.
func QuotaSupport() Check {
	if r := quotaUnsupported(); r != "" {
		fix := "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0), or run sandloop as root"
		if os.Geteuid() == 0 {
			fix = "give the container CAP_SYS_ADMIN inside its user namespace (--cap-add=SYS_ADMIN with --userns=auto), or allow it user namespaces, or accept uncapped workspaces"
		}
		return Check{Fallback: true, Detail: r, Fix: fix}
	}
	if hostQuotaUnsupported() != "" {
		const memory = "no root needed; ENOSPC on every write past the cap; its pages count toward the sandbox's memory cgroup, or, without cgroups, come on top of the memory limit"
		if rootlessQuota() == quotaHeld {
			why := usernsQuotaUnsupported()
			if why == "" {
				why = HolderForceEnv + "=1"
			}
			return Check{OK: true, Detail: "a size- and inode-capped tmpfs per workspace, made in a user namespace of sandloop's own and held there by a helper process, which starts the workspace's jails (" + memory + "; a helper because " + why + ")"}
		}
		return Check{OK: true, Detail: "a size- and inode-capped tmpfs per workspace, made in a user namespace of sandloop's own (" + memory + ")"}
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
		Files: max(int64(st.Files-st.Ffree)-q.overhead, 0),
	}, nil
}

// Remove unmounts the workspace (clones of the mount held by running
// jails keep its files until they end) and deletes the directory. It is
// idempotent.
func (q *QuotaDir) Remove() error {
	var err error
	q.removed.Do(func() {
		if q.layers != nil {
			q.layers.Close() // before the unmount: not to keep the tmpfs
		}
		if q.holderName != "" {
			err = q.removeHolder()
			return
		}
		if q.mount != nil {
			err = q.removeUserNS()
			return
		}
		if q.Enforced {
			// An overlay (MountOverlay) over the tmpfs: both.
			if e := unmountAll(q.Path); e != nil {
				err = fmt.Errorf("unmount workspace: %w", e)
				return
			}
		}
		err = removeDir(q.Path)
	})
	return err
}
