"""sandloop zygote: a template kernel that forks sessions copy-on-write.

Standard library only (ctypes for the system calls Python lacks). The Go
side (internal/zygote) starts it in a jail started with Config.Zygote: it
keeps CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_SETPCAP in the jail's user
namespace and has no seccomp filter. It never runs user code: each child
builds its own jail (namespaces, mounts, limits), drops every capability and
installs the jail's seccomp filter before it becomes a kernel.

fd 3 is a SOCK_SEQPACKET control socket. The host sends the configuration
(modules to import, the filter, the /proc masks, how many spares), the
zygote answers {"ready": ...}. Then it makes spares ahead of any request:
for each it sends {"spare": pid} with one descriptor, the host end of the
spare's socket (with SO_PASSCRED: the kernel attaches the sender's PID as
the host sees it to every message), and it makes another each time the
host sends "more". On a spare's socket:
  reaper -> {"hello": "reaper"}   PID 1 of a new PID namespace, prepared
  kernel -> {"hello": "kernel"}   PID 2, forked ahead
  host   -> "arm"                 both are now in the spare's cgroup
  kernel -> {"armed": true}       cgroup namespace, no capabilities,
                                  seccomp: ready for a session
  host   -> the session: its settings and six descriptors (kernel.py's
            fds 3-7 and the workspace's detached mount, from open_tree;
            without root the workspace's directory and, in the settings,
            its path under the template's view of the host's temporary
            directory: see _clone_workspace)
  reaper -> {"locked": true}      its own capabilities gone, filter loaded
                                  (with a listener on the session's loopback
                                  when the settings ask for one: "listen");
                                  a few seconds later it executes the small
                                  reaper (REAPER_PATH), where there is one
                                  (through the trampoline, TRAMPOLINE_PATH,
                                  the reaper is the small reaper from the
                                  start, in the same words)
  kernel -> {"kernel": true}      about to run kernel.py
  reaper -> {"exited": ..., "code": n, "signal": s}
Either may send {"error": "..."} instead and exit.
"""

import base64
import ctypes
import fcntl
import gc
import importlib
import importlib.util
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time

KERNEL_PATH = "/opt/sandloop/kernel.py"
# The small reaper (reaperexe/reaper.c), where the host placed it: a taken
# session's reaper executes it rather than looping in a copy of the template.
REAPER_PATH = "/opt/sandloop/reaper"
# The trampoline (reaperexe/trampoline.c), where the host placed it: the
# template makes each spare through it, with one copy of itself (see
# _Trampoline).
TRAMPOLINE_PATH = "/opt/sandloop/trampoline.so"

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same numbers on every architecture
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 4
AT_FDCWD, AT_SYMLINK_NOFOLLOW = -100, 0x100

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off), NO_CAP_AMBIENT_RAISE, each locked:
# as the jail's dropPrivileges.
SECBITS = 1 | 2 | 4 | 8 | 32 | 64 | 128

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class Config:
    filter = b""
    masked = ()
    readonly = ()
    workspaces = None  # without root: where the host's workspaces are seen
    last_cap = 63  # /proc/sys/kernel/cap_last_cap, read once by the template
    lockdown = None  # the _Lockdown every child uses, built once by the template
    proc_masks = ()  # see _proc_plan
    proc_readonly = ()
    numpy_state = None  # see _numpy_state
    reaper = None  # REAPER_PATH if the host placed it there
    reaper_delay = 5.0  # seconds after the take before the reaper executes it
    reaper_spare = None  # its arguments as a spare's whole reaper (see _proc_plan)
    trampoline = None  # the _Trampoline, if the host placed it and it loaded
    fork_hooks = None  # see _lock_hooks


C = Config()


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    _check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), "mount %s on %s" % (src, dst))


def _locked(path):
    """The atime flags a remount must keep (statvfs reports them)."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in ((os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
                   (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if f & st:
            out |= ms
    return out


def _proc_plan():
    """The mounts that mask /proc's entries in a spare's fresh /proc (see
    _prepare), worked out once by the template from its own /proc (a proc
    of the same kernel, with the same masks): which names exist, and which
    are directories (an empty read-only tmpfs) or files (/dev/null)."""
    masks, readonly, spec = [], [], []
    for name in C.masked:
        p = "/proc/" + name
        path = ("/tmp/.proc/" + name).encode()
        if os.path.isdir(p) and not os.path.islink(p):
            masks.append((b"tmpfs", path, b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=0"))
            spec.append("d" + name)
        elif os.path.lexists(p):
            masks.append((b"/dev/null", path, None, MS_BIND, None))
            spec.append("f" + name)
    for name in C.readonly:
        if os.path.lexists("/proc/" + name):
            readonly.append("/tmp/.proc/" + name)
    # The same, for the small reaper (reaper.c: "spare").
    C.reaper_spare = ["\n".join(spec), "\n".join(n for n in C.readonly if os.path.lexists("/proc/" + n))]
    return masks, readonly


def _bind_ro(path, extra):
    _mount(path, path, None, MS_BIND | MS_REC)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | extra | _locked(path))


# ---------------------------------------------------------------- the child


def _prepare():
    """Runs in a spare child, PID 1 of its own PID namespace, before any
    session asks for it: in its new mount, network, IPC and UTS
    namespaces, a fresh /proc, loopback (the namespaces are the spare's own already:
    see _spare). Nothing here depends on the session."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Replace the template's /tmp and /proc rather than cover them, so the
    # mount table is a cold jail's. The new /proc (for this PID namespace,
    # with the jail's masks) is built on the new /tmp while the template's
    # is still there: a user namespace may mount proc only where one is
    # already fully visible.
    _check(libc.umount2(b"/tmp", MNT_DETACH), "detach the template's /tmp")
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=65536,mode=1777")
    proc = "/tmp/.proc"
    os.mkdir(proc)
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for src, path, fstype, flags, data in C.proc_masks:
        if libc.mount(src, path, fstype, flags, data) != 0:
            _check(-1, "mask %s" % path.decode())
    for path in C.proc_readonly:
        _bind_ro(path, MS_NODEV | MS_NOEXEC)
    # (Lazy unmounts wait for an RCU grace period: all of them are done
    # here, before any session waits.)
    _check(libc.umount2(b"/dev/shm", MNT_DETACH), "detach the template's /dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,nr_inodes=16384,mode=1777")
    _check(libc.umount2(b"/workspace", MNT_DETACH), "detach the template's workspace")
    _check(libc.umount2(b"/proc", MNT_DETACH), "detach the template's /proc")
    _mount(proc, "/proc", None, MS_MOVE)
    os.rmdir(proc)
    # Only loopback, brought up (the namespace is new: nothing else exists).
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0))[:18])[1]  # SIOCGIFFLAGS
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    s.close()


def _mount_session(req, ws_fd):
    """The session's mounts, in the namespace the reaper and the kernel
    share: /tmp and /dev/shm sizes and the workspace."""
    tmp = int(req["tmp_size"])
    _mount(None, "/tmp", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, "size=%d,nr_inodes=65536,mode=1777" % tmp)
    _mount(None, "/dev/shm", None, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=%d,nr_inodes=16384,mode=1777" % tmp)
    for d in ("/tmp/.sandloop/matplotlib", "/tmp/.sandloop/cache"):
        os.makedirs(d, exist_ok=True)
    if req.get("workspace_sub"):
        ws_fd = _clone_subdir(req["workspace_sub"], ws_fd)
    elif C.workspaces:
        ws_fd = _clone_workspace(req.get("workspace") or "", ws_fd)
    # The session's workspace replaces the template's (detached ahead).
    _check(libc.syscall(SYS_MOVE_MOUNT, ws_fd, b"", AT_FDCWD, b"/workspace", MOVE_MOUNT_F_EMPTY_PATH), "attach workspace")
    os.close(ws_fd)
    _mount(None, "/workspace", None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | _locked("/workspace"))


def _clone_subdir(sub, mount_fd):
    """A workspace made in a user namespace without root: mount_fd is a
    tmpfs the host holds by a descriptor, sub the workspace's directory in
    it. This clones that directory, as a cold jail's init does, and
    detaches the view of the host's workspaces, if any. Returns the clone."""
    if "/" in sub or sub in ("", ".", ".."):
        raise OSError("bad workspace directory %r" % sub)
    tree = libc.syscall(SYS_OPEN_TREE, mount_fd, sub.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW)
    os.close(mount_fd)
    if tree < 0:
        _check(-1, "clone the workspace")
    if C.workspaces:
        _check(libc.umount2(C.workspaces.encode(), MNT_DETACH), "detach the workspaces")
    return tree


def _clone_workspace(rel, dir_fd):
    """Without root the host cannot clone the workspace's mount (open_tree
    needs CAP_SYS_ADMIN over its mount namespace); it sends the workspace's
    path under C.workspaces and the directory itself (dir_fd, O_PATH).
    This clones it from the template's view, checks it is the same
    directory, and detaches the view: no other workspace stays reachable.
    Returns the clone."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OSError("bad workspace path %r" % rel)
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, (C.workspaces + "/" + rel).encode(),
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW)
    if tree < 0:
        _check(-1, "clone the workspace")
    a, b = os.fstat(tree), os.fstat(dir_fd)
    os.close(dir_fd)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(tree)
        raise OSError("the workspace was replaced while the session started")
    _check(libc.umount2(C.workspaces.encode(), MNT_DETACH), "detach the workspaces")
    return tree


def _listen(port):
    """A listener on the session's loopback for the host (as the jail's
    ListenPort: the host accepts on it, the session keeps no handle), or
    None."""
    if not port:
        return None
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(512)
    return s


def _set_rlimits(req):
    for res, val in ((resource.RLIMIT_NOFILE, req["nofile"]), (resource.RLIMIT_FSIZE, req["fsize"]),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_STACK, req["stack"])):
        resource.setrlimit(res, (int(val), int(val)))


def _lock_bounding():
    """The half of the jail's dropPrivileges that can be done ahead: empty
    bounding and ambient sets, locked securebits, no_new_privs. The
    effective set stays until _Lockdown."""
    for c in range(C.last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            _check(-1, "drop capability %d" % c)
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    _check(libc.prctl(PR_SET_SECUREBITS, SECBITS, 0, 0, 0), "set securebits")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


class _Lockdown:
    """The rest of the jail's dropPrivileges and its seccomp filter, with
    every object built ahead (a forked process pays for each page it
    first writes: building them when a session waits costs milliseconds)."""

    def __init__(self):
        self.hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        self.data = (ctypes.c_uint32 * 6)()  # empty inheritable, permitted, effective
        self.buf = ctypes.create_string_buffer(C.filter, len(C.filter))
        self.prog = _SockFprog(len(C.filter) // 8, ctypes.cast(self.buf, ctypes.c_void_p))
        self.capset, self.prctl = libc.capset, libc.prctl

    def __call__(self):
        _check(self.capset(self.hdr, self.data), "capset")
        _check(self.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(self.prog), 0, 0), "load seccomp filter")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _fail(sock, code, what, e):
    try:
        sock.send(json.dumps({"error": "%s: %s: %s" % (what, type(e).__name__, e)}).encode())
    finally:
        os._exit(code)


def _armed_cgroup(sock):
    """Waits for "arm": the host has moved this process into the spare's
    cgroup, which then becomes the root of its own cgroup namespace.
    Anything else (the host gave up) ends this child."""
    if sock.recv(16) != b"arm":
        os._exit(0)
    _check(libc.unshare(CLONE_NEWCGROUP), "unshare cgroup namespace")


def _receive(sock, nfds):
    """One message with exactly nfds descriptors; anything else ends this
    child."""
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, nfds + 1)
    if not msg or len(fds) != nfds:
        os._exit(0)
    return msg, fds


def _above_kernel_fds(s):
    """s, moved to a descriptor above kernel.py's 0-7."""
    fd = fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 8)
    s.close()
    return socket.socket(fileno=fd)


def _numpy_state():
    """The address of numpy's global generator's MT19937 state (624 words
    of key, then the position), checked against numpy's own view of it;
    None if numpy is not imported or the check fails (then a fork reseeds
    it the slow way). Called once, by the template."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    try:
        if np.random.get_state()[3] != 0:
            return None  # a cached Gaussian: only numpy's seeding clears it
        bg = np.random.mtrand._rand._bit_generator
        addr = bg.ctypes.state_address
        saved = bg.state
        key = (ctypes.c_uint32 * 624).from_address(addr)
        ctypes.memmove(key, bytes(range(256)) * 9 + bytes(range(192)), 624 * 4)
        ctypes.c_int.from_address(addr + 624 * 4).value = 624
        st = bg.state["state"]
        ok = bytes(st["key"].astype("<u4").tobytes()) == bytes(range(256)) * 9 + bytes(range(192)) and st["pos"] == 624
        bg.state = saved
        return addr if ok else None
    except Exception:
        return None


def _reseed_numpy():
    """Reseeds numpy's global generator in a fork, as np.random.seed() does
    (2496 bytes from the kernel's generator into its MT19937 key, first bit
    set so that the key is never zero) without numpy's Python-level
    seeding, which cost a fork ~150 copied pages."""
    np = sys.modules.get("numpy")
    if np is None:
        return
    if C.numpy_state is None:
        try:
            np.random.seed()
        except Exception:
            pass
        return
    key = (ctypes.c_uint32 * 624).from_address(C.numpy_state)
    ctypes.memmove(key, os.urandom(624 * 4), 624 * 4)
    key[0] = 0x80000000
    ctypes.c_int.from_address(C.numpy_state + 624 * 4).value = 624


def _fork_bare():
    """fork(2) without the interpreter's after-fork work in the child (its
    at-fork hooks: threading's bookkeeping, random's reseed, logging's and
    matplotlib's). For the reaper only, a copy of the single-threaded
    template that never runs user code nor those modules: that work cost it
    ~300 copied pages, half of its faults. Its kernel is forked with
    os.fork, hooks and all."""
    pid = libc.fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork: " + os.strerror(ctypes.get_errno()))
    return pid


def _kernel(sock, peer, kmod):
    """PID 2, forked ahead: armed (no capabilities, the filter) before any
    session exists, it waits for its session's descriptors from the
    reaper, then runs kernel.py."""
    try:
        sock, peer = _above_kernel_fds(sock), _above_kernel_fds(peer)
        os.setsid()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != 1:
            os._exit(0)  # the reaper is gone
        # A freshly executed program is dumpable (the reaper is not): the
        # kernel must be, to reach its own /proc entries.
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        # Random state is copied by fork: reseed what the template seeded.
        # (The random module reseeds itself after fork.)
        _reseed_numpy()
        _lock_bounding()
        sock.send(b'{"hello":"kernel"}')
        _armed_cgroup(peer)
        C.lockdown()
        sock.send(b'{"armed":true}')
    except BaseException as e:
        _fail(sock, 127, "arm the kernel", e)
    msg, kfds = _receive(peer, 5)
    try:
        req = json.loads(msg)
        _set_rlimits(req)
        os.chdir("/workspace")
        # Exactly kernel.py's descriptors: 0-2 /dev/null, 3-6 the host's
        # pipes, 7 its state channel; nothing else.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 8) for fd in kfds]
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)
        os.environ.clear()
        for kv in req["env"]:
            k, _, v = kv.partition("=")
            os.environ[k] = v
        sys.argv = [KERNEL_PATH]
        sock.send(b'{"kernel":true}')
    except BaseException as e:
        _fail(sock, 127, "start the kernel", e)
    os.closerange(8, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    try:
        kmod.main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    os._exit(0)


def _exec_reaper(sock, kpid):
    """Replaces this copy of the template (its copied pages and page tables,
    ~1.5 MiB per idle session) with the small reaper, which does what the
    loop at the end of _spare does. Called C.reaper_delay after the take:
    unmapping the copy costs 3-7 ms of CPU (as the reaper's exit would),
    not to be spent while the session starts. The session may already run
    code: the program is execute-only, so the reaper stays non-dumpable
    across the execve (its descriptors, the socket to the host, out of the
    session's reach through /proc/1). Returns if it could not be executed:
    the caller goes on in Python."""
    fd = sock.fileno()
    # Blocked across the execve (the program handles them, then unblocks):
    # a signal for the kernel sent meanwhile stays pending, where PID 1
    # without a handler would drop it.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        os.set_inheritable(fd, True)
        os.execv(C.reaper, [C.reaper, str(kpid), str(fd)])
    except OSError:
        os.set_inheritable(fd, False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


def _exec_spare(sock, ours, kpid):
    """The spare's reaper becomes the small reaper at once (reaper.c,
    "spare"), which does its whole part, so that it runs no Python after
    the fork: its faults and interpreter work are spared. Returns if it
    could not be executed."""
    fds = (sock.fileno(), ours.fileno())
    argv = list(C.reaper_spare)
    argv[2:5] = [str(kpid), str(fds[0]), str(fds[1])]
    try:
        for fd in fds:
            os.set_inheritable(fd, True)
        os.execv(C.reaper, argv)
    except OSError:
        for fd in fds:
            os.set_inheritable(fd, False)


def _spare(sock, kmod):
    """A spare child: PID 1 of a new PID namespace, prepared ahead with its
    kernel forked and armed, waiting for its session. Then it is the
    session's reaper: it mounts the session's /tmp and workspace, hands the
    kernel its descriptors, drops its own capabilities and reaps every
    process until the kernel ends. When it exits, the kernel kills whatever
    is left in the PID namespace."""
    try:
        # The kernel is forked first, as soon as the namespaces it shares
        # with the reaper exist: a page either of them writes is then
        # copied once, for the one that writes it, rather than first for
        # the reaper and again for the kernel (copy-on-write faults are a
        # fifth of a spare's CPU). The mounts below are made in the mount
        # namespace both share, before the kernel needs them (it does not
        # touch the filesystem until its session, which the reaper hands
        # it after its own mounts).
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        kpid = os.fork()
    except BaseException as e:
        _fail(sock, 125, "prepare the spare", e)
    if kpid == 0:
        try:
            ours.close()
            _kernel(sock, peer, kmod)
        finally:
            os._exit(127)
    if C.reaper_spare:
        _exec_spare(sock, ours, kpid)  # returns only if it could not
    try:
        peer.close()
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _prepare()
        _lock_bounding()
        sock.send(b'{"hello":"reaper"}')
    except BaseException as e:
        _fail(sock, 125, "prepare the spare", e)
    try:
        _armed_cgroup(sock)
        ours.send(b"arm")
    except BaseException as e:
        _fail(sock, 125, "arm the spare", e)
    msg, fds = _receive(sock, 6)
    try:
        req = json.loads(msg)
        _mount_session(req, fds[5])
        listener = _listen(int(req.get("listen") or 0))
        socket.send_fds(ours, [msg], fds[:5])
        for fd in fds[:5]:
            os.close(fd)
        ours.close()
        _set_rlimits(req)
        C.lockdown()
        # Forwarded from before the session exists (the host signals
        # the reaper only for the session's kernel): after, a signal
        # that came first would find the template's handlers (SIGINT's
        # KeyboardInterrupt would end the reaper, and the session).
        for s in FORWARDED:
            signal.signal(s, lambda sig, _f: os.kill(kpid, sig))
        if listener is None:
            sock.send(b'{"locked":true}')
        else:
            socket.send_fds(sock, [b'{"locked":true}'], [listener.fileno()])
            listener.close()
    except BaseException as e:
        _fail(sock, 126, "build the session's jail", e)
    # Children are reaped when SIGCHLD says so (blocked: it waits for
    # sigtimedwait); the small reaper is executed C.reaper_delay after the
    # take, not now (see _exec_reaper), once everything ended is reaped.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    exec_at = time.monotonic() + C.reaper_delay
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                break
            if pid != kpid:
                continue
            msg = {"exited": True, "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0}
            if os.WIFSIGNALED(status):
                msg["signal"] = os.WTERMSIG(status)
            try:
                sock.send(json.dumps(msg).encode())
            finally:
                os._exit(0)
        if not C.reaper:
            signal.sigwaitinfo([signal.SIGCHLD])
            continue
        left = exec_at - time.monotonic()
        if left > 0:
            signal.sigtimedwait([signal.SIGCHLD], left)
            continue
        _exec_reaper(sock, kpid)  # returns only if it could not
        C.reaper = None


class _Trampoline:
    """Makes a spare with one copy of the template's page tables rather
    than two (trampoline.c, loaded with ctypes.PyDLL: the GIL stays held).
    Its call clones a child that shares the template's memory (no copy) in
    the spare's new PID, mount, network, IPC and UTS namespaces while the
    template waits; the child forks the kernel (the one copy), which
    returns 0 from the call in its own copy of the template, with the
    interpreter's after-fork work done as os.fork does it
    (PyOS_BeforeFork in the template, PyOS_AfterFork_Child in the kernel,
    PyOS_AfterFork_Parent in the template: threading's bookkeeping,
    random's reseed, logging's locks); the child then executes the small
    reaper ("spare": the reaper's whole part, see reaper.c) and never runs
    Python. The template gets the reaper's PID. Its own PID namespace never
    changes (no unshare and setns back)."""

    STAGES = {1: "clone the spare", 2: "fork the kernel", 3: "the reaper's descriptors", 4: "execute the small reaper"}

    def __init__(self, path, argv):
        lib = ctypes.PyDLL(path)
        self.lib = lib
        api = ctypes.pythonapi
        hooks = [ctypes.cast(f, ctypes.c_void_p) for f in (api.PyOS_BeforeFork, api.PyOS_AfterFork_Parent, api.PyOS_AfterFork_Child)]
        lib.sandloop_init.argtypes = [ctypes.c_void_p] * 3
        lib.sandloop_init.restype = None
        lib.sandloop_init(*hooks)
        self.call = lib.sandloop_spare
        self.call.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                              ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int)]
        self.call.restype = ctypes.c_int
        self.serve_call = lib.sandloop_serve
        self.serve_call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                    ctypes.POINTER(ctypes.c_int)]
        self.serve_call.restype = ctypes.c_int
        self.path = argv[0].encode()
        self.argv = [a.encode() if a is not None else None for a in argv]
        self.why = (ctypes.c_int * 2)()

    def fork(self, close, sock, reaper_fd):
        """The reaper's PID in the template, 0 in the kernel. close are
        descriptors neither of them keeps (closed before the kernel's
        fork); sock (the spare's socket) and reaper_fd are the reaper's
        (every other descriptor is closed across its execve)."""
        argv = list(self.argv)
        argv[3:5] = [str(sock).encode(), str(reaper_fd).encode()]
        args = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
        fds = (ctypes.c_int * len(close))(*close)
        pid = self.call(fds, len(close), sock, reaper_fd, self.path, args, self.why)
        if pid < 0:
            e = self.why[1]
            raise OSError(e, "%s: %s" % (self.STAGES.get(self.why[0], "make the spare"), os.strerror(e)))
        return pid


    def serve(self, ctl, pidns, initial):
        """The template's loop in C (trampoline.c's sandloop_serve): initial
        spares, then one for each message the host sends on ctl. Returns
        None in the template when the host has closed ctl; in a kernel
        (PID 2 of its spare, its parent the small reaper) its socket to the
        host and its end of the one to its reaper, as descriptors. The
        template runs no Python meanwhile, so it writes none of the pages
        its forks share with it (see sandloop_serve)."""
        argv = list(self.argv)
        argv[2:5] = [b"-", b"-", b"-"]  # the kernel's PID and the reaper's descriptors, set in C
        self.serve_argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
        kfds = (ctypes.c_int * 2)(-1, -1)
        if self.serve_call(ctl, pidns, initial, self.path, self.serve_argv, kfds) != 0:
            return None
        return kfds[0], kfds[1]


# ---------------------------------------------------------------- the template


def _warm_first_plot(kmod):
    """What a session's first plot imports, once here rather than in every
    fork: kernel.py's backend module and the image plugins Pillow loads when
    it first writes an image. Best effort: a fork imports what is missing."""
    sys.meta_path.append(kmod._BackendFinder)
    try:
        importlib.import_module("sandloop_backend")
        from PIL import Image

        Image.preinit()
        for name in ("PIL.TiffImagePlugin", "PIL.ImageOps", "fractions"):
            importlib.import_module(name)
    except Exception:
        pass
    finally:
        sys.meta_path.remove(kmod._BackendFinder)


def _huge_pages(advice=25):
    """Collapses the template's anonymous memory ([heap] and anonymous
    private mappings) into 2 MiB pages where a whole aligned 2 MiB lies in
    one mapping (MADV_COLLAPSE, Linux 6.1): a fork then copies one entry
    per 2 MiB rather than 512, and an exit drops one. The mappings keep
    their flags (no MADV_HUGEPAGE: a fork's own new memory stays in small
    pages). Best effort: returns what happened, for the host's log."""
    MADV_COLLAPSE = advice  # 25 (the host's tests give one no kernel knows)
    size = 2 << 20
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = tried = 0
    errs = {}
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    for line in maps:
        fields = line.split()
        if len(fields) < 5 or fields[4] != "0" or fields[1][:2] != "rw" or fields[1][3] != "p":
            continue
        if len(fields) > 5 and fields[5] != "[heap]":
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        lo = (lo + size - 1) & ~(size - 1)
        hi &= ~(size - 1)
        for a in range(lo, hi, size):
            tried += 1
            if libc.madvise(a, size, MADV_COLLAPSE) == 0:
                done += 1
                continue
            # EINVAL: nothing there yet (or a kernel before 6.1: then
            # every range); ENOMEM, EAGAIN: no huge page free now. EPERM
            # (a filter), ENOSYS: none will.
            e = ctypes.get_errno()
            errs[e] = errs.get(e, 0) + 1
            if e in (1, 38) and not done:
                return "none collapsed: %s" % os.strerror(e)
    out = "%d of %d ranges of 2 MiB collapsed" % (done, tried)
    if tried and not done:
        out = "none collapsed: %d ranges of 2 MiB tried" % tried
    if errs:
        out += " (%s)" % ", ".join("%s: %d" % (os.strerror(e), n) for e, n in sorted(errs.items()))
    return out


class _ArenaAllocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


def _arenas(lib):
    """Python's object arenas from here on in one region the trampoline
    reserved (trampoline.c's sandloop_arenas), so that the template's
    objects lie in 2 MiB-aligned memory _huge_pages can collapse rather
    than in 1 MiB mappings between the libraries'. Best effort."""
    if lib.sandloop_arenas() != 0:
        return
    alloc = _ArenaAllocator(None, ctypes.cast(lib.sandloop_arena_alloc, ctypes.c_void_p),
                            ctypes.cast(lib.sandloop_arena_free, ctypes.c_void_p))
    ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(alloc))


def _threads():
    return len(os.listdir("/proc/self/task"))


def _lock_hooks():
    """The interpreter's list of after-fork hooks for the child
    (os.register_at_fork's after_in_child) and the same list without the
    hooks that only make a forked child's threading state and locks sound
    when the parent had other threads or held a lock as it forked:
    threading's _after_fork, logging's reinit of its locks, and any lock's
    _at_fork_reinit (concurrent.futures'). Random's reseed and any hook not
    known here are kept. None if the list is not found or the template has
    had a thread other than its main one. For sandloop_serve's forks: the
    template then holds no lock (it waits in C) and has one thread, so
    those hooks change nothing in its kernels but the main thread's native
    id (which the kernel sets itself) and cost each ~200 copied
    pages (the Python they run touches objects all over the template's
    memory). Called before gc.freeze (get_referrers skips frozen objects)."""
    if threading.active_count() != 1 or len(getattr(threading, "_dangling", ())) > 1:
        return None
    lists = [o for o in gc.get_referrers(threading._after_fork) if type(o) is list]
    if len(lists) != 1:
        return None
    hooks = lists[0]
    logging = sys.modules.get("logging")
    lock_reinit = getattr(logging, "_after_at_fork_child_reinit_locks", None)
    locks = (type(threading.Lock()), type(threading.RLock()))

    def needed(h):
        if h is threading._after_fork or (lock_reinit is not None and h is lock_reinit):
            return False
        return not (getattr(h, "__name__", "") == "_at_fork_reinit" and type(getattr(h, "__self__", None)) in locks)

    return hooks, [h for h in hooks if needed(h)]


def main():
    ctl = socket.socket(fileno=3)
    cfg = json.loads(ctl.recv(1 << 20))
    C.filter = base64.b64decode(cfg["filter"])
    C.masked = cfg.get("masked", ())
    C.readonly = cfg.get("readonly", ())
    C.proc_masks, C.proc_readonly = _proc_plan()
    C.workspaces = cfg.get("workspaces")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        C.last_cap = int(f.read())
    if os.access(REAPER_PATH, os.X_OK):
        C.reaper = REAPER_PATH
        C.reaper_delay = float(cfg.get("reaper_delay", C.reaper_delay))
    spare_argv = [REAPER_PATH, "spare", None, None, None, C.filter.hex()] + C.reaper_spare + [
        str(C.last_cap), C.workspaces or ""]
    C.reaper_spare = spare_argv if C.reaper and cfg.get("reaper_spare") else None
    trampoline_error = ""
    if C.reaper and cfg.get("trampoline"):
        try:
            C.trampoline = _Trampoline(TRAMPOLINE_PATH, spare_argv)
        except (OSError, AttributeError) as e:
            trampoline_error = "%s: %s" % (type(e).__name__, e)
    if C.trampoline and cfg.get("huge_pages") and cfg.get("arenas", True):
        try:
            _arenas(C.trampoline.lib)
        except (OSError, AttributeError):
            pass
    # Built once here: a fork pays for every page it writes, and building
    # these in each child cost it milliseconds of copied pages.
    C.lockdown = _Lockdown()
    json.loads(b'{"warm": ["the parser, ahead"]}')
    errors = []
    spec = importlib.util.spec_from_file_location("sandloop_kernel", KERNEL_PATH)
    kmod = importlib.util.module_from_spec(spec)
    sys.modules["sandloop_kernel"] = kmod
    spec.loader.exec_module(kmod)
    # What kernel.py imports when it starts or runs its first cell.
    for name in ("faulthandler", "codeop", "warnings", "subprocess", "importlib.util"):
        importlib.import_module(name)
    for name in cfg.get("modules", ()):
        try:
            importlib.import_module(name)
        except BaseException as e:
            errors.append("import %s: %s: %s" % (name, type(e).__name__, e))
    if "matplotlib" in sys.modules:
        _warm_first_plot(kmod)
    C.numpy_state = _numpy_state()
    if _threads() != 1 or threading.active_count() != 1:
        errors.append("%d threads after the imports: fork would copy a process whose other threads are gone" % _threads())
    # Objects that exist now are never collected: the collector does not
    # walk (and so copy) their pages in every child.
    gc.collect()
    # (Found before the freeze: the collector's search skips frozen objects.)
    C.fork_hooks = _lock_hooks() if C.trampoline and cfg.get("trim_fork_hooks", True) else None
    gc.freeze()
    huge = _huge_pages(int(cfg.get("huge_pages_advice") or 25)) if cfg.get("huge_pages") else ""
    ctl.send(json.dumps({"ready": not errors, "errors": errors, "trampoline": trampoline_error, "huge_pages": huge}).encode())
    if errors:
        return
    self_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def reap(*_):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def make_spare_trampoline():
        """Makes a spare through the trampoline (see _Trampoline): its
        reaper is the small reaper from the start, its kernel the one copy
        of the template. Hands the host the spare's socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rk, kr = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # the reaper's end, the kernel's
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            pid = C.trampoline.fork([ctl.fileno(), ours.fileno(), self_pidns], theirs.fileno(), rk.fileno())
            if pid == 0:
                try:
                    # The kernel, PID 2 of the spare's namespaces, its
                    # parent the small reaper. The template's control
                    # socket and the host's end were closed before its
                    # fork: forget them without closing the numbers.
                    ctl.detach()
                    ours.detach()
                    rk.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _kernel(theirs, kr, kmod)
                finally:
                    os._exit(127)
            socket.send_fds(ctl, [json.dumps({"spare": pid}).encode()], [ours.fileno()])
        finally:
            for s in (ours, theirs, rk, kr):
                s.close()

    def make_spare():
        """Forks a spare child into a new PID namespace (as its PID 1)
        without leaving ours (unshare, fork, then back with setns) and
        hands the host its socket."""
        if _threads() != 1:
            raise RuntimeError("the template has started a thread")
        if C.trampoline:
            return make_spare_trampoline()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            _check(libc.unshare(CLONE_NEWPID), "unshare pid namespace")
            pid = _fork_bare()
            if pid == 0:
                try:
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    ctl.close()
                    ours.close()
                    os.close(self_pidns)
                    _spare(theirs, kmod)
                finally:
                    os._exit(125)
            _check(libc.setns(self_pidns, CLONE_NEWPID), "return to our pid namespace")
            socket.send_fds(ctl, [json.dumps({"spare": pid}).encode()], [ours.fileno()])
        finally:
            ours.close()
            theirs.close()

    def give_spare():
        try:
            make_spare()
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as e:
            ctl.send(json.dumps({"error": "spare child: %s: %s" % (type(e).__name__, e)}).encode())

    if C.trampoline and cfg.get("serve_in_c", True) and _threads() == 1 and threading.active_count() == 1:
        # The loop in C (sandloop_serve), which reaps the children itself;
        # its kernels skip the after-fork hooks that only reinitialize
        # threads and locks (see _lock_hooks), and put them back for their
        # own forks.
        found = C.fork_hooks
        if found:
            hooks, needed = found
            every = list(hooks)
            hooks[:] = needed
        fds = C.trampoline.serve(ctl.fileno(), self_pidns, max(1, int(cfg.get("spares", 1))))
        if fds is None:
            return
        try:
            if found:
                hooks[:] = every
                # Of threading's skipped hook, what differs in a kernel:
                # its main thread's native id (the template's otherwise).
                getattr(threading.main_thread(), "_set_native_id", lambda: None)()
            # The kernel, PID 2 of its spare's namespaces, its parent the
            # small reaper. The template's control socket was closed
            # before its fork: forget it without closing the number.
            ctl.detach()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _kernel(socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]), kmod)
        finally:
            os._exit(127)
    # Children are reaped as they end (a zombie would keep its session's
    # cgroup from being removed).
    signal.signal(signal.SIGCHLD, reap)
    for _ in range(max(1, int(cfg.get("spares", 1)))):
        give_spare()
    while True:
        if not ctl.recv(64):
            return
        give_spare()


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    os._exit(0)
