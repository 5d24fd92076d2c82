// Package zygote starts sessions' kernels in milliseconds by forking a
// template kernel that has already imported the heavy modules.
//
// The template (zygote.py, embedded) runs in a jail of its own started with
// jail.Config.Zygote: it keeps CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_SETPCAP
// in that jail's user namespace (none on the host) and has no seccomp
// filter, because it builds a jail for each child and never runs user
// code. For each session it forks a child that unshares new mount, PID,
// network, IPC, UTS and cgroup namespaces, becomes PID 1 of its own PID
// namespace (a reaper, as a cold jail's init is), mounts a fresh /proc
// (with the jail's masks), a size-capped /tmp and /dev/shm and the
// session's workspace (a detached mount the host hands over, so no other
// workspace is ever reachable from the template), brings up loopback, sets
// the rlimits, drops every capability, sets no_new_privs and installs the
// jail's own seccomp filter (jail.SeccompFilter), then forks the kernel as
// PID 2. The host moves the child into the session's own cgroup (memory,
// pids and CPU limits) before it does anything else, learning its PID from
// SO_PASSCRED on a socket only that child holds.
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
// If the template dies it is started again at the next fork (and at once
// in the background); sessions already forked live on. Closing the Zygote
// kills every session it forked.
package zygote

import (
	_ "embed"
	"log/slog"

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
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}
