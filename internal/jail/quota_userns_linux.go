package jail

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Workspaces without root: a tmpfs made in a user namespace.
//
// An unprivileged process may create a user and a mount namespace, and
// there mount a tmpfs (FS_USERNS_MOUNT) with size= and nr_inodes=, the
// same caps as root's. With the new mount API (fsopen, fsconfig, fsmount)
// that tmpfs is a detached mount held by a descriptor, which a short-lived
// helper (this package's init program under quotaArg0) sends back over a
// socket and then exits: the descriptor alone keeps the file system, and
// it is freed when the last descriptor or mount of it goes, so a sandloop
// killed with -9 leaves nothing behind. The server reaches the files
// through /proc/self/fd/N/<dir>, an ordinary directory path within this
// process (os.Root, archives, --out and --with work unchanged); each jail
// is handed the descriptor, clones the subtree of <dir> (open_tree) in its
// own user and mount namespace and attaches the clone at /workspace, so
// several jails (a restart, an e2b command beside the kernel) may share
// it. The helper's user namespace maps root to the server's own uid, so
// files written from outside (uploads) and by the sandbox user (mapped to
// the same uid) all have an owner the tmpfs can store.
//
// <dir> is a directory of a random name inside the tmpfs rather than the
// tmpfs's root so that the path stays unique: a descriptor number is
// reused once closed, and a stale path of a removed workspace must find
// nothing rather than another session's files.
//
// Why this design rather than the others: a jail's own user namespace
// could mount the tmpfs, the server reaching it through /proc/<pid>/root,
// but then the files live only as long as that jail (a restart would lose
// them) and every path would depend on a process; a size-capped loop
// image needs root. The kernel must let a jail clone a mount that is
// attached nowhere (open_tree on the fsmount descriptor), which newer
// kernels do (6.15 on) and older ones refuse (EINVAL: __do_loopback's
// check_mnt wants a mount of the caller's own namespace). On those
// (Debian 12's 6.1) a long-lived holder process mounts the workspaces in
// a mount namespace of its own instead and starts their jails, so that
// each jail's namespace is a copy of it (quota_holder_linux.go): one more
// process per server, and jails of such a workspace are started through
// it. The detached tmpfs is kept where the kernel allows it: no process
// to keep, and any jail can attach it. Where user namespaces are
// forbidden (a container's profile, a sysctl) neither works: the
// workspace is an ordinary directory and only uploads are capped
// (Reason, doctor).
//
// Memory: the tmpfs's pages are charged to the memory cgroup of the
// process that writes them, the sandbox's own where cgroups are delegated.
// Without cgroups (rlimits) they are not counted by RLIMIT_DATA: they are
// bounded by the quota itself, so a sandbox's memory is at most its
// memory limit plus Disk (plus its /tmp and /dev/shm).

// quotaArg0 is argv[0] of the helper that makes a rootless workspace's
// tmpfs. It gets the size and the inode count as its arguments and the
// socket to send the mount on as descriptor 3.
const quotaArg0 = "sandloop-quota-mount"

// runQuotaHelper is the helper's body, in its new user and mount
// namespaces (root there is the server's user). It sends one message:
// "" with the mount's descriptor, or what failed.
func runQuotaHelper() int {
	const sock = 3
	mfd, err := makeDetachedTmpfs(os.Args[1:])
	msg, rights := []byte("ok"), []byte(nil)
	if err != nil {
		msg = []byte(err.Error())
	} else {
		rights = unix.UnixRights(mfd)
	}
	if err := unix.Sendmsg(sock, msg, rights, nil, 0); err != nil {
		return 1
	}
	return 0
}

func makeDetachedTmpfs(args []string) (int, error) {
	if len(args) != 2 {
		return -1, errors.New("want the size and the number of inodes")
	}
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fd)
	for _, kv := range [][2]string{{"size", args[0]}, {"nr_inodes", args[1]}, {"mode", "0755"}} {
		if err := unix.FsconfigSetString(fd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("tmpfs option %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return -1, fmt.Errorf("create tmpfs: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount: %w", err)
	}
	// Each jail attaches a clone: refuse here, rather than at the first
	// jail, where the kernel cannot clone a mount attached nowhere.
	c, err := unix.OpenTree(mfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("this kernel cannot clone a detached mount (open_tree: %w); newer ones (6.15 on) can", err)
	}
	unix.Close(c)
	return mfd, nil
}

// ownUserNSCommand runs the init program at path as argv0 (with args) in
// a user and a mount namespace of its own where root is this process's
// uid and gid, with sock as its descriptor 3; it dies with this process's
// thread that started it.
func ownUserNSCommand(path string, sock *os.File, argv0 string, args ...string) *exec.Cmd {
	return &exec.Cmd{
		Path:       path,
		Args:       append([]string{argv0}, args...),
		Env:        []string{},
		ExtraFiles: []*os.File{sock},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
			Pdeathsig:   syscall.SIGKILL,
		},
	}
}

// newUserNSTmpfs makes a tmpfs of size bytes and inodes inodes in a user
// namespace of a helper's and returns the detached mount's descriptor.
func newUserNSTmpfs(size int64, inodes int) (*os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "quota-helper"), os.NewFile(uintptr(pair[1]), "quota-helper")
	defer ours.Close()
	defer theirs.Close()
	cmd, err := startInit(func(path string) *exec.Cmd {
		cmd := ownUserNSCommand(path, theirs, quotaArg0, strconv.FormatInt(size, 10), strconv.Itoa(inodes))
		cmd.WaitDelay = 2 * time.Second
		return cmd
	})
	if err != nil {
		return nil, fmt.Errorf("start the helper in a user namespace: %w", err)
	}
	theirs.Close()
	buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, rerr := unix.Recvmsg(pair[0], buf, oob, unix.MSG_CMSG_CLOEXEC)
	werr := cmd.Wait()
	var fds []int
	if rerr == nil && oobn > 0 {
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
			fds, _ = unix.ParseUnixRights(&msgs[0])
		}
	}
	switch {
	case len(fds) == 1:
		return os.NewFile(uintptr(fds[0]), "workspace-tmpfs"), nil
	case rerr != nil:
		return nil, fmt.Errorf("the helper's answer: %w", rerr)
	case n > 0 && string(buf[:n]) != "ok":
		return nil, errors.New(string(buf[:n]))
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return nil, fmt.Errorf("the helper ended without an answer (%v)", werr)
}

// usernsQuotaUnsupported says why workspaces cannot be tmpfs mounts made
// in a user namespace here, or "". It tries once per process.
var usernsQuotaUnsupported = sync.OnceValue(func() string {
	if os.Geteuid() == 0 {
		// Root in a container without CAP_SYS_ADMIN: its jails map the
		// sandbox user to nobody, which the tmpfs's namespace (root
		// only) could not store as an owner.
		return "not for root without CAP_SYS_ADMIN"
	}
	f, err := newUserNSTmpfs(1<<20, 16)
	if err != nil {
		return err.Error()
	}
	f.Close()
	return ""
})

// newUserNSQuotaDir is NewQuotaDir without root: see the top of this file.
func newUserNSQuotaDir(disk int64, files int) (*QuotaDir, error) {
	// nr_inodes counts the root and the workspace's directory too.
	m, err := newUserNSTmpfs(disk, files+2)
	if err != nil {
		return nil, fmt.Errorf("make the workspace's tmpfs: %w", err)
	}
	sub := "sandloop-ws-" + rand.Text()
	if err := unix.Mkdirat(int(m.Fd()), sub, 0o755); err != nil {
		m.Close()
		return nil, fmt.Errorf("make the workspace's directory: %w", err)
	}
	q := &QuotaDir{
		Path: "/proc/self/fd/" + strconv.Itoa(int(m.Fd())) + "/" + sub,
		Disk: disk, Files: files, Enforced: true,
		mount: m, sub: sub, overhead: 2,
	}
	usernsDirs.Lock()
	usernsDirs.m[q.Path] = q
	usernsDirs.Unlock()
	return q, nil
}

// usernsDirs are the live workspaces made in a user namespace, by Path,
// for Start to find their mounts.
var usernsDirs = struct {
	sync.Mutex
	m map[string]*QuotaDir
}{m: map[string]*QuotaDir{}}

// usernsWorkspace returns a duplicate of the mount of the workspace made
// in a user namespace at path, and the directory inside it; ok is false
// if path is no such workspace. A path of this process's descriptors that
// is not a live workspace is an error: it would resolve elsewhere.
func usernsWorkspace(path string) (mount *os.File, sub string, ok bool, err error) {
	usernsDirs.Lock()
	defer usernsDirs.Unlock()
	q := usernsDirs.m[path]
	if q == nil {
		if strings.HasPrefix(path, "/proc/self/") {
			return nil, "", false, errors.New("not a live workspace (removed?)")
		}
		return nil, "", false, nil
	}
	if q.holderName != "" {
		return nil, "", false, ErrHolderWorkspace
	}
	fd, err := unix.FcntlInt(q.mount.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, "", false, err
	}
	return os.NewFile(uintptr(fd), "workspace"), q.sub, true, nil
}

// removeUserNS forgets the workspace and closes its mount: the tmpfs is
// freed once no jail holds a clone of it.
func (q *QuotaDir) removeUserNS() error {
	usernsDirs.Lock()
	delete(usernsDirs.m, q.Path)
	usernsDirs.Unlock()
	return q.mount.Close()
}

// UserNSWorkspace returns, for a workspace NewQuotaDir made in a user
// namespace (its Path), a duplicate of the tmpfs's detached mount and the
// workspace's directory in it, for a process that attaches a clone of it
// as a jail's init does (the zygote's spares); ok is false for any other
// directory.
func UserNSWorkspace(path string) (mount *os.File, sub string, ok bool, err error) {
	return usernsWorkspace(path)
}

// ErrHolderWorkspace is UserNSWorkspace's answer for a workspace the
// holder made (quota_holder_linux.go): it has no detached mount to clone.
var ErrHolderWorkspace = errors.New("a workspace mounted by the holder process (this kernel cannot clone a detached mount)")

// holderWorkspace returns the directory in the holder's mount namespace
// of the workspace the holder made at path; ok is false for any other.
func holderWorkspace(path string) (dir string, ok bool) {
	usernsDirs.Lock()
	q := usernsDirs.m[path]
	usernsDirs.Unlock()
	if q == nil || q.holderName == "" {
		return "", false
	}
	h, err := theHolder()
	if err != nil {
		return "", false // (it made q: not reached)
	}
	return q.holderPath(h), true
}

// HolderWorkspace returns, for a workspace NewQuotaDir had the holder
// make (its Path), the workspace's directory as the holder and the jails
// it starts see it: a directory under the temporary directory (resolved),
// where a zygote template started by the holder finds it (Config.Zygote
// with ZygoteWorkspaces there). ok is false for any other directory.
func HolderWorkspace(path string) (dir string, ok bool) { return holderWorkspace(path) }
