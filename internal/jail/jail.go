// Package jail starts one process isolated from the host: namespaces, a mount
// tree built from scratch, seccomp, cgroups (v1 and v2), rlimits, a wall-clock
// timeout and bounded output capture.
//
// It also makes the workspaces jails mount (NewQuotaDir): as root each is a
// tmpfs capped in bytes and in inodes, so every write from inside a jail
// (cold, pooled or forked by a zygote, which clones the same mount) past
// the quota fails with ENOSPC and none reaches the host's disk, while the
// workspace stays a host directory that the files API, archives and --out
// read through paths and os.Root. tmpfs rather than a project quota or a
// loop-mounted image because it needs no prepared host filesystem and no
// loop device; its pages are charged to the writer's memory cgroup, so the
// quota counts against the session's memory limit. Without root (no mount
// in the host's namespace) the same capped tmpfs is made in a user
// namespace of a helper's and held by a descriptor: the workspace's path
// is then a directory under /proc/self/fd/ and each jail attaches a clone
// of it (quota_userns_linux.go says why this design). Only where neither
// works is the directory ordinary, with uploads alone capped. The details
// are in quota.go.
//
// It pauses a jail too (Process.Freeze and Thaw, Group's for a zygote's
// sessions): every process stops where it is and uses no CPU, by the
// cgroup v2 freezer (cgroup.freeze), the v1 freezer hierarchy where it is
// mounted and writable, or else SIGSTOP and SIGCONT of each process of
// the jail (FreezeMethod; `doctor` says which). Killing a frozen jail
// thaws it, since a task the v1 freezer holds dies of SIGKILL only once
// thawed; freeze_linux.go has the details.
package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Inside the jail the sandboxed program runs as this user.
const (
	SandboxUID  = 1000
	SandboxGID  = 1000
	SandboxUser = "sandbox"
	// WorkspaceDir is where the host workspace is mounted; it is the
	// working directory and HOME.
	WorkspaceDir = "/workspace"
	// HomeDir is the workspace under E2B's name for it: a link to
	// WorkspaceDir in every jail's root.
	HomeDir = "/home/user"
	// ZygoteWorkspacesDir is where a zygote's jail sees
	// Config.ZygoteWorkspaces.
	ZygoteWorkspacesDir = "/opt/sandloop/workspaces"
	// ToolsDir, last on every jail's PATH, holds the commands E2B's
	// images have that a Debian root may lack: `python` (Debian's
	// python-is-python3: a link to /usr/bin/python3) and `pip` (python3
	// -m pip). Anything earlier on PATH of those names wins: a
	// template's environment, the host's /usr/bin/pip.
	ToolsDir = "/opt/sandloop/bin"
)

// HostID is the host uid and gid the sandbox user maps to when the server
// runs as root: nobody, which owns nothing on the host. (Without root, the
// sandbox user maps to the server's own user.) Distinct jails sharing it
// cannot reach each other: each has its own PID, mount, network and IPC
// namespaces, and RLIMIT_NPROC is counted per user namespace.
var HostID = 65534

// initThreads is the room kept above Limits.Pids for the jail's init, whose
// Go runtime runs 7 to 12 threads (10 to 12 where warmThreads made them
// ahead) as the program's user, in the program's group. Too little room
// would fail the init, not the program.
const initThreads = 16

// DefaultPython is the interpreter used inside the jail.
const DefaultPython = "/usr/bin/python3"

// LiveUsage is what a jail (or a zygote session's group) uses at a moment.
type LiveUsage struct {
	CPU    time.Duration // CPU time since it started, every process's
	Memory int64         // bytes charged to it, page cache included
	Cache  int64         // the page cache's part of Memory
}

// ErrNoGroup: no cgroup measures the jail (its limits are rlimits).
var ErrNoGroup = errors.New("no cgroup measures this sandbox (its limits are rlimits): usage is not known")

// Limits bound what the jailed process tree may use. Zero values mean the
// documented default; a negative value means "no limit" where that is allowed.
type Limits struct {
	// Memory in bytes, swap included. If zero, 512 MiB.
	Memory int64
	// CPUs is the CPU quota in cores (0.5 = half a core). If zero, 1.
	CPUs float64
	// Pids is the maximum number of the program's processes and threads
	// (the jail's own init is not counted: it
	// gets room for its threads on top). If zero, 256.
	Pids int
	// Timeout is the wall-clock limit; the whole group is killed when it
	// passes. If zero, no timeout (the caller's context still applies).
	Timeout time.Duration
	// TmpSize caps /tmp and /dev/shm (each) in bytes. If zero, 256 MiB.
	TmpSize int64
	// FileSize caps the size of any one file written (RLIMIT_FSIZE). If zero, 1 GiB.
	FileSize int64
	// NoFile caps open descriptors (RLIMIT_NOFILE). If zero, 1024.
	NoFile int
	// Stack caps the main thread's stack (RLIMIT_STACK). If zero, 8 MiB.
	Stack int64
	// Disk caps the bytes a workspace made by NewQuotaDir holds (Start
	// does not make workspaces: their owner does). If zero, 256 MiB: room
	// for data sets, figures and models of a data-science session, while
	// the pages (memory-backed, charged to the writer's memory cgroup)
	// still fit beside Python in the default 512 MiB memory limit; with a
	// smaller Memory, half of it. A Disk above Memory is refused by the
	// callers that make workspaces (DiskFits).
	Disk int64
	// Files caps the files, directories and symlinks such a workspace
	// holds (inodes). If zero, 20,000: a checked-out project or a
	// directory of per-day CSVs fits; a runaway loop is stopped long
	// before the inodes' kernel memory matters.
	Files int
}

// The workspace quota's defaults (see Limits.Disk and Limits.Files).
const (
	DefaultDisk  = 256 << 20
	DefaultFiles = 20000
)

// Network selects what network the jail sees.
type Network string

const (
	// NetworkNone gives the jail its own network namespace with only
	// loopback up: servers started inside can be reached from inside, and
	// nothing leaves the jail. This is the default.
	NetworkNone Network = "none"
	// NetworkHost shares the host's network namespace. Only for trusted
	// code that must reach a package index.
	NetworkHost Network = "host"
)

// File is a file placed into the jail's read-only root before the program
// starts (for example the kernel's own source).
type File struct {
	Path string // absolute path inside the jail, not under /workspace, /tmp, /dev or /proc
	Data []byte
	Mode os.FileMode // if zero, 0644
}

// Config describes one jailed process.
type Config struct {
	// Path is the program to run, as seen inside the jail.
	Path string
	// Args are the program's arguments, argv[0] included. If empty, [Path].
	Args []string
	// Env is the complete environment given to the program, on top of a
	// minimal base (PATH, HOME, USER, LANG, TMPDIR). The server's own
	// environment is never passed.
	Env []string
	// Workspace is a host directory mounted read-write at /workspace. It
	// must exist (and may not be empty: never the current directory). The
	// jail makes it writable by the sandbox user.
	Workspace string
	// Dir is the working directory inside the jail. If empty, /workspace.
	Dir string
	// Limits bounds resource use.
	Limits Limits
	// Network selects the network. If empty, NetworkNone.
	Network Network
	// Files are placed into the jail's root (read-only) before start.
	Files []File
	// ListenPort, if nonzero, has the jail's init open a TCP listener on
	// 127.0.0.1:ListenPort in the jail's own network namespace before the
	// program starts and hand it to the host (Process.Listener): code in
	// the jail connects to it as to any local server, only the host
	// accepts, and the jail keeps no route out (package egress serves its
	// proxy this way). Not with NetworkHost.
	ListenPort int

	// Stdin, Stdout and Stderr are connected to the program's standard
	// descriptors. Nil means /dev/null for Stdin and discard for the
	// others. They always go through pipes, even for an *os.File, so the
	// jail is never handed a terminal (TIOCSTI) or one of the server's files.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Terminal, if set, runs the program on a pseudo-terminal of this
	// size instead (an interactive shell, a REPL): its controlling
	// terminal, standard input, output and error. Stdin is typed into it
	// and Stdout gets what it displays (echo, stdout and stderr as one
	// stream); Stderr is not used. The host makes a new pair for each jail,
	// so no terminal of the host's reaches it, and the filter still
	// refuses the ioctls that inject input (TIOCSTI, TIOCLINUX) or change
	// the line discipline (TIOCSETD). Process.Resize changes the size.
	Terminal *WindowSize
	// ExtraFiles are handed to the program as descriptors 3, 4, ... and are
	// the only descriptors of the server it receives.
	ExtraFiles []*os.File
	// Spawn, if set, starts the jail's init instead of this process (a
	// keeper, so that the jail outlives this process: handoff_linux.go).
	// The init's stdin, stdout and stderr must then be files or nil.
	Spawn SpawnFunc

	// Zygote starts a template process that builds a jail of its own for
	// each child it forks (package zygote). The program keeps
	// CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SETPCAP and CAP_DAC_OVERRIDE in
	// the jail's user namespace (no capability on the host) and runs
	// without the seccomp filter, which each child installs for itself;
	// no_new_privs is still set. The init keeps reaping after the program
	// ends until every process of the jail has ended, so the children
	// outlive the program. Never set it for a process that runs user code.
	Zygote bool
	// ZygoteWorkspaces, with Zygote, is a host directory bound (not
	// recursively; nosuid, nodev) at ZygoteWorkspacesDir in the jail: the
	// directory under which the workspaces of the sessions it forks are.
	// Without root, the host cannot clone a workspace's mount for the
	// template (open_tree needs CAP_SYS_ADMIN over the host's mount
	// namespace); the template, which holds it over its own, clones the
	// workspace from this view instead.
	ZygoteWorkspaces string
	// Join, if set, starts the program inside that running jail instead of
	// a new one (see join_linux.go): in its user, mount, PID, network,
	// IPC, UTS and cgroup namespaces, under its root, in its cgroup, with
	// the same filter, no capability and the rlimits the jail's program
	// has, as the sandbox user. It shares the jail's /tmp,
	// loopback, processes and egress path with the program there. The
	// program leads a process group of its own, which Kill kills; what it
	// leaves running when it ends (`nohup server &`) is reaped by the
	// jail's PID 1 and lives until that jail ends. Workspace, Network,
	// Files, ListenPort, ExtraFiles, Mounts and Zygote do not apply (the
	// jail has its own), nor Limits but for Timeout: the jail's limits
	// hold, its cgroup's shared with everything in it.
	Join *JoinTarget

	// Mounts are host directories bound into the jail's root (a template's
	// environment, package template). Read-only unless Writable; always
	// nosuid and nodev. Each Path is under /opt (see Mount), but for one
	// Root mount, whose system directories replace the host's.
	Mounts []Mount
}

// MountsDir is the only directory under which Config.Mounts may be placed:
// nothing of the jail's own (system directories, /etc, /dev, /proc, /tmp,
// the workspace) can be covered by one.
const MountsDir = "/opt"

// Mount is a host directory bound into a jail.
type Mount struct {
	// Host is the directory on the host. As root the host clones its
	// mount (open_tree), so the jail's user need not traverse its parents.
	Host string
	// Path is where it appears in the jail: absolute, clean, under
	// MountsDir and not under /opt/sandloop/workspaces.
	Path string
	// Writable leaves it writable (a template being built); otherwise it
	// is read-only.
	Writable bool
	// Root makes Host the jail's system root instead of the host's (an
	// image template): /usr, /bin, /lib*, /sbin come from it, read-only,
	// nosuid and nodev, and the /etc files the jail copies (the dynamic
	// linker's cache, time zone, certificates, python3's) are read from
	// its /etc, every path resolved as if Host were "/" (RESOLVE_IN_ROOT),
	// so none of its symbolic links leads the jail's init to a host file.
	// The jail's own parts are unchanged: a tmpfs root remounted
	// read-only, generated passwd and hosts, its /dev, /proc, /tmp and
	// workspace. Path must be "/", it may not be Writable, and a jail has
	// at most one.
	Root bool
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Cols, Rows int
}

// MaxWindowSide is the largest number of columns or rows a terminal may have.
const MaxWindowSide = 4096

func (ws WindowSize) validate() error {
	if ws.Cols < 1 || ws.Rows < 1 || ws.Cols > MaxWindowSide || ws.Rows > MaxWindowSide {
		return &ArgumentError{"terminal size", fmt.Errorf("%d columns by %d rows: each must be 1-%d", ws.Cols, ws.Rows, MaxWindowSide)}
	}
	return nil
}

// Result describes how a jailed process ended and what it used.
type Result struct {
	// ExitCode is the program's exit status, or 128+signal if a signal killed it.
	ExitCode int
	// Signal is the signal that ended the program, if any.
	Signal string `json:",omitempty"`
	// TimedOut reports that the wall-clock timeout killed the group.
	TimedOut bool
	// OOMKilled reports that the kernel's OOM killer fired in the group.
	OOMKilled bool
	// Unreported: a joined program's end was never reported (the process
	// that waits for it in the jail ended first); taken as SIGKILL.
	Unreported bool `json:",omitempty"`
	// Duration is the wall-clock time from start to end.
	Duration time.Duration
	// CPUTime is user+system CPU time of the whole group.
	CPUTime time.Duration
	// MemoryPeak is the peak memory of the group in bytes (from the
	// cgroup; from the largest RSS where no memory cgroup is available).
	MemoryPeak int64
	// Enforcement says how limits were enforced: "cgroup v1", "cgroup v2"
	// or "rlimits".
	Enforcement string
	// Warnings lists degraded protections (for example no cgroups delegated).
	Warnings []string `json:",omitempty"`
}

// RlimitsWarning is Result.Warnings' line where no cgroup is usable and
// limits fall back to rlimits: RLIMIT_DATA for memory, RLIMIT_NPROC for
// processes, no CPU limit, peak memory from the largest RSS, OOM kills not
// told apart from other SIGKILLs.
const RlimitsWarning = "no cgroups: memory and process limits are rlimits, CPU is not limited (`sandloop doctor` says why)"

// Errors callers may branch on.
var (
	// ErrUnsupported means a safe jail cannot be built on this host.
	ErrUnsupported = errors.New("jail: not supported on this host")
)

// ArgumentError reports a bad Config field.
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return "jail: invalid " + e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// WithDefaults returns l with every zero field set to its documented default.
func (l Limits) WithDefaults() Limits {
	if l.Memory == 0 {
		l.Memory = 512 << 20
	}
	if l.CPUs == 0 {
		l.CPUs = 1
	}
	if l.Pids == 0 {
		l.Pids = 256
	}
	if l.TmpSize == 0 {
		l.TmpSize = 256 << 20
	}
	if l.FileSize == 0 {
		l.FileSize = 1 << 30
	}
	if l.NoFile == 0 {
		l.NoFile = 1024
	}
	if l.Stack == 0 {
		l.Stack = 8 << 20
	}
	if l.Disk == 0 {
		l.Disk = DefaultDisk
		if l.Disk > l.Memory/2 {
			l.Disk = l.Memory / 2 &^ (1<<20 - 1)
		}
	}
	if l.Files == 0 {
		l.Files = DefaultFiles
	}
	return l
}

func (l Limits) validate() error {
	switch {
	case l.Memory < 16<<20:
		return &ArgumentError{"memory limit", fmt.Errorf("%d bytes is below the 16 MiB minimum", l.Memory)}
	case l.CPUs < 0.01:
		return &ArgumentError{"cpus", fmt.Errorf("%g is below 0.01", l.CPUs)}
	case l.Pids < 8:
		return &ArgumentError{"pids limit", fmt.Errorf("%d is below the minimum of 8", l.Pids)}
	case l.Timeout < 0:
		return &ArgumentError{"timeout", errors.New("must not be negative")}
	case l.TmpSize < 1<<20:
		return &ArgumentError{"tmp size", errors.New("must be at least 1 MiB")}
	case l.NoFile < 16:
		return &ArgumentError{"open files limit", errors.New("must be at least 16")}
	}
	return l.validateQuota()
}

// DiskFits reports, as a *DiskOverMemoryError, a workspace quota (Disk)
// above the memory limit (both as given: call it on WithDefaults' result).
func (l Limits) DiskFits() error {
	if l.Disk > l.Memory {
		return &DiskOverMemoryError{Disk: l.Disk, Memory: l.Memory}
	}
	return nil
}

// DiskOverMemoryError is a workspace quota above the memory limit. The
// workspace is a tmpfs whose pages count toward the session's memory, so
// filling such a workspace would end the session out of memory instead
// of failing the write with ENOSPC.
type DiskOverMemoryError struct{ Disk, Memory int64 }

// DiskOverMemoryWhy says why a disk quota above the memory limit is
// refused, for messages that name the limits as their interface does.
const DiskOverMemoryWhy = "the workspace is held in memory and counts toward the memory limit, so filling it would kill the sandbox (out of memory) instead of failing the write with ENOSPC"

func (e *DiskOverMemoryError) Error() string {
	return fmt.Sprintf("a workspace quota of %d MiB is more than the memory limit of %d MiB: %s; ask for less disk or more memory", e.Disk>>20, e.Memory>>20, DiskOverMemoryWhy)
}

func (l Limits) validateQuota() error {
	switch {
	case l.Disk != 0 && l.Disk < 1<<20:
		return &ArgumentError{"disk limit", errors.New("must be at least 1 MiB")}
	case l.Files != 0 && l.Files < 16:
		return &ArgumentError{"files limit", errors.New("must be at least 16")}
	}
	return nil
}
