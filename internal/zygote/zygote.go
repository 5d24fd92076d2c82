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
//   - the spare's reaper is made in new PID, mount, network, IPC and UTS
//     namespaces (it is PID 1, a reaper as a cold jail's init is) and
//     forks the kernel (PID 2) into them; then it mounts a fresh /proc
//     (with the jail's masks), a /tmp and /dev/shm of their own, and
//     brings up loopback, while the kernel waits; each of the two empties
//     its bounding and ambient capability sets, locks the securebits and
//     sets no_new_privs before it reports. Where `go generate` built the
//     trampoline (reaperexe/trampoline.c, loaded into the template) the
//     reaper shares the template's memory until it forks the kernel, then
//     executes the small reaper (reaper.c's "spare" mode): one copy of the
//     template per spare. Without it, the reaper is a fork of the
//     template that forks the kernel: two copies (see "What is left");
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
// when both have said so, before any user code is sent. While forks wait
// for spares the template is asked at once for as many as wait (at most
// Options.Parallel in the making: the children prepare themselves in
// parallel); when nobody waits, RefillDelay later, so that the fork does
// not compete with the new session for the CPU. How many spares are kept
// ready follows the arrival rate (refill), within Options.MaxSpares (serve
// sets it from --spare-memory: at most half of it, up to 16). Bursts that
// repeat are served one level up: the session manager's warm pool of
// started kernels remembers the largest burst of creates of the last
// minutes and keeps that many forked ahead, within the rest of
// --spare-memory and the free session slots (PoolPeakHold and PoolMemory
// in session.ManagerOptions); the spares only feed it.
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
// Where the time goes (issue 26). BenchmarkBurst100 (client) sends 100
// creates + `1+1` at once to a real host with the zygote and a pool of 2.
// On the 2-core development machine, shared with five other engineers'
// builds (load 10-15), in four runs: the pipeline before issue 26
// (Options.Fixed, session.ManagerOptions.FixedPool) answered at p50
// 11.2-12.1 s, p95 21.6-24.0 s, last 22.5-25.1 s (4.0-4.4 sessions/s),
// the CPUs mostly idle for it: each waiting fork waited for a "more" sent
// RefillDelay after the previous take. The current pipeline, in the same
// runs: p50 0.8-2.2 s, p95 2.1-4.4 s, last 2.2-4.5 s (22-46 sessions/s),
// 100/100 each time. BenchmarkSparesPerSecond (40 forks at once from the
// pandas template): 3.9-4.2 sessions/s before, 17-56 now.
//
// Where a spare's CPU goes. perf, recording the whole machine while 30
// spares were made one after another, each taken by a session that ran
// `1+1`, its samples split by process (template, reaper, kernel) and by
// what they were in; the code before and after the changes below, run in
// turn in one script (load 13-16, 2999 samples/s):
//
//	                           before             after
//	python3, per spare         24.4 ms            20.2 ms
//	  fork (copy_process)       9.6 ms  39.5%      8.5 ms  42.0%
//	  page faults               7.4 ms  30.5%      5.6 ms  27.7%
//	  interpreter, libraries    4.3 ms  17.7%      3.2 ms  15.7%
//	  other system calls        1.2 ms   5.0%      1.1 ms   5.4%
//	  namespaces (unshare)      0.8 ms   3.3%      0.8 ms   3.8%
//	  mounts                    0.6 ms   2.6%      0.5 ms   2.5%
//	  seccomp, prctl, capset    0.4 ms   1.5%      0.6 ms   2.8%
//	minor faults per spare     1885               1310
//	  template / reaper / kernel  145 / 910 / 830    130 / 590 / 755
//
// A second pair of runs (load 12-20, the final code): 32.5 ms before,
// 23.5 ms after, in the same proportions; the fault counts are steady from
// run to run (1870-1890 before, 1310-1350 after), the milliseconds follow
// the machine's load. The Go host adds ~3 ms per spare (pprof during a burst: arm's cgroup
// mkdirs and writes in four v1 hierarchies, the socket messages, JSON).
// What changed: the reaper forks its kernel as soon as their namespaces
// exist, before it runs anything else (a page either writes is copied
// once, for the one that writes it, not first for the reaper and again for
// the kernel); the template forks the reaper without the interpreter's
// after-fork hooks (threading's bookkeeping, random's reseed, logging's
// and matplotlib's: the reaper never runs user code or those modules); a
// fork reseeds numpy's global generator by writing its MT19937 key (the
// template checks the address once against numpy's own view) rather than
// through numpy's seeding (~70 pages); the lockdown's objects and
// cap_last_cap are made once in the template.
//
// What is left, and what it would take:
//   - The forks: the template's page tables (15.6k pages of anonymous
//     memory, 62 MiB, in 643 mappings) were copied twice per spare, ~4.3
//     ms each (copy_page_range is three quarters of it; per-mapping work
//     the rest): once for the reaper, a fork of the template, and again
//     for the kernel, a fork of the reaper. Now once: the trampoline
//     (reaperexe/trampoline.c, a shared object `go generate` builds and
//     the template loads with ctypes.PyDLL) clone()s the reaper with
//     CLONE_VM|CLONE_VFORK and the spare's namespaces: it shares the
//     template's memory while the template waits, forks the kernel with
//     glibc's _Fork (the one copy; the kernel longjmps back into the
//     trampoline's C function and returns to Python as from os.fork, the
//     interpreter's fork hooks run as os.fork runs them) and executes the
//     small reaper in its "spare" mode (mounts, the armed handshake, the
//     session's workspace, its lockdown, reaping), so the reaper never
//     runs Python. BenchmarkSpareReaper (pandas template, 20 spares of
//     each made one after another, CPU from schedstat, load 12-15): per
//     spare until armed 9.3 ms of CPU through the trampoline (template
//     1.7, reaper 4.8 of which the kernel's copy, kernel 2.7) against
//     15.6 ms with the Python reaper (5.0 + 8.0 + 2.6), 664 minor faults
//     against 1019 (the reaper's 31 against 427). BenchmarkSparesPerSecond
//     (a burst of 40, in the same run, three bursts of each, load 12-15):
//     python3 CPU per session (template, reaper, kernel) 12.4-15.1 ms
//     against 17.4-21.4, 931-954 minor faults against 1498-1531, 22.7-38.3
//     sessions/s against 16.2-18.0. The reaper is the small
//     reaper from the start, so it never holds a copy of the template: a
//     spare not taken yet costs its pages no more (see "Memory"). The
//     earlier attempt, executing the small reaper from the reaper as it
//     was (a copy) right after it forked the kernel (Options.earlyReaper,
//     kept for comparison), costs more than it saves (18.5 ms, 937 faults
//     in the run above): the execve unmaps the fresh copy. The old way
//     remains where the trampoline was not generated or the template's
//     libc cannot load it (glibc 2.35 or later; the host's log says so).
//     What it relies on (trampoline.c): that glibc's _Fork writes nothing
//     in the parent it does not restore (true of 2.36, and of 2.41's
//     abort lock), a longjmp that does not check stacks (built without
//     _FORTIFY_SOURCE) and no shadow stack in the template (glibc enables
//     none before 2.39, and only for programs built for it).
//   - Huge pages (done, the default): after its warm-up, before its
//     first spare, the template collapses its anonymous memory ([heap]
//     and anonymous private mappings) into 2 MiB pages with MADV_COLLAPSE
//     (zygote.py's _huge_pages; Linux 6.1), so the kernel's fork copies
//     one page-table entry per 2 MiB rather than 512, and its exit drops
//     one. The heap alone gives 15-17 ranges of 2 MiB: ~14 MiB of the
//     template's objects lie in Python's 1 MiB arenas, each a mapping of
//     its own between the libraries' (too small for a 2 MiB page). So,
//     where the trampoline is loaded, the template takes its arenas from
//     one 2 MiB-aligned reservation (trampoline.c's sandloop_arenas,
//     installed with PyObject_SetArenaAllocator before the imports; made
//     readable and writable 2 MiB at a time, 1 GiB of address space
//     reserved, none committed): 27-28 of 30-31 ranges, 54-56 MiB of its
//     ~64, and 8 fewer mappings. A fork's first write to a shared huge
//     page splits it in that process (its page table is then filled: the
//     cost a fork paid before, for that range only) and copies 4 KiB; the
//     template's own Python splits about half of its ranges at its first
//     spare (reference counts it writes while the spare shares them:
//     AnonHugePages 28-30 MiB after), which stay split. Measured:
//     bench/load -mode sustain under perf (docs/benchmarks.md, "Huge
//     pages"): python3 CPU per session 15.9, 14.0 and 14.4 ms against
//     21.9, 20.0 and 18.0 in 4 KiB pages, three pairs at load 3-16 (the
//     kernel's fork 1.9-2.1 ms against 3.7-4.8, its exit_mmap 2.3-2.4
//     against 4.3-5.4, its faults unchanged at ~3.5), the heap alone
//     about half of that;
//     BenchmarkSessionLife (python3 CPU over 40 sessions' whole lives,
//     `1+1`, medians of 3, load 8-10): 9.6 ms against 11.2 (the heap
//     alone) and 12.6 (4 KiB pages). Memory is unchanged per session
//     (BenchmarkIdleMemory: USS 3.03 MiB and page tables 0.30 against
//     3.00 and 0.29; a huge page's entry still has a page table put
//     aside for its split) and the template grows ~2 MiB once (holes
//     filled).
//     Where the kernel refuses (before 6.1 EINVAL for every range; EPERM
//     under a filter) the template goes on in 4 KiB pages and the host's
//     log says so once per template (a warning); a partial collapse is
//     logged at info (TestHugePagesRefused). On Debian 12's 6.1 (the
//     project's VM, cgroup v2) TestHugePagesTemplate collapses as here.
//     SANDLOOP_ZYGOTE_HUGE_PAGES=0 keeps 4 KiB pages
//     (=heap: without the arenas' region), for baselines. malloc_trim
//     frees nothing (the Python objects fill their arenas: 0.3 of 36 MiB
//     free).
//   - The template's loop (done): the template made each spare in
//     Python (two socket pairs, the trampoline's call, a JSON message),
//     and that Python wrote, at every spare, the pages of the objects it
//     touched (reference counts, the allocator's pools, the at-fork hooks'
//     lists) while earlier spares and their sessions shared them: each
//     write copied 4 KiB in the template (~140 faults per spare) and
//     split the huge page it lay in there for good (its AnonHugePages
//     fell from 54 to 24-28 MiB within its first spares). Where the
//     trampoline is loaded the loop is now C (trampoline.c's
//     sandloop_serve, called once: it returns only in a kernel, or when
//     the host closes the control socket; it reaps the template's
//     children itself): the template writes only its stack and the
//     trampoline's variables and keeps every huge page
//     (TestTemplateKeepsHugePages). Its side of the interpreter's fork
//     work (PyOS_BeforeFork, PyOS_AfterFork_Parent: the import lock and
//     the before/after_in_parent hooks, which guard against other threads
//     holding locks) is left out: it has one thread, checked before the
//     loop, and waits in C. For the same reason its kernels skip the
//     after-fork hooks that only reinitialize threads and locks
//     (threading's _after_fork, logging's locks, a lock's
//     _at_fork_reinit: zygote.py's _lock_hooks), ~110 of the ~410 pages
//     an armed spare's kernel copied (~70 of ~770 after its first `1+1`,
//     the rest touched later anyway), and put the list back for their own
//     forks (TestForkHooksInSession); random's reseed still runs.
//     Splitting the ranges the old loop split on purpose (its first spare
//     made in Python) cost more than keeping them whole (7.84 against
//     7.18 ms in BenchmarkSessionLife, 5 × 100 sessions, load 6-7): a
//     kernel's own split of a range it writes is cheaper than copying the
//     range's 512 entries at every fork and dropping them at every exit.
//     Measured in BenchmarkSessionLife (python3 CPU over each session's
//     life, medians of 5 runs of 100 sessions, the kinds in turn):
//     6.91 ms against 7.43 with the loop in Python and 7.42 with every
//     hook run (load 3-5); 7.18 against 8.92 and 8.02 (load 6-7).
//     bench/load -mode sustain: docs/benchmarks.md, "The template's loop".
//   - Faults: any Python that runs after a fork first writes ~130 pages
//     (the interpreter's state, the allocator's pools); the rest are the
//     objects the kernel touches. A kernel through the C loop copies ~300
//     of the template's pages until it is armed, ~590 once kernel.py
//     runs, ~700 after its first `1+1` (by mapping: ~470 in the object
//     arenas, ~125 in the heap, ~100 the interpreter's own data; counted
//     by scripts/cowdiff.py, which compares the kernel's pages with the
//     template's); ~360 of the arenas' and the heap's ~600 have one or
//     two words changed, mostly reference counts: objects spread over
//     the template's memory, one write each. gc.freeze already keeps the collector off the
//     template's objects.
//   - Namespaces, mounts and the filter (~2 ms together) are the jail.
//
// At ~15 ms of python3 CPU and ~3 ms of Go per session, a burst of 100
// needs more than a second of both cores: p50 ≤ 150 ms is out of reach
// with a fork per session at this cost, for a burst made from scratch. A
// burst that repeats finds the pool the first one sized: BenchmarkBurst100's
// repeated burst (the same host, a few seconds after the first) answered
// at p50 52-105 ms, p95 65-116 ms (load 2-15), while the first burst on
// the fresh host took p50 0.72-3.95 s and the old pipeline 11.1-12.4 s.
//
// Memory. Through the trampoline the reaper is a small static C program
// (reaperexe/reaper.c, generated by `go generate ./internal/zygote`, held
// execute-only at ReaperPath in the template's read-only root) from the
// start, and never holds a copy of the template. Without the trampoline,
// five seconds after its session has taken it, the reaper executes that
// program (which then only forwards signals, reaps, and reports the
// kernel's end): its copy of the template's pages, page tables and memory
// maps is gone; a spare not yet taken still has them. Not at once:
// dropping that copy costs 3-7 ms of CPU (the execve unmaps it, as the
// reaper's exit did), which slowed the session's first command
// (BenchmarkReaperFirstCommand, each session from a ready spare, load
// 5-7: create + `1+1` 5.7-5.9 ms with the delay, 6.8-7.9 ms at once, 5.6-6.5
// ms with the Python reaper); a session closed sooner never executes it.
// BenchmarkIdleMemory (100 idle sessions with numpy and pandas imported, a second template
// with the Python reaper beside it in the same run, load 11-13): private
// memory (USS) 3.02 MiB per session (the reaper's 0.04) and 0.28 MiB of
// page tables, against 4.38 (the reaper's 1.44) and 0.52 with the Python
// reaper: 3.3 MiB against 4.9. A cold session: 46.1 MiB USS. Through the
// HTTP API (bench/load -mode idle -sessions 500, the program removed for
// the baseline, run right after, load 13-17) MemAvailable fell 4.46 MiB
// per session against 6.81 (4.88 in a later run with the 5 s delay): anonymous pages 3.53 against 5.12, page tables
// 0.31 against 0.53, slab 0.92 against 1.11 (vm_area_struct 125 KiB
// against 254); the kernel is now most of it (3.1 MiB of pages it wrote
// after the fork). Without the generated program (a plain `go build`, or
// reaper.c changed since) the reaper keeps its Python loop: more memory,
// never wrong.
//
// The host's side of a session (issue 26). Beside the python3 work above,
// the Go host spends CPU, and causes kernel work, over every session's
// life: arming its spare (a cgroup directory in each of four v1
// hierarchies, the limits, the two processes moved in), the workspace (a
// directory and a tmpfs), the hand-over, the HTTP requests and the
// kernel's pipes, and the close (kill, wait, the cgroup's removal, the
// workspace's unmount and removal). Measured with bench/load -mode
// sustain run short (100 creates/s offered for 10 s: 1000 sessions, each
// create, `1+1`, delete; server and client in one process; getrusage and
// pprof of that process, the harness's leak sampler left out), the code
// before and after the changes below run alternately: per session 10.9
// and 11.3 ms of CPU before, 8.7 and 6.4 ms after (load 12-15); in
// other pairs of pairs, 10.5 and 11.6 vs 6.7 and 7.8 (load 10-18), and
// with the final code 9.6 and 9.5 vs 6.9 and 7.1 (load 11-13; pprof's
// samples 7.1 and 6.7 ms vs 4.5 and 4.6). Where it went (pprof, ms per
// session, the two runs of each at load 12-15):
//
//	                                           before       after
//	close: Process.Wait                       1.46-1.67    0.22-0.35
//	  of it the cgroup's removal              1.32-1.41    0.10-0.19
//	close: Session.Close                      0.57-0.67    0.20-0.22
//	  of it Kernel.Kill (the group's kill)    0.49-0.51    ~0
//	arm a spare (cgroup, limits, moves)       0.77-0.88    0.57-0.64
//	pooled session.New (workspace, fork)      0.86-0.94    0.68-0.91
//	  of it the workspace (mkdir, tmpfs)      0.38-0.43    0.24-0.37
//	HTTP server (net/http's conn.serve)       0.72-1.01    0.69-1.12
//	GC (background marking)                   0.68-0.69    0.07-0.21
//	allocation (mallocgc)                     0.51-0.57    0.26-0.33
//	the load's client (create, 1+1, delete)   0.27-0.28    0.34-0.36
//
// The same samples by system call (kernel time included): openat 0.72-0.86
// → 0.25-0.30 (cgroup and /proc files), epoll_ctl 0.39-0.40 → 0.07-0.13
// (os.File registering each of them with the poller), read 0.44-0.46 →
// 0.14-0.24, close 0.19-0.37 → 0.13-0.17, rmdir 0.27-0.43 → 0.10-0.18,
// kill 0.08-0.15 → 0 (the pids the group listed); unchanged: mkdir
// 0.27-0.53 (four cgroups; the workspace's directory on the disk), write
// ~0.3 (cgroup files, pipes), mount ~0.1 and umount ~0.03 (the
// workspace's tmpfs). Where the host's threads blocked (perf sched, off
// CPU): each write to a v1 cgroup.procs waits for an RCU grace period when
// none was recent (percpu_down_write → rcu_sync_enter → synchronize_rcu,
// ~11 ms, on arm's path, not a request's; the cgroup mount option
// favordynmods, a host setting, would spare it); the workspace's umount,
// even lazy, waits for an expedited grace period (namespace_unlock →
// synchronize_rcu_expedited, ~1.6 ms, on the delete's path); its
// directory's rmdir, on this machine's ext4 mounted with discard, for a
// synchronous discard (~1 ms). A delete's 30-40 ms (p50) are mostly the
// sandbox's processes ending (the kernel process's mappings, its
// namespaces), not the host's work.
//
// What changed: Process.Kill signals the reaper and the kernel by their
// pidfds (every process of a session lives in the reaper's PID
// namespace, and dies with it) instead of reading the group's process
// list in each hierarchy (on v1 the kernel builds, sorts and caches a pid
// list per read); Wait waits for the reaper's pidfd (the kernel reports a
// namespace's init ended only once the namespace is empty), then removes
// the group by rmdir at once, reading process lists and killing what is
// left only if the kernel refuses (TestCloseKillsWhatTheGroupHolds); the
// OOM check reads one file, not three; cgroup and /proc files are read
// and written with plain system calls; a new group's CPU period and
// memory limit are not rewritten and read back; capget replaces a read of
// /proc/self/status per workspace; and each message from a spare is read
// into a pooled 64 KiB buffer rather than a new one (~7 per session: most
// of the GC's work).
//
// What is left: the cgroup's four mkdirs and rmdirs (and the kernel's
// teardown of them in workers): recycling a closed session's emptied
// group for the next spare would spare both, but carries the memory
// cgroup's charges and counters (oom_kill, the peak) into the next
// session; the workspace's directory on the disk (a tmpfs parent would
// spare ext4's journal and discard); the pool's sizing reads
// /proc/meminfo at every decision (~0.1-0.2 ms per session); net/http and
// JSON. Closing in the background after the kill would shorten the
// delete but move no CPU, and the sustained rate here is CPU-bound (at
// 100/s offered, cycles wait 10-25 s in line for the two cores); not
// done.
//
// A second pass (the same harness at 50 creates/s for 20 s, the code
// before and after run alternately, two runs of each, load 4-6): 4.13
// and 4.17 ms of this process's CPU per session before, 4.35 and 3.92
// after (pprof's samples 3.13 and 2.81 ms; the two changes below are ~2%
// of it, under the runs' noise). By pprof, per session: arming the spare
// 0.53 (the group's five directories 0.26, the two moves 0.13, the
// spare's messages), net/http 0.54 (server and client both), the pooled
// session.New 0.35 (the workspace's directory on ext4 and its tmpfs
// 0.15, the fork's hand-over 0.08), the close 0.40 (the group's removal
// 0.13, the workspace's unmount and rmdir 0.11, the OOM check 0.02), the
// scheduler's search for work 0.23, allocation 0.19. One group, made,
// limited, given two processes and removed, costs the calling thread
// ~0.52 ms of CPU on cgroup v1 (jail.BenchmarkGroupLife; five mkdirs 0.12,
// the limits 0.06, each process's moves 0.07, five rmdirs 0.08); its
// calls now walk from a descriptor of each hierarchy's parent, opened
// once, rather than the whole path (0.52 against 0.56 ms), and the pool's
// loop no longer formats the reasons for its target that only Stats
// shows (session.BenchmarkPoolTarget: 0.3 against 1.4 µs a call).
//
// The largest cost pprof does not show is the Go runtime's monitor
// (sysmon): its thread took ~20% of the process's CPU (schedstat: ~300 ms
// in 7 s, ~2000-3000 wake-ups a second at ~17 µs each on this VM). After
// it takes a processor back from a goroutine in a long system call it
// polls every 20 µs, then backs off; the long calls, per session (go tool
// trace -pprof=syscall on bench/load's -trace): 5.6 ms in ppoll (the
// kernel's pipes, waiting for its start and its cells), 3.2 ms writing
// cgroup.procs (an RCU grace period, see above), 1.4 ms in the
// workspace's umount. Waiting for the pipes in the runtime's poller
// instead (an epoll instance of the pipes registered through os.File)
// saved no CPU that could be measured (8 host kernels running `1+1` at
// once: 21-28 against 25-27 µs of Go CPU per cell, in turn) and made a
// lone cell's round trip 15-35 µs slower: not done. A timer slack of 1 ms
// for the whole process (prctl PR_SET_TIMERSLACK before it starts;
// systemd's TimerSlackNSec) spaced the monitor's wake-ups: 3.22-3.77 ms
// per session against 4.04-4.90 with the default 50 µs (three pairs, in
// turn, load 5-9), but every timer of the process may then fire up to
// 1 ms late: a host's choice, not set here. What else is left: the freezer's group (made for every
// spare, used only to pause: a mkdir, two moves and an rmdir, ~0.07 ms)
// could be made at the first pause, if the processes forked meanwhile are
// moved too; the workspace's directory on ext4 (mkdir, and rmdir with
// the inode's eviction and a discard) costs more than pprof's 0.15-0.25
// ms: with TMPDIR on a tmpfs (/dev/shm) the same harness took 3.66 and
// 3.09 ms per session against 3.97 and 3.69 in /tmp (two pairs in turn,
// load 6-11). A tmpfs parent of sandloop's own would spare it, but
// workspaces' paths, the sweep of a dead sandloop's workspaces and their
// adoption by the next (keeper) would change with it; not done.
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

// The small reaper a taken session's PID 1 executes (reaperexe/README.md).
//
//go:generate go run ./reapergen

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
	// RefillDelay is how long after a spare is taken, while no fork waits,
	// the template is asked for the next one, so that forking it does not
	// compete with the new session's first moments for the CPU. While forks
	// wait there is no delay. If zero, 200 ms; negative: at once.
	RefillDelay time.Duration
	// MaxSpares bounds the spares kept ready when the arrival rate is high
	// (the target grows with it, and falls back to Spares when idle; each
	// spare holds ~5 MiB). If zero, 16 (at least Spares).
	MaxSpares int
	// Parallel is how many spares may be in the making at once while forks
	// wait. If zero, twice the CPUs, between 2 and 8.
	Parallel int
	// Fixed selects the pipeline before issue 26, for comparison: a taken
	// spare is replaced RefillDelay later even while forks wait, and the
	// spares never grow past Spares.
	Fixed bool
	// Python is the template's interpreter (a template environment's, see
	// package template). If empty, jail.DefaultPython.
	Python string
	// Mounts are bound into the template's jail (read-only), and so into
	// every fork's.
	Mounts []jail.Mount
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger

	// pythonReaper keeps the reaper's Python loop after the take even
	// where the small reaper was generated (the benchmarks' baseline).
	pythonReaper bool
	// reaperDelay replaces defaultReaperDelay (tests).
	reaperDelay time.Duration
	// earlyReaper has a spare's reaper execute the small reaper right after
	// forking the kernel ("spare" mode: it builds the spare and the
	// session's jail itself). Off by default: dropping the fresh copy of
	// the template costs that spare ~8 ms of CPU (BenchmarkSpareReaper),
	// more than the Python it spares; the reaper's part for a spare that is
	// never a copy (see "What is left").
	earlyReaper bool
	// noTrampoline makes spares without the trampoline even where it was
	// generated: the reaper is a copy of the template that forks the
	// kernel (the benchmarks' baseline).
	noTrampoline bool
	// noHugePages keeps the template's anonymous memory in 4 KiB pages
	// (the benchmarks' baseline; see "Huge pages"). The environment
	// variable SANDLOOP_ZYGOTE_HUGE_PAGES=0 does the same for a whole
	// program (bench/load's baseline).
	noHugePages bool
	// noArenas leaves Python's object arenas where mmap puts them (with
	// huge pages: only the heap and the larger anonymous mappings are
	// collapsed). SANDLOOP_ZYGOTE_HUGE_PAGES=heap does the same.
	noArenas bool
	// pythonLoop keeps the template's loop (a spare for each request) in
	// Python where the trampoline would run it in C (the benchmarks'
	// baseline; see "The template's loop"). The environment variable
	// SANDLOOP_ZYGOTE_LOOP=python does the same for a whole program.
	pythonLoop bool
	// allForkHooks has the kernels of the C loop run every after-fork hook
	// (os.register_at_fork's), those that only reinitialize threads and
	// locks included (the benchmarks' baseline; see "The template's loop").
	// SANDLOOP_ZYGOTE_FORK_HOOKS=all does the same for a whole program.
	allForkHooks bool
	// refusedHugePages has the template ask for an advice no kernel knows
	// in MADV_COLLAPSE's stead (tests: an old kernel refuses the same way).
	refusedHugePages bool
	// brokenTrampoline places a file the template cannot load in its
	// stead (tests: a libc too old for it fails the same way).
	brokenTrampoline bool
}
