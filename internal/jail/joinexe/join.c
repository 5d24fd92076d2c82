/*
 * sandloop-join: a process joining a running jail (join_linux.go), the
 * whole join in one small program: what the join script (python3 -I -S)
 * and the init program in join mode (runJoin) do on the other path.
 *
 *   sandloop-join VERSION FLAGS UID GID
 *
 * Descriptors: 0-2 the program's; 3 a pidfd of the jail's PID 1; 4 the
 * jail's root (O_PATH); 6 the configuration (from the host); 7 the status
 * (to the host). VERSION is joinProgVersion: a program of another
 * protocol refuses to start.
 *
 * The configuration pipe carries a newline (the host has moved this
 * process into the jail's cgroup: nothing is entered before it), then
 * two messages, each a 4-byte length in native byte order and that many
 * bytes of NUL-terminated fields:
 *
 *   setup:   NOFILE FSIZE STACK TERMINAL(0|1) N {NAME RESOURCE VALUE}*N FILTER_HEX
 *   command: PATH DIR ARGC ARG*ARGC ENVC ENV*ENVC
 *
 * The setup follows the newline at once; the command comes with the
 * command (at once, or later for a join made ahead). The status pipe
 * carries JSON lines in the words of the script and runJoin:
 * {"pid":N} (the child that becomes the program), {"prepared":true},
 * {"ready":true}, {"error":"..."} and, at the end,
 * {"exited":true,"cpu_ms":N,"maxrss_kb":N,"code":N|"signal":N}.
 *
 * Steps, as on the other path: enter every namespace of the pidfd at once
 * (setns), chroot to the jail's root, fork (the child is in the jail's PID
 * namespace; this process stays on the host's side, reports the child's
 * PID, lets it go on, and waits for it). The child takes the sandbox's
 * uid and gid, sets the jail's rlimits, starts a session of its own (a
 * terminal becomes its controlling terminal), marks every descriptor but
 * 0-2 close-on-exec, empties every capability set (bounding and ambient
 * included), locks the securebits, becomes not dumpable, sets
 * no_new_privs and loads the jail's seccomp filter (built by the host:
 * jail.SeccompFilter), reports {prepared}; then reads its command,
 * changes to its directory, sets its last rlimits (DATA, NPROC), reports
 * {ready} and executes it, with every signal at its default and none
 * blocked.
 *
 * Built static with libc only (joingen: gcc -static -Os), executed on the
 * host from the same private cache as the jail's small init.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* The protocol between the host and this program (joinProgVersion). */
#define VERSION "1"

enum { PIDFD = 3, ROOT = 4, CONFIG = 6, STATUS = 7 };

/* write_all writes n bytes of p to fd. */
static void write_all(int fd, const char *p, size_t n) {
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

static void report(const char *line) {
	char buf[256];
	size_t n = strlen(line);
	if (n + 1 < sizeof buf) {
		memcpy(buf, line, n);
		buf[n] = '\n';
		write_all(STATUS, buf, n + 1); /* one write: one line */
	}
}

/* errtext is strerror(e) as Go words it (lower-case first letter). */
static const char *errtext(int e, char *buf, size_t cap) {
	snprintf(buf, cap, "%s", strerror(e));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* fail reports {"error":"<what>: <errno's text>"} (what is JSON-escaped:
 * it may hold a path of the user's) and exits with code. */
static void fail_errno(const char *what, int e, int code) {
	static char msg[16384];
	char et[128];
	size_t n = 0;
	const char *head = "{\"error\":\"";
	memcpy(msg, head, strlen(head));
	n = strlen(head);
	for (const unsigned char *p = (const unsigned char *)what; *p && n < sizeof msg - 512; p++) {
		if (*p == '"' || *p == '\\') {
			msg[n++] = '\\';
			msg[n++] = (char)*p;
		} else if (*p < 0x20 || *p == 0x7f) {
			n += (size_t)snprintf(msg + n, 8, "\\u%04x", *p);
		} else {
			msg[n++] = (char)*p;
		}
	}
	n += (size_t)snprintf(msg + n, sizeof msg - n, ": %s\"}\n", errtext(e, et, sizeof et));
	write_all(STATUS, msg, n);
	_exit(code);
}

static void fail(const char *what, int code) { fail_errno(what, errno, code); }

static int number(const char *s, long long *out) {
	char *end;
	errno = 0;
	*out = strtoll(s, &end, 10);
	return errno == 0 && end != s && *end == 0;
}

/* read_full reads exactly n bytes; 0 at a clean end, -1 otherwise. */
static int read_full(int fd, void *buf, size_t n) {
	char *p = buf;
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EPIPE;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* A message of the configuration: its fields, in order. */
struct message {
	char *buf, *next, *end;
};

static void read_message(struct message *m) {
	uint32_t n;
	if (read_full(CONFIG, &n, sizeof n) != 0)
		fail("read config", 126);
	if (n > 64u << 20) {
		errno = E2BIG;
		fail("read config", 126);
	}
	m->buf = malloc((size_t)n + 1);
	if (!m->buf)
		fail("read config", 126);
	if (read_full(CONFIG, m->buf, n) != 0)
		fail("read config", 126);
	m->buf[n] = 0;
	m->next = m->buf;
	m->end = m->buf + n;
}

/* field returns the next field (it fails if there is none). */
static char *field(struct message *m) {
	if (m->next >= m->end) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	char *f = m->next;
	m->next += strlen(f) + 1;
	return f;
}

static long long field_int(struct message *m) {
	long long v;
	if (!number(field(m), &v)) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	return v;
}

static unsigned long long field_uint(struct message *m) {
	char *s = field(m), *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	return v;
}

static void set_rlimit(const char *name, int res, unsigned long long v) {
	struct rlimit rl = {(rlim_t)v, (rlim_t)v};
	if (setrlimit(res, &rl) != 0) {
		char what[96];
		snprintf(what, sizeof what, "setrlimit %s=%llu", name, v);
		fail(what, 126);
	}
}

static int hexval(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	return -1;
}

/* cap_last is the highest capability number the kernel knows (63 if it
 * cannot be read), as capLast. */
static long cap_last(void) {
	char buf[32];
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 63;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	long long v;
	if (n <= 0)
		return 63;
	buf[n] = 0;
	if (buf[n - 1] == '\n')
		buf[n - 1] = 0;
	if (!number(buf, &v) || v <= 0)
		return 63;
	return (long)v;
}

/* drop_privileges is dropPrivileges (caps_linux.go), step for step. */
static void drop_privileges(void) {
	long last = cap_last();
	for (long c = 0; c <= last; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) {
			char what[64];
			snprintf(what, sizeof what, "drop capability %ld from bounding set", c);
			fail(what, 126);
		}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
		fail("clear ambient capabilities", 126);
	/* NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off) and NO_CAP_AMBIENT_RAISE,
	 * each with its lock bit. */
	if (prctl(PR_SET_SECUREBITS, 1 | 2 | 4 | 8 | 32 | 64 | 128, 0, 0, 0) != 0)
		fail("set securebits", 126);
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
		fail("set not dumpable", 126);
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof data);
	if (syscall(SYS_capset, &hdr, data) != 0)
		fail("capset", 126);
}

/* child is the process that becomes the program: runJoin's part. */
static void child(uid_t uid, gid_t gid) {
	if (setresgid(gid, gid, gid) != 0)
		fail("join: setresgid", 126);
	if (setresuid(uid, uid, uid) != 0)
		fail("join: setresuid", 126);

	struct message setup;
	read_message(&setup);
	unsigned long long nofile = field_uint(&setup), fsize = field_uint(&setup), stack = field_uint(&setup);
	long long terminal = field_int(&setup), nextra = field_int(&setup);
	if (nextra < 0 || nextra > 8) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	struct {
		char *name;
		int res;
		unsigned long long val;
	} extra[8];
	for (long long i = 0; i < nextra; i++) {
		extra[i].name = field(&setup);
		extra[i].res = (int)field_int(&setup);
		extra[i].val = field_uint(&setup);
	}
	/* The filter: the bytes of a struct sock_filter array, in hex. */
	char *hex = field(&setup);
	size_t hexlen = strlen(hex);
	if (hexlen == 0 || hexlen % 16 != 0 || hexlen / 16 > BPF_MAXINSNS) {
		errno = EINVAL;
		fail("load seccomp filter", 126);
	}
	struct sock_filter *insns = malloc(hexlen / 2);
	if (!insns)
		fail("load seccomp filter", 126);
	unsigned char *f = (unsigned char *)insns;
	for (size_t i = 0; i < hexlen; i += 2) {
		int hi = hexval(hex[i]), lo = hexval(hex[i + 1]);
		if (hi < 0 || lo < 0) {
			errno = EINVAL;
			fail("load seccomp filter", 126);
		}
		f[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	struct sock_fprog prog = {(unsigned short)(hexlen / 16), insns};

	set_rlimit("NOFILE", RLIMIT_NOFILE, nofile);
	set_rlimit("FSIZE", RLIMIT_FSIZE, fsize);
	set_rlimit("CORE", RLIMIT_CORE, 0);
	set_rlimit("STACK", RLIMIT_STACK, stack);
	/* A session of its own: its process group is what Kill ends, and a
	 * terminal becomes its controlling terminal. */
	if (setsid() < 0)
		fail("setsid", 126);
	if (terminal && ioctl(0, TIOCSCTTY, 0) != 0)
		fail("controlling terminal", 126);
	/* Nothing of the host's but 0-2 reaches the program. */
	if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0)
		fail("close_range", 126);
	drop_privileges();
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		fail("set no_new_privs", 126);
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
		fail("load seccomp filter", 126);
	free(insns);
	free(setup.buf);
	report("{\"prepared\":true}");

	struct message cmd;
	read_message(&cmd);
	char *path = field(&cmd), *dir = field(&cmd);
	long long argc = field_int(&cmd);
	if (argc < 0 || argc > (1 << 20)) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	char **argv = calloc((size_t)argc + 1, sizeof *argv);
	if (!argv)
		fail("read config", 126);
	for (long long i = 0; i < argc; i++)
		argv[i] = field(&cmd);
	long long envc = field_int(&cmd);
	if (envc < 0 || envc > (1 << 20)) {
		errno = EBADMSG;
		fail("read config", 126);
	}
	char **envp = calloc((size_t)envc + 1, sizeof *envp);
	if (!envp)
		fail("read config", 126);
	for (long long i = 0; i < envc; i++)
		envp[i] = field(&cmd);
	close(CONFIG);
	if (chdir(dir) != 0) {
		size_t n = strlen(dir) + 8;
		char *what = malloc(n);
		if (what)
			snprintf(what, n, "chdir %s", dir);
		fail(what ? what : "chdir", 126);
	}
	/* DATA and NPROC bind the program: set last, as runJoin does. */
	for (long long i = 0; i < nextra; i++)
		set_rlimit(extra[i].name, extra[i].res, extra[i].val);
	report("{\"ready\":true}");
	/* Every signal at its default and none blocked, whatever the host
	 * left (GNU make's children, for one, start with 32 and 33 ignored):
	 * by the system call itself, as glibc's sigaction refuses the two it
	 * keeps for its threads. */
	struct {
		void (*handler)(int);
		unsigned long flags;
		void (*restorer)(void);
		unsigned long mask;
	} dfl = {SIG_DFL, 0, NULL, 0};
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			syscall(SYS_rt_sigaction, s, &dfl, NULL, sizeof dfl.mask);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve(path, argv, envp);
	int e = errno;
	size_t n = strlen(path) + 8;
	char *what = malloc(n);
	if (what)
		snprintf(what, n, "start %s", path);
	fail_errno(what ? what : "start", e, 127);
}

int main(int argc, char **argv) {
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	long long flags, uid, gid;
	if (argc != 5 || strcmp(argv[1], VERSION) != 0 || !number(argv[2], &flags) || !number(argv[3], &uid) ||
	    !number(argv[4], &gid)) {
		errno = EINVAL;
		fail("sandloop-join: this program is not of this sandloop's version (run `go generate ./internal/jail`)", 126);
	}
	/* Nothing is entered until the host has moved this process into the
	 * jail's cgroup (where the child is then born) and says so. */
	char c;
	if (read_full(CONFIG, &c, 1) != 0 || c != '\n') {
		errno = EPIPE;
		fail("no configuration", 126);
	}
	if (flags && setns(PIDFD, (int)flags) != 0)
		fail("enter the sandbox's namespaces", 126);
	if (fchdir(ROOT) != 0 || chroot(".") != 0 || chdir("/") != 0)
		fail("enter the sandbox's root", 126);
	/* The child goes on once its PID is reported: the host knows what to
	 * kill before anything of the program's can run. */
	int hold[2];
	if (pipe2(hold, O_CLOEXEC) != 0)
		fail("pipe", 126);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork", 126);
	if (pid == 0) {
		close(PIDFD);
		close(ROOT);
		close(hold[1]);
		char g;
		if (read_full(hold[0], &g, 1) != 0 || g != 'g') {
			errno = ECANCELED;
			fail("join: the join was abandoned", 126);
		}
		close(hold[0]);
		child((uid_t)uid, (gid_t)gid);
	}
	close(PIDFD);
	close(ROOT);
	close(CONFIG);
	close(0);
	close(1);
	close(2);
	close(hold[0]);
	char line[128];
	snprintf(line, sizeof line, "{\"pid\":%d}", (int)pid);
	report(line);
	write_all(hold[1], "g", 1);
	close(hold[1]);
	int st;
	struct rusage ru;
	while (wait4(pid, &st, 0, &ru) < 0)
		if (errno != EINTR)
			_exit(1);
	long long cpu = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
	if (WIFSIGNALED(st))
		snprintf(line, sizeof line, "{\"exited\":true,\"cpu_ms\":%lld,\"maxrss_kb\":%ld,\"signal\":%d}", cpu, ru.ru_maxrss, WTERMSIG(st));
	else
		snprintf(line, sizeof line, "{\"exited\":true,\"cpu_ms\":%lld,\"maxrss_kb\":%ld,\"code\":%d}", cpu, ru.ru_maxrss, WEXITSTATUS(st));
	report(line);
	_exit(0);
}
