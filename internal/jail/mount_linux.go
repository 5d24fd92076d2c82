package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host paths are read through the old root while the new one is built.
const (
	baseDir = "/tmp"     // a tmpfs is mounted here (in the jail's mount namespace only)
	oldRoot = "/oldroot" // the host's root, below the base tmpfs, until detached
	newRoot = "/newroot" // the jail's root, below the base tmpfs
	hostFD  = "/oldroot/proc/self/fd/"
)

// systemDirs are mounted read-only from the host, or recreated as the same
// symlink where the host has one (merged /usr).
var systemDirs = []string{"/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"}

// etcCopies are copied from the host's /etc when present: what the
// interpreter, the dynamic linker, TLS and time zones need. Nothing that
// holds secrets (shadow, ssh, ssl/private, machine-id) is on the list.
var etcCopies = []string{"ld.so.cache", "ld.so.conf", "mime.types", "matplotlibrc", "nsswitch.conf", "protocols", "services"}

// imageEtcCopies are copied too from an image's /etc (not the host's):
// which system the image is.
var imageEtcCopies = []string{"os-release", "debian_version"}

// etcDirs are bind-mounted read-only from the host's /etc when present.
var etcDirs = []string{"alternatives", "ssl/certs", "ca-certificates", "python3", "python3.11", "python3.12", "python3.13", "fonts"}

// procMasked are hidden behind /dev/null (files) or an empty read-only
// tmpfs (directories): they leak kernel addresses or host details.
var procMasked = []string{"kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "kpagecount", "kpageflags", "kpagecgroup", "config.gz", "sysrq-trigger", "acpi", "scsi", "asound", "firmware", "driver"}

// procReadOnly are remounted read-only: kernel tunables.
var procReadOnly = []string{"sys", "irq", "bus", "fs"}

var devNodes = []string{"null", "zero", "full", "random", "urandom"}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, dst, err)
	}
	return nil
}

// buildRoot builds the jail's file system from scratch and enters it with
// pivot_root. Afterwards no host path is reachable but what was bound in.
func buildRoot(cfg *initConfig) error {
	// Keep every mount change inside this namespace. (A template the
	// holder started receives the holder's later mounts instead: a slave
	// propagates nothing outward either.)
	propagation := uintptr(unix.MS_PRIVATE)
	if cfg.ReceiveMounts {
		propagation = unix.MS_SLAVE
	}
	if err := mount("", "/", "", unix.MS_REC|propagation, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", baseDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{baseDir + oldRoot, baseDir + newRoot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.PivotRoot(baseDir, baseDir+oldRoot); err != nil {
		return fmt.Errorf("pivot_root to base: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// The jail's root: a small tmpfs, remounted read-only once filled.
	if err := mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m,nr_inodes=4096,mode=0755"); err != nil {
		return err
	}
	steps := []func(*initConfig) error{attachImageRoot, mountSystem, makeEtc, makeDev, mountProc, mountScratch, makeTools, placeFiles, mountZygoteWorkspaces, mountExtra}
	for _, step := range steps {
		if err := step(cfg); err != nil {
			return err
		}
	}
	// Detach the host's root, then make newroot "/" with the old base
	// stacked below it and detached too.
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach host root: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to jail: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach base: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return err
	}
	dir := cfg.Dir
	if dir == "" {
		dir = WorkspaceDir
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("chdir %s: %w", dir, err)
	}
	return nil
}

// bindReadOnly bind-mounts src on dst and makes it read-only, keeping the
// flags the kernel locks for mounts inherited from a more privileged
// namespace (nodev, nosuid, noexec, atime flags).
func bindReadOnly(src, dst string, extra uintptr) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dst, err)
	}
	flags := unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | extra | lockedFlags(st.Flags)
	return mount("", dst, "", flags, "")
}

func lockedFlags(f int64) uintptr {
	var out uintptr
	for _, m := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if f&m.st != 0 {
			out |= m.ms
		}
	}
	return out
}

// imageDir is where a Root mount (an image template) is attached in the
// base tmpfs while the jail's root is built; it goes when the base does.
const imageDir = "/image"

// attachImageRoot attaches Config.Mounts' Root mount, if any, read-only,
// nosuid and nodev, at imageDir and makes it the source of the system
// directories; otherwise they come from the host (oldRoot).
func attachImageRoot(cfg *initConfig) error {
	cfg.sysRoot = oldRoot
	for _, m := range cfg.Mounts {
		if !m.Root {
			continue
		}
		if err := os.Mkdir(imageDir, 0o755); err != nil {
			return err
		}
		if m.FD != 0 {
			err := unix.MoveMount(m.FD, "", unix.AT_FDCWD, imageDir, unix.MOVE_MOUNT_F_EMPTY_PATH)
			unix.Close(m.FD)
			if err != nil {
				return fmt.Errorf("attach the image root: %w", err)
			}
		} else if err := mount(oldRoot+m.Host, imageDir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		var st unix.Statfs_t
		if err := unix.Statfs(imageDir, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", imageDir, err)
		}
		if err := mount("", imageDir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|lockedFlags(st.Flags), ""); err != nil {
			return err
		}
		fd, err := unix.Open(imageDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		cfg.sysRoot, cfg.sysRootFD = imageDir, fd
	}
	return nil
}

// inImage opens name (relative, in the image's /etc) as if the image
// were "/": a symbolic link in the image, absolute or climbing with "..",
// resolves inside it, never to a host file, and no other mount is crossed.
func inImage(cfg *initConfig, name string, flags int) (int, error) {
	return unix.Openat2(cfg.sysRootFD, name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// readInImage reads a regular file of at most 4 MiB from the image.
func readInImage(cfg *initConfig, name string) ([]byte, error) {
	fd, err := inImage(cfg, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > 4<<20 {
		return nil, fmt.Errorf("%s: not a regular file of at most 4 MiB", name)
	}
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

// bindFromImage binds the image's directory name at dst, read-only.
func bindFromImage(cfg *initConfig, name, dst string) error {
	fd, err := inImage(cfg, name, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("clone %s of the image: %w", name, err)
	}
	err = unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
	unix.Close(tree)
	if err != nil {
		return fmt.Errorf("attach %s of the image: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return err
	}
	return mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|lockedFlags(st.Flags), "")
}

func mountSystem(cfg *initConfig) error {
	for _, d := range systemDirs {
		// An image's top-level entries are looked at, not followed: a
		// link (merged /usr) is recreated as the same link.
		src, dst := cfg.sysRoot+d, newRoot+d
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
			continue
		}
		if !fi.IsDir() {
			continue
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := bindReadOnly(src, dst, 0); err != nil {
			return err
		}
	}
	return nil
}

func makeEtc(cfg *initConfig) error {
	etc := newRoot + "/etc"
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	if err := writeGeneratedEtc(etc); err != nil {
		return err
	}
	if cfg.sysRootFD != 0 {
		return imageEtc(cfg, etc)
	}
	for _, name := range etcCopies {
		data, err := os.ReadFile(oldRoot + "/etc/" + name)
		if err != nil {
			continue // optional
		}
		if err := os.WriteFile(filepath.Join(etc, name), data, 0o644); err != nil {
			return err
		}
	}
	// localtime is normally a symlink into /usr/share/zoneinfo.
	if target, err := os.Readlink(oldRoot + "/etc/localtime"); err == nil {
		if err := os.Symlink(target, etc+"/localtime"); err != nil {
			return err
		}
	} else if data, err := os.ReadFile(oldRoot + "/etc/localtime"); err == nil {
		if err := os.WriteFile(etc+"/localtime", data, 0o644); err != nil {
			return err
		}
	}
	for _, d := range etcDirs {
		src := oldRoot + "/etc/" + d
		fi, err := os.Stat(src)
		if err != nil || !fi.IsDir() {
			continue
		}
		dst := filepath.Join(etc, d)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := bindReadOnly(src, dst, unix.MS_NODEV); err != nil {
			return err
		}
	}
	return nil
}

// imageEtc fills the jail's /etc from an image's (every path resolved
// inside the image): the same files and directories as from the host's.
func imageEtc(cfg *initConfig, etc string) error {
	for _, name := range append(etcCopies[:len(etcCopies):len(etcCopies)], imageEtcCopies...) {
		data, err := readInImage(cfg, "etc/"+name)
		if err != nil {
			continue // optional
		}
		if err := os.WriteFile(filepath.Join(etc, name), data, 0o644); err != nil {
			return err
		}
	}
	// A link's target is only text here; it resolves in the jail.
	if fd, err := inImage(cfg, "etc", unix.O_PATH|unix.O_DIRECTORY); err == nil {
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(fd, "localtime", buf)
		unix.Close(fd)
		if err == nil && n < len(buf) {
			if err := os.Symlink(string(buf[:n]), etc+"/localtime"); err != nil {
				return err
			}
		} else if data, err := readInImage(cfg, "etc/localtime"); err == nil {
			if err := os.WriteFile(etc+"/localtime", data, 0o644); err != nil {
				return err
			}
		}
	}
	for _, d := range etcDirs {
		fd, err := inImage(cfg, "etc/"+d, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			continue
		}
		unix.Close(fd)
		dst := filepath.Join(etc, d)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := bindFromImage(cfg, "etc/"+d, dst); err != nil {
			return err
		}
	}
	return nil
}

// writeGeneratedEtc writes the files of /etc the jail makes itself.
func writeGeneratedEtc(etc string) error {
	generated := map[string]string{
		"passwd": fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\n%s:x:%d:%d:sandbox:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
			SandboxUser, SandboxUID, SandboxGID, WorkspaceDir),
		"group":       fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", SandboxUser, SandboxGID),
		"hosts":       "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":    "sandbox\n",
		"resolv.conf": "",
	}
	for name, data := range generated {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func makeDev(cfg *initConfig) error {
	dev := newRoot + "/dev"
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755"); err != nil {
		return err
	}
	nodes := devNodes
	if cfg.Terminal {
		// Opens the caller's controlling terminal (ENXIO without one):
		// the jail's own, never the host's.
		nodes = append(nodes[:len(nodes):len(nodes)], "tty")
	}
	for _, n := range nodes {
		dst := dev + "/" + n
		if err := os.WriteFile(dst, nil, 0o666); err != nil {
			return err
		}
		// Device nodes cannot be created in a user namespace; bind the
		// host's (they carry no state).
		if err := mount(oldRoot+"/dev/"+n, dst, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	links := map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
	for name, target := range links {
		if err := os.Symlink(target, dev+"/"+name); err != nil {
			return err
		}
	}
	shm := dev + "/shm"
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, tmpfsData(cfg.Limits.TmpSize, 1<<14, "1777")); err != nil {
		return err
	}
	return mount("", dev, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "")
}

func tmpfsData(size int64, inodes int, mode string) string {
	return "size=" + strconv.FormatInt(size, 10) + ",nr_inodes=" + strconv.Itoa(inodes) + ",mode=" + mode
}

func mountProc(*initConfig) error {
	proc := newRoot + "/proc"
	if err := os.Mkdir(proc, 0o555); err != nil {
		return err
	}
	// A fresh proc for the jail's own PID namespace: the host's processes
	// are not in it.
	if err := mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for _, name := range procMasked {
		p := proc + "/" + name
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			if err := mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0"); err != nil {
				return err
			}
			continue
		}
		if err := mount(newRoot+"/dev/null", p, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, name := range procReadOnly {
		p := proc + "/" + name
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := bindReadOnly(p, p, unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
			return err
		}
	}
	return nil
}

// makeTools fills ToolsDir in the jail's own root (read-only once built):
// `python`, a link to the root's python3, and `pip`, which runs python3
// -m pip with the first python3 on PATH (a template's environment's).
func makeTools(*initConfig) error {
	dir := newRoot + ToolsDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/usr/bin/python3", dir+"/python"); err != nil {
		return err
	}
	return os.WriteFile(dir+"/pip", []byte("#!/bin/sh\nexec python3 -m pip \"$@\"\n"), 0o755)
}

// mountScratch mounts the size-capped /tmp and the workspace.
func mountScratch(cfg *initConfig) error {
	tmp := newRoot + "/tmp"
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		return err
	}
	if err := mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpfsData(cfg.Limits.TmpSize, 1<<16, "1777")); err != nil {
		return err
	}
	ws := newRoot + WorkspaceDir
	if err := os.Mkdir(ws, 0o755); err != nil {
		return err
	}
	// E2B's home, where its SDKs and the agent frameworks write: the
	// workspace under a second name (a link in the read-only root, so it
	// leads nowhere else).
	if err := os.Mkdir(newRoot+filepath.Dir(HomeDir), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(WorkspaceDir, newRoot+HomeDir); err != nil {
		return err
	}
	if cfg.WorkspaceSub != "" {
		// A tmpfs made in a user namespace (quota_userns_linux.go):
		// clone its workspace directory, so that the host's descriptor
		// stays whole for the next jail, and attach the clone.
		c, err := unix.OpenTree(initWorkspaceFD, cfg.WorkspaceSub, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("clone the workspace's mount: %w", err)
		}
		err = unix.MoveMount(c, "", unix.AT_FDCWD, ws, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(c)
		if err != nil {
			return fmt.Errorf("attach workspace: %w", err)
		}
	} else if cfg.WorkspaceTree {
		// The host cloned the workspace's mount with open_tree: attach
		// it. Its parents need not be traversable by the sandbox user,
		// and a path swapped under us cannot redirect the mount.
		if err := unix.MoveMount(initWorkspaceFD, "", unix.AT_FDCWD, ws, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach workspace: %w", err)
		}
	} else if err := mount(oldRoot+cfg.Workspace, ws, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(ws, &st); err != nil {
		return err
	}
	return mount("", ws, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|lockedFlags(st.Flags), "")
}

// mountZygoteWorkspaces binds Config.ZygoteWorkspaces (alone where it can:
// the mounts below it are then not reachable) into a zygote's jail.
func mountZygoteWorkspaces(cfg *initConfig) error {
	if cfg.ZygoteWorkspaces == "" {
		return nil
	}
	dst := newRoot + ZygoteWorkspacesDir
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	err := mount(oldRoot+cfg.ZygoteWorkspaces, dst, "", unix.MS_BIND, "")
	if errors.Is(err, unix.EINVAL) {
		// In a user namespace, a directory with mounts below it (locked:
		// they came from a more privileged namespace) can be bound only
		// with them, or it would reveal what they cover. The template runs
		// no user code, and each spare detaches this whole view (lazily,
		// submounts included) before its kernel runs any.
		err = mount(oldRoot+cfg.ZygoteWorkspaces, dst, "", unix.MS_BIND|unix.MS_REC, "")
	}
	if err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return err
	}
	return mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|lockedFlags(st.Flags), "")
}

// placeFiles writes the configured files into the root before it becomes
// read-only.
func placeFiles(cfg *initConfig) error {
	for _, f := range cfg.Files {
		p := filepath.Join(newRoot, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(p, f.Data, mode.Perm()); err != nil {
			return err
		}
	}
	return nil
}

// validFilePath reports whether p may be used for a File: absolute, clean
// and outside every mount point of the jail.
func validFilePath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return errors.New("must be an absolute, clean path")
	}
	for _, m := range append([]string{"/etc", "/dev", "/proc", "/tmp", WorkspaceDir}, systemDirs...) {
		if p == m || strings.HasPrefix(p, m+"/") {
			return fmt.Errorf("%s is under %s", p, m)
		}
	}
	return nil
}
