/*
 * sandloop-trampoline.so: makes a zygote spare with one copy of the
 * template's page tables rather than two.
 *
 * The template (zygote.py) loads it with ctypes.PyDLL (the GIL stays held)
 * and calls sandloop_serve, its loop in C (below), once; sandloop_spare
 * (make_spare's, where the loop stays in Python) makes one spare. It:
 *
 *   - runs the interpreter's before-fork work (PyOS_BeforeFork, whose
 *     address zygote.py passes in) and blocks every signal;
 *   - clone(CLONE_VM | CLONE_VFORK | CLONE_NEWPID | CLONE_NEWNS |
 *     CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD) on a stack of
 *     its own: the child, PID 1 of the new PID namespace, shares the
 *     template's memory (nothing is copied) while the template waits;
 *   - the child closes what neither of the spare's processes may keep
 *     (the template's control socket...) and forks the kernel with glibc's
 *     _Fork (no at-fork handlers, which belong to the template's memory,
 *     but the thread's tid set right): this is the one copy;
 *   - the kernel (PID 2) longjmps back into sandloop_spare, on its own copy
 *     of the template's stack, restores the signal mask, runs
 *     PyOS_AfterFork_Child and returns 0 to Python, as os.fork would in a
 *     child;
 *   - the child executes the small reaper in its "spare" mode (reaper.c)
 *     with the kernel's PID and its two descriptors; if it cannot, it
 *     says why in the memory it shares with the template, kills the kernel
 *     and exits 127: it never returns to Python (it shares the template's
 *     memory: any Python it ran would write the template's objects);
 *   - the template, resumed by that execve (or that exit), restores its
 *     signal mask, runs PyOS_AfterFork_Parent and returns the reaper's PID
 *     (or -1 and why).
 *
 * Built by reapergen (`go generate ./internal/zygote`) with gcc -shared,
 * without _FORTIFY_SOURCE: its longjmp leaves one stack for another,
 * which the checking longjmp refuses.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Where the child failed (sandloop_spare's why[0]). */
enum {
	STAGE_NONE,
	STAGE_CLONE,   /* the template's clone */
	STAGE_FORK,    /* the child's _Fork of the kernel */
	STAGE_FDS,     /* the child's descriptors for the reaper */
	STAGE_EXEC,    /* the child's execve of the reaper */
};

typedef void (*hook)(void);

struct call {
	const int *close_fds; /* closed before the kernel's fork: neither keeps them */
	int nclose;
	int keep[2];          /* the reaper's descriptors (the rest are closed on exec) */
	const char *path;     /* the small reaper */
	char **argv;          /* argv[2] is set to the kernel's PID */
};

/* State shared by the template and the child (one address space). Only
 * one call at a time: the template is single-threaded, and waits in clone
 * until the child has executed or exited. */
static jmp_buf back;
static sigset_t saved_mask;
static hook after_child;
static volatile int child_stage, child_errno;
static char kernel_pid[24];
static char child_stack[64 << 10] __attribute__((aligned(64)));

/* The raw system call: the child shares the template's thread descriptor,
 * where glibc's wrapper would keep state. */
static void set_mask(const sigset_t *set, sigset_t *old) { syscall(SYS_rt_sigprocmask, SIG_SETMASK, set, old, _NSIG / 8); }

static void child_fail(int stage, pid_t kernel) {
	child_errno = errno;
	child_stage = stage;
	if (kernel > 0)
		kill(kernel, SIGKILL);
	_exit(127);
}

static int child(void *arg) {
	struct call *c = arg;
	for (int i = 0; i < c->nclose; i++)
		close(c->close_fds[i]);
	pid_t k = _Fork();
	if (k < 0)
		child_fail(STAGE_FORK, 0);
	if (k == 0)
		longjmp(back, 1); /* the kernel, back in sandloop_spare */
	/* Decimal by hand: no stdio in a process that shares another's. */
	char digits[24];
	int n = 0;
	for (unsigned v = (unsigned)k; v; v /= 10)
		digits[n++] = (char)('0' + v % 10);
	for (int i = 0; i < n; i++)
		kernel_pid[i] = digits[n - 1 - i];
	kernel_pid[n] = 0;
	c->argv[2] = kernel_pid;
	/* Only the reaper's two descriptors cross the execve. */
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
		child_fail(STAGE_FDS, k);
	for (int i = 0; i < 2; i++)
		if (fcntl(c->keep[i], F_SETFD, 0) != 0)
			child_fail(STAGE_FDS, k);
	/* Every signal stays blocked across the execve: the reaper installs
	 * its handlers, then unblocks them (a signal for the kernel sent
	 * meanwhile waits, where PID 1 without a handler would drop it). */
	static char *const envp[] = {NULL};
	execve(c->path, c->argv, envp);
	child_fail(STAGE_EXEC, k);
	return 127;
}

/* sandloop_init gives the interpreter's fork hooks (ctypes.pythonapi's
 * PyOS_BeforeFork, PyOS_AfterFork_Parent, PyOS_AfterFork_Child). */
static hook before_fork, after_parent;

void sandloop_init(hook before, hook parent, hook child_hook) {
	before_fork = before;
	after_parent = parent;
	after_child = child_hook;
}

/* The kernel's thread is new to the kernel (Linux): glibc registered the
 * template's thread for restartable sequences, a fork copies that only
 * for a fork of the registered thread, and this one is a fork of the
 * child, which had none (clone with CLONE_VM). Register again, or mark it
 * failed so that glibc asks the system (sched_getcpu). */
static void rseq_again(void) {
	if (__rseq_size == 0)
		return;
	struct rseq *r = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
	r->cpu_id = RSEQ_CPU_ID_UNINITIALIZED;
	if (syscall(SYS_rseq, r, __rseq_size, 0, RSEQ_SIG) != 0)
		r->cpu_id = RSEQ_CPU_ID_REGISTRATION_FAILED;
}

/* sandloop_spare makes a spare (see the top of this file). close_fds are
 * closed in the child before the kernel's fork; sock and reaper_fd are
 * the reaper's descriptors; argv is the reaper's, NULL-terminated, argv[2]
 * left for the kernel's PID. Returns the reaper's PID in the template, 0
 * in the kernel, or -1 in the template with why[0] the stage (STAGE_*) and
 * why[1] the errno. */
static int spare(const int *close_fds, int nclose, int sock, int reaper_fd, const char *path, char **argv, int *why, int hooks);

int sandloop_spare(const int *close_fds, int nclose, int sock, int reaper_fd, const char *path, char **argv, int *why) {
	return spare(close_fds, nclose, sock, reaper_fd, path, argv, why, 1);
}

/* spare is sandloop_spare; without hooks the template's side of the
 * interpreter's fork work (PyOS_BeforeFork, PyOS_AfterFork_Parent) is
 * left out (sandloop_serve), the kernel's (PyOS_AfterFork_Child) never. */
static int spare(const int *close_fds, int nclose, int sock, int reaper_fd, const char *path, char **argv, int *why, int hooks) {
	struct call c = {close_fds, nclose, {sock, reaper_fd}, path, argv};
	sigset_t all;
	why[0] = why[1] = 0;
	if (hooks)
		before_fork();
	sigfillset(&all);
	set_mask(&all, &saved_mask);
	child_stage = child_errno = 0;
	if (setjmp(back)) {
		/* The kernel: its own copy of the template, on the template's
		 * stack as it was. */
		rseq_again();
		set_mask(&saved_mask, NULL);
		after_child();
		return 0;
	}
	int pid = clone(child, child_stack + sizeof child_stack,
			CLONE_VM | CLONE_VFORK | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, &c);
	int e = errno;
	set_mask(&saved_mask, NULL);
	if (hooks)
		after_parent();
	if (pid < 0) {
		why[0] = STAGE_CLONE;
		why[1] = e;
		return -1;
	}
	if (child_stage) {
		/* (The child has exited: the template's SIGCHLD handler reaps it.) */
		why[0] = child_stage;
		why[1] = child_errno;
		return -1;
	}
	return pid;
}

/*
 * sandloop_serve is the template's loop, in C: for each message the host
 * sends on ctl (and initial times at first) it makes a spare as
 * make_spare_trampoline did in Python (two socket pairs, the spare,
 * '{"spare": PID}' and the host's end of the spare's socket sent back) and
 * never returns to Python in the template. A fork of the template shares
 * its pages until either writes them; the Python loop wrote, at every
 * spare, the pages of every object it touched (its reference counts, the
 * allocator's pools, the at-fork hooks' lists) while earlier spares and
 * kernels shared them: each write copied 4 KiB in the template and split
 * the 2 MiB page it lay in there for good (about half of its huge pages
 * after its first spares), and every later fork copied 512 entries for
 * each split page, every exit dropped them. Here the template writes only
 * its stack and this object's own variables. The interpreter's fork work
 * on the template's side (PyOS_BeforeFork, PyOS_AfterFork_Parent: the
 * import lock and the at-fork hooks registered with before= and
 * after_in_parent=, which guard against other threads holding locks) is
 * left out: zygote.py checks the template has no other thread before it
 * calls this, and nothing here starts one. The kernel runs
 * PyOS_AfterFork_Child as before (os.fork's child work: threading's,
 * random's reseed, the locks).
 *
 * Returns 0 in a kernel, with kfds[0] its socket to the host and kfds[1]
 * its end of the socket to its reaper, SIGCHLD's handler as it was; 1 in
 * the template when the host has closed ctl (or it failed: the template
 * then exits, and the host starts another).
 */
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>

static void reap(int sig) {
	(void)sig;
	int e = errno;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = e;
}

static char *serve_argv[64];
static char serve_fds[2][16];
static int serve_why[2];

static const char *const stage_name[] = {"make the spare", "clone the spare", "fork the kernel", "the reaper's descriptors", "execute the small reaper"};

static int send_msg(int ctl, const char *msg, int fd) {
	struct iovec iov = {(void *)msg, strlen(msg)};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(h), &fd, sizeof(int));
	}
	return sendmsg(ctl, &m, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

int sandloop_serve(int ctl, int pidns, int initial, const char *path, char *const *argv, int *kfds) {
	int n = 0;
	while (argv[n] && n < 63) {
		serve_argv[n] = argv[n];
		n++;
	}
	serve_argv[n] = NULL;
	serve_argv[3] = serve_fds[0];
	serve_argv[4] = serve_fds[1];
	struct sigaction sa = {.sa_handler = reap, .sa_flags = SA_RESTART | SA_NOCLDSTOP}, old;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, &old);
	reap(SIGCHLD); /* children that ended before */
	for (int more = initial;; more = 0) {
		if (more <= 0) {
			char buf[64];
			ssize_t r = recv(ctl, buf, sizeof buf, 0);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
		}
		for (int k = more > 0 ? more : 1; k > 0; k--) {
			int ours[2], rk[2];
			char msg[256];
			if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ours) != 0) {
				snprintf(msg, sizeof msg, "{\"error\": \"spare child: OSError: socketpair: %s\"}", strerror(errno));
				if (send_msg(ctl, msg, -1) != 0)
					goto done;
				continue;
			}
			if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rk) != 0) {
				snprintf(msg, sizeof msg, "{\"error\": \"spare child: OSError: socketpair: %s\"}", strerror(errno));
				close(ours[0]);
				close(ours[1]);
				if (send_msg(ctl, msg, -1) != 0)
					goto done;
				continue;
			}
			int one = 1;
			setsockopt(ours[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
			/* ours[0] the host's end, ours[1] the spare's; rk[0] the
			 * reaper's end, rk[1] the kernel's. */
			snprintf(serve_fds[0], sizeof serve_fds[0], "%d", ours[1]);
			snprintf(serve_fds[1], sizeof serve_fds[1], "%d", rk[0]);
			int close_fds[3] = {ctl, ours[0], pidns};
			int pid = spare(close_fds, 3, ours[1], rk[0], path, serve_argv, serve_why, 0);
			if (pid == 0) {
				/* The kernel. */
				close(rk[0]);
				kfds[0] = ours[1];
				kfds[1] = rk[1];
				sigaction(SIGCHLD, &old, NULL);
				return 0;
			}
			int failed;
			if (pid > 0) {
				snprintf(msg, sizeof msg, "{\"spare\": %d}", pid);
				failed = send_msg(ctl, msg, ours[0]);
			} else {
				int st = serve_why[0] >= 0 && serve_why[0] <= STAGE_EXEC ? serve_why[0] : 0;
				snprintf(msg, sizeof msg, "{\"error\": \"spare child: OSError: [Errno %d] %s: %s\"}", serve_why[1], stage_name[st], strerror(serve_why[1]));
				failed = send_msg(ctl, msg, -1);
			}
			close(ours[0]);
			close(ours[1]);
			close(rk[0]);
			close(rk[1]);
			if (failed)
				goto done;
		}
	}
done:
	sigaction(SIGCHLD, &old, NULL);
	return 1;
}

/*
 * The template's object arenas in one region (sandloop_arenas, then
 * PyObject_SetArenaAllocator from zygote.py, before the imports): Python's
 * allocator takes 1 MiB arenas with mmap, which the kernel places between
 * the shared libraries' mappings, so ~14 MiB of the template's objects
 * lie in mappings too small for a 2 MiB page. Here they are consecutive
 * in one 2 MiB-aligned reservation (PROT_NONE, made readable and writable
 * 2 MiB at a time), which the template then collapses into huge pages
 * with its heap (see zygote.py's _huge_pages). An arena freed in the
 * region is emptied (MADV_DONTNEED) and its slot reused; any other size,
 * or a full region, is mmap's as before, and an arena from outside the
 * region (made before the allocator was set) is unmapped. Forks inherit
 * the allocator and their own copy of the slots' bitmap.
 */
#include <stdint.h>
#include <sys/mman.h>

#define ARENA (1UL << 20)
#define HUGE (2UL << 20)
#define SLOTS 1024 /* 1 GiB of address space, none of it committed */

static char *arenas;
static size_t arenas_rw; /* bytes from arenas made readable and writable */
static uint64_t arenas_used[SLOTS / 64];

int sandloop_arenas(void) {
	size_t len = SLOTS * ARENA + HUGE;
	char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(HUGE - 1));
	if (a > p)
		munmap(p, a - p);
	if (p + len > a + SLOTS * ARENA)
		munmap(a + SLOTS * ARENA, (p + len) - (a + SLOTS * ARENA));
	arenas = a;
	return 0;
}

void *sandloop_arena_alloc(void *ctx, size_t size) {
	(void)ctx;
	if (arenas && size == ARENA) {
		for (int w = 0; w < SLOTS / 64; w++) {
			if (~arenas_used[w] == 0)
				continue;
			int b = __builtin_ctzll(~arenas_used[w]);
			size_t off = (size_t)(w * 64 + b) * ARENA;
			if (off + ARENA > arenas_rw) {
				size_t grow = (off + ARENA - arenas_rw + HUGE - 1) & ~(HUGE - 1);
				if (mprotect(arenas + arenas_rw, grow, PROT_READ | PROT_WRITE) != 0)
					break;
				arenas_rw += grow;
			}
			arenas_used[w] |= 1ULL << b;
			return arenas + off;
		}
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void sandloop_arena_free(void *ctx, void *p, size_t size) {
	(void)ctx;
	char *c = p;
	if (arenas && c >= arenas && c < arenas + SLOTS * ARENA) {
		size_t i = (size_t)(c - arenas) / ARENA;
		madvise(c, ARENA, MADV_DONTNEED);
		arenas_used[i / 64] &= ~(1ULL << (i % 64));
		return;
	}
	munmap(p, size);
}
