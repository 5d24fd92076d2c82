// Package zygote starts sessions' kernels in milliseconds by forking a
// template kernel that has already imported the heavy modules.
//
// The template (zygote.py, embedded) runs in a jail of its own started with
// jail.Config.Zygote: it keeps CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_SETPCAP
// in that jail's user namespace (none on the host) and has no seccomp
// filter, because it builds a jail for each child and never runs user
// code. It keeps spare children forked ahead of any request (Options.Spares),
// each prepared and armed before a session exists:
//
//   - the spare's reaper unshares new mount, PID (it is PID 1, a reaper as
//     a cold jail's init is), network, IPC and UTS namespaces, mounts a
//     fresh /proc (with the jail's masks), a /tmp and /dev/shm of its own,
//     brings up loopback, empties its bounding and ambient capability sets,
//     locks the securebits, sets no_new_privs and forks the kernel (PID 2);
//   - the host learns both PIDs from SO_PASSCRED on a socket only that
//     spare holds, moves both into a new cgroup (memory, pids and CPU
//     limits), and only then lets them arm: each unshares its cgroup
//     namespace; the kernel drops every capability and loads the jail's
//     own seccomp filter (jail.SeccompFilter).
//
// A session takes an armed spare: its cgroup gets the session's limits, the
// reaper sizes /tmp and /dev/shm, attaches the session's workspace (a
// detached mount the host hands over, so no other workspace is ever
// reachable from the template; without root, a clone from the template's
// view of the temporary directory, which it detaches, where the jail
// package's holder mounted the workspace on kernels before 6.15), hands the kernel its pipes, sets the
// rlimits and drops its own capabilities and loads the filter; the kernel
// sets its rlimits and environment and runs kernel.py. The fork returns
// when both have said so, before any user code is sent. The template forks
// the next spare RefillDelay later, so that the fork does not compete with
// the new session for the CPU.
//
// What forked sessions share, and what they do not:
//   - Memory pages of the template (the interpreter, the imported modules)
//     are shared copy-on-write: a write in one session copies the page for
//     that session alone; no session sees another's writes. Pages the
//     template touched are charged to the template's cgroup, not to the
//     sessions' (a session's memory limit counts what it copies or
//     allocates).
//   - The address-space layout is shared: every fork has the template's
//     ASLR offsets, stack canary and Python hash seed (hash randomization),
//     so one session learns its siblings' layout. They still cannot reach
//     each other's memory (separate processes, PID namespaces, ptrace and
//     process_vm_* refused). Random generators are reseeded in each fork
//     (Python's random module itself; numpy's global one by the zygote).
//   - Not shared: PID, mount, network, IPC, UTS and cgroup namespaces,
//     /proc, /tmp, /dev/shm, the workspace, the cgroup and its limits,
//     rlimits, environment, descriptors.
//   - All forks and the template share one user namespace (the sandbox
//     user maps to the same host uid, as cold jails do), so RLIMIT_NPROC
//     cannot bound one session: the zygote requires cgroups.
//   - BLAS libraries run single-threaded in forks (the template must have
//     no threads when it forks).
//
// Without root the same design runs unchanged but for the workspace: the
// template's jail is a user namespace the unprivileged user made, and the
// template's CAP_SYS_ADMIN there covers its own mount namespace and the
// spares' (new mount namespaces, /proc, tmpfs, open_tree and move_mount
// all work), but not the host's. The one layer that cannot be had without
// root is the host's open_tree(OPEN_TREE_CLONE) of a session's workspace:
// it needs CAP_SYS_ADMIN over the host's mount namespace (EPERM), and a
// template cannot bind a directory the host passes by descriptor either
// (mount --bind and open_tree of a path in another mount namespace fail
// with EINVAL, on 6.1 as on 6.18: check_mnt). So without root the template's jail
// also binds the host's temporary directory (where sessions' workspaces
// are made; not recursively) at jail.ZygoteWorkspacesDir; the host sends
// the workspace's path under it and an O_PATH descriptor of it; the
// spare's reaper clones that path with open_tree, checks the clone is the
// directory the host opened (device and inode), and detaches the whole
// view before its kernel runs any code. The template (which never runs
// user code) can reach every workspace in that directory; a session never
// can. A workspace outside it cannot be forked for: Launcher returns nil
// and the session starts cold. Cgroups are needed as with root, so
// without root the user needs a delegated cgroup (systemd's user@UID
// service, a Delegate=yes scope); where there is none, Supported says so
// and sessions start cold with rlimits (the jail's one-line warning).
//
// If the template dies it is started again at the next fork (and at once
// in the background); sessions already forked live on. Closing the Zygote
// kills every session it forked.
package zygote

import (
	_ "embed"
	"log/slog"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// Source is zygote.py, the template program.
//
//go:embed zygote.py
var Source []byte

// Paths inside the template's jail (read-only).
const (
	ZygotePath = "/opt/sandloop/zygote.py"
	KernelPath = "/opt/sandloop/kernel.py" // where kernel.py is; forks run it from memory
)

// DefaultModules are imported by the template when Options.Modules is nil.
var DefaultModules = []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot", "matplotlib.backends.backend_agg"}

// Options configure a Zygote. The zero value is ready to use.
type Options struct {
	// Modules are imported by the template. If nil, DefaultModules.
	Modules []string
	// Env is the template's environment while it imports (on top of the
	// jail's minimal one): give it what kernels get (session.KernelEnv),
	// since modules read some variables at import time. Each fork's
	// environment is replaced by the one its launcher was given.
	Env []string
	// Limits bound the template's own jail. If zero, 2 GiB of memory, 64
	// processes, 1 CPU.
	Limits jail.Limits
	// Spares is how many children the template keeps forked, prepared and
	// armed ahead of requests (each holds a reaper and an idle kernel,
	// ~5 MiB of private memory). If zero, 1.
	Spares int
	// RefillDelay is how long after a spare is taken the template is asked
	// for the next one, so that forking it does not compete with the new
	// session's first moments for the CPU. A fork that finds no spare asks
	// at once. If zero, 200 ms; negative: at once.
	RefillDelay time.Duration
	// Python is the template's interpreter (a template environment's, see
	// package template). If empty, jail.DefaultPython.
	Python string
	// Mounts are bound into the template's jail (read-only), and so into
	// every fork's.
	Mounts []jail.Mount
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}
