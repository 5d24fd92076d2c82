// Package kernel runs Python cells like a notebook: kernel.py (embedded)
// and the Go side of its protocol — execute, interrupt, events,
// checkpoints and the export of a kernel's variables.
//
// # Checkpoints
//
// A checkpoint is a dormant fork of the kernel process, inside the
// session's own jail. Checkpoint asks kernel.py to fork: the child keeps the
// parent's memory copy-on-write and blocks on a socket of its own (it never
// reads the request pipe); the parent answers and goes on. The child is in
// the session's cgroup, so the memory it holds is charged to the session:
// at first almost nothing (the page tables), then every page the live
// kernel writes after the checkpoint, which the checkpoint keeps the old
// copy of (CheckpointMemory measures it: the Private_Clean and
// Private_Dirty of its smaps_rollup).
//
// Restore to N: the live kernel sends N's process a wake message carrying
// its checkpoint table (with its ends of every checkpoint's socket, so the
// woken kernel can restore checkpoints taken after its own), and any request
// bytes it had read ahead. N forks a fresh dormant copy of itself, so the
// checkpoint can be restored again, and becomes the live kernel; the old
// live kernel points its pipes at /dev/null (its threads may run until it
// exits; nothing they write reaches the host), tells N so, and exits. Then
// N answers on the same event pipe, with its own execution count, which
// Kernel takes over.
//
// The host signals and waits for one process, the kernel's first (PID 2
// of a zygote-forked session; the program of a cold jail, which the init
// forwards signals to): it must live as long as the session. So at the
// first restore that process does not exit: it becomes the anchor, a tiny
// `python3 -I -S` program (a few MiB) and a child subreaper, to which every
// orphaned kernel process comes. The anchor forwards SIGINT (and the other
// signals the init forwards) to the live kernel, whose pid each new live
// kernel writes to a control pipe, reaps orphans, and when the live kernel
// dies exits with its status, a signal death as the same signal. So an
// interrupt, a timeout kill, an OOM kill or a segfault of a restored kernel
// ends the execution and the session exactly as before.
//
// Carried: everything the process holds — variables, imported modules,
// the random module's and numpy's generator states (the random module's
// reseeding in a forked child is undone), the execution count, the current
// directory, os.environ, open files' descriptors (their file offsets are
// shared with the live kernel, as fork shares them). Not carried, and
// reported by CheckpointInfo: threads other than the main one (fork copies
// one thread: a restored kernel has none of them; their Thread objects say
// not alive) and child processes and background servers (they keep running
// after a restore; they are not rolled back, and are no longer the restored
// kernel's children). Sockets are shared, not copied: a connection opened
// before the checkpoint is the same connection after a restore. Files in
// the workspace are not part of a kernel checkpoint (the session copies
// them; see internal/workspace).
//
// A checkpoint whose process died (the OOM killer may pick it: it is in the
// session's cgroup; so can user code, which may kill any process of its
// session) is reported as gone (ErrCheckpointGone) and stays listed until
// dropped; it is never half restored. A kernel keeps at most 200
// checkpoints (one descriptor each in a wake message).
//
// Costs (BenchmarkCheckpointDataFrame, 100 MB DataFrame): a checkpoint is
// one fork, a few milliseconds (the page tables of the kernel's memory are
// copied); a restore is one fork (the fresh dormant copy) and two process
// hand-offs; both are 20-30 times faster than rebuilding the DataFrame.
// The first restore also execs the anchor (about 15 ms of CPU, off the
// critical path).
//
// Why not CRIU: it would checkpoint the whole process tree to files, and
// restore into new namespaces, but Debian 12's CRIU (3.17) does not start on
// recent kernels (`criu check`: "Unexpected rt vDSO area bounds" on 6.18),
// needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) that the jail gives no
// process, and copies the memory out instead of sharing it copy-on-write.
// A fork needs no privilege and no system call the jail's seccomp filter
// refuses (fork/clone without namespace flags, pipe2, socketpair, execve
// and prctl(PR_SET_CHILD_SUBREAPER) are allowed), takes milliseconds, and
// shares every unchanged page. Its limit is that it stays inside the
// process: threads, children and the kernel's outside connections are not
// part of it, and it cannot move to another host or survive the session.
//
// # State export
//
// ExportState streams the user's variables (the __main__ namespace) for a
// new session: a forked copy of the live kernel (or of a checkpoint's
// process) serializes them, so the live kernel stalls only for the fork,
// and the bytes come back as base64 chunks on the event pipe, written to
// the caller's io.Writer as they arrive (bounded memory here). Each
// variable is serialized on its own, with dill where it is installed
// (Debian's python3-dill: lambdas, classes and functions defined in cells)
// and pickle otherwise; modules are saved by name and imported again. A
// variable that does not serialize is listed in the manifest with the
// reason (an open socket: "cannot pickle 'socket' object"); the others are
// saved. Two names for one object come back as two copies. The kernel's
// own builtins (display, the input stub) are not in __main__ and are left
// alone. ImportState loads a stream into another kernel, reseeds the random
// module and numpy's global generator (a copy must not repeat its source's
// draws; generator objects held in variables are copied as they are, and
// uuid4 draws from os.urandom in every copy), and sets the execution count
// to the exported one.
package kernel
