/*
 * sandloop-reaper: a forked session's PID 1 once its session has taken it.
 *
 * The spare's Python reaper (zygote.py, _spare) builds the session's jail,
 * locks itself down, reports {"locked":true} and, a few seconds later,
 * executes this program, which replaces the copy of the template it was
 * (~1.5 MiB of copied pages and page tables per idle session) with a few
 * pages:
 *
 *   reaper KERNEL_PID SOCKET_FD
 *
 * It does what the Python loop did: forwards SIGINT, SIGTERM, SIGHUP,
 * SIGQUIT, SIGUSR1 and SIGUSR2 to the kernel, reaps every process of the
 * PID namespace (it is its init) and, when the kernel ends, reports how on
 * the spare's socket in exactly the Python loop's words:
 *
 *   {"exited": true, "code": N}  or  {"exited": true, "code": 0, "signal": S}
 *
 * then exits (the kernel kills whatever is left in the namespace).
 *
 * Or, as the spare's reaper from the start: executed by the trampoline's
 * child (trampoline.c, the default where it was generated: the child
 * shares the template's memory, forks the kernel and executes this, with
 * every signal blocked until reap() handles them), or, without the
 * trampoline, by the reaper right after forking the kernel where the host
 * asks for it (Options.earlyReaper, off by default, since the execve's
 * unmapping of the fresh copy costs the spare more CPU than the Python it
 * spares):
 *
 *   reaper spare KERNEL_PID SOCKET_FD KERNEL_SOCKET_FD FILTER_HEX MASKS
 *          READONLY LAST_CAP WORKSPACES
 *
 * it then does the Python reaper's whole part first (_prepare,
 * _lock_bounding, the armed cgroup handshake, the session's mounts and
 * workspace, the kernel's descriptors, rlimits, its lockdown: see
 * zygote.py, whose messages it sends in the same words), so that the
 * reaper never runs Python after the fork.
 *
 * Built static with libc only (reapergen: gcc -static -Os), so that it runs
 * in any jail's root. It runs under the session's seccomp filter, without
 * capabilities and with no_new_privs, as any program user code starts. The
 * host installs it execute-only, so the process stays non-dumpable across
 * the execve; it says so again first thing in case the file was readable.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t kernel_pid;

static void forward(int sig) {
	int saved = errno;
	kill(kernel_pid, sig);
	errno = saved;
}

static int number(const char *s, long *out) {
	char *end;
	errno = 0;
	*out = strtol(s, &end, 10);
	return errno == 0 && end != s && *end == 0;
}

/* reap forwards signals to the kernel, reaps every child and reports how
 * the kernel ended; it never returns. */
static void reap(int sock) {
	/* Handlers, not SIG_DFL: an init receives only the signals it
	 * handles. Installed before the mask is cleared: zygote.py blocks
	 * these signals across its execve, so one sent meanwhile stays
	 * pending and is forwarded here, not dropped. */
	static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = forward;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
		sigaction(forwarded[i], &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (;;) {
		int status;
		pid_t pid = wait4(-1, &status, 0, NULL);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			_exit(0); /* ECHILD: nothing left, the kernel neither */
		}
		if (pid != kernel_pid)
			continue;
		char msg[96];
		int n;
		if (WIFSIGNALED(status))
			n = snprintf(msg, sizeof msg, "{\"exited\": true, \"code\": 0, \"signal\": %d}", WTERMSIG(status));
		else
			n = snprintf(msg, sizeof msg, "{\"exited\": true, \"code\": %d}", WIFEXITED(status) ? WEXITSTATUS(status) : 0);
		while (send(sock, msg, (size_t)n, MSG_NOSIGNAL) < 0 && errno == EINTR) {
		}
		_exit(0);
	}
}

/* ---------------------------------------------------------------- spare */

static int report_sock = -1;
static int fail_code = 125;
static const char *stage = "prepare the spare";

/* fail reports what failed, as zygote.py's _fail does, and exits. */
static void fail(const char *what) {
	int e = errno;
	char msg[512];
	int n = snprintf(msg, sizeof msg, "{\"error\": \"%s: OSError: %s: %s\"}", stage, what, strerror(e));
	for (char *p = msg + 11; p < msg + n - 2; p++)
		if (*p == '"' || *p == '\\')
			*p = '\'';
	if (n > 0 && (size_t)n < sizeof msg)
		send(report_sock, msg, (size_t)n, MSG_NOSIGNAL);
	_exit(fail_code);
}

static void check(int ret, const char *what) {
	if (ret != 0)
		fail(what);
}

static void send_msg(int sock, const char *msg, const int *fds, int nfds) {
	struct iovec iov = {(void *)msg, strlen(msg)};
	union {
		char buf[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (nfds > 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	while (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0)
		if (errno != EINTR)
			fail("send");
}

/* locked_flags are the flags a remount of path must keep (statvfs). */
static unsigned long locked_flags(const char *path) {
	struct statvfs st;
	if (statvfs(path, &st) != 0)
		fail(path);
	unsigned long out = 0;
	if (st.f_flag & ST_NODEV) out |= MS_NODEV;
	if (st.f_flag & ST_NOEXEC) out |= MS_NOEXEC;
	if (st.f_flag & ST_NOATIME) out |= MS_NOATIME;
	if (st.f_flag & ST_NODIRATIME) out |= MS_NODIRATIME;
	if (st.f_flag & ST_RELATIME) out |= MS_RELATIME;
	return out;
}

/* next_line returns the next '\n'-separated item of *list (NULL at the
 * end), cutting it in place. */
static char *next_line(char **list) {
	if (!*list || !**list)
		return NULL;
	char *item = *list, *nl = strchr(item, '\n');
	if (nl) {
		*nl = 0;
		*list = nl + 1;
	} else {
		*list = NULL;
	}
	return item;
}

/* prepare is zygote.py's _prepare: a fresh /proc with the jail's masks, a
 * /tmp and /dev/shm of the spare's own, loopback up. */
static void prepare(char *masks, char *readonly) {
	check(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "make / private");
	check(umount2("/tmp", MNT_DETACH), "detach the template's /tmp");
	check(mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=65536,mode=1777"), "mount /tmp");
	check(mkdir("/tmp/.proc", 0777), "mkdir /tmp/.proc");
	check(mount("proc", "/tmp/.proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mount proc");
	char path[4096];
	for (char *m; (m = next_line(&masks));) {
		snprintf(path, sizeof path, "/tmp/.proc/%s", m + 1);
		if (m[0] == 'd')
			check(mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0"), path);
		else
			check(mount("/dev/null", path, NULL, MS_BIND, NULL), path);
	}
	for (char *r; (r = next_line(&readonly));) {
		snprintf(path, sizeof path, "/tmp/.proc/%s", r);
		check(mount(path, path, NULL, MS_BIND | MS_REC, NULL), path);
		check(mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | locked_flags(path), NULL), path);
	}
	check(umount2("/dev/shm", MNT_DETACH), "detach the template's /dev/shm");
	check(mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,nr_inodes=16384,mode=1777"), "mount /dev/shm");
	check(umount2("/workspace", MNT_DETACH), "detach the template's workspace");
	check(umount2("/proc", MNT_DETACH), "detach the template's /proc");
	check(mount("/tmp/.proc", "/proc", NULL, MS_MOVE, NULL), "move /proc");
	check(rmdir("/tmp/.proc"), "rmdir /tmp/.proc");
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0)
		fail("loopback");
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
		fail("loopback up");
	close(s);
}

/* lock_bounding is zygote.py's _lock_bounding. */
static void lock_bounding(long last_cap) {
	for (long c = 0; c <= last_cap; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL)
			fail("drop capability");
	check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities");
	check(prctl(PR_SET_SECUREBITS, 1 | 2 | 4 | 8 | 32 | 64 | 128, 0, 0, 0), "set securebits");
	check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs");
}

/* A minimal reader of the host's request (a JSON object, forkRequest):
 * the top-level numbers and strings it names; other values skipped. */
static const char *skip_ws(const char *p) {
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* parse_string reads a JSON string at p (at its quote) into out (cap
 * bytes, NUL-terminated; NULL to skip it); returns the end or NULL. */
static const char *parse_string(const char *p, char *out, size_t cap) {
	size_t n = 0;
	if (*p++ != '"')
		return NULL;
	for (;;) {
		unsigned c = (unsigned char)*p++;
		if (c == 0)
			return NULL;
		if (c == '"')
			break;
		if (c == '\\') {
			c = (unsigned char)*p++;
			switch (c) {
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case '"': case '\\': case '/': break;
			case 'u': {
				unsigned v = 0;
				for (int i = 0; i < 4; i++) {
					char h = *p++;
					v <<= 4;
					if (h >= '0' && h <= '9') v |= h - '0';
					else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
					else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
					else return NULL;
				}
				if (v >= 0xd800 && v < 0xe000)
					return NULL; /* (no surrogates in the names we read) */
				char u[3];
				int k = 0;
				if (v < 0x80) u[k++] = (char)v;
				else if (v < 0x800) { u[k++] = (char)(0xc0 | v >> 6); u[k++] = (char)(0x80 | (v & 0x3f)); }
				else { u[k++] = (char)(0xe0 | v >> 12); u[k++] = (char)(0x80 | ((v >> 6) & 0x3f)); u[k++] = (char)(0x80 | (v & 0x3f)); }
				for (int i = 0; i < k; i++) {
					if (out && n + 1 >= cap)
						return NULL;
					if (out)
						out[n] = u[i];
					n++;
				}
				continue;
			}
			default: return NULL;
			}
		}
		if (out && n + 1 >= cap)
			return NULL;
		if (out)
			out[n] = (char)c;
		n++;
	}
	if (out)
		out[n] = 0;
	return p;
}

static const char *skip_value(const char *p) {
	p = skip_ws(p);
	if (*p == '"')
		return parse_string(p, NULL, 0);
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		p = skip_ws(p + 1);
		if (*p == close)
			return p + 1;
		for (;;) {
			if (close == '}') {
				if (!(p = parse_string(skip_ws(p), NULL, 0)))
					return NULL;
				p = skip_ws(p);
				if (*p++ != ':')
					return NULL;
			}
			if (!(p = skip_value(p)))
				return NULL;
			p = skip_ws(p);
			if (*p == close)
				return p + 1;
			if (*p++ != ',')
				return NULL;
		}
	}
	while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n')
		p++;
	return p;
}

struct request {
	long long tmp_size, nofile, fsize, stack, listen;
	char workspace[4096], workspace_sub[256];
};

static int parse_request(const char *p, struct request *r) {
	memset(r, 0, sizeof *r);
	p = skip_ws(p);
	if (*p++ != '{')
		return -1;
	p = skip_ws(p);
	if (*p == '}')
		return 0;
	for (;;) {
		char key[32];
		if (!(p = parse_string(skip_ws(p), key, sizeof key))) {
			/* a key longer than ours: not one we read */
			return -1;
		}
		p = skip_ws(p);
		if (*p++ != ':')
			return -1;
		p = skip_ws(p);
		long long *num = NULL;
		char *str = NULL;
		size_t cap = 0;
		if (!strcmp(key, "tmp_size")) num = &r->tmp_size;
		else if (!strcmp(key, "nofile")) num = &r->nofile;
		else if (!strcmp(key, "fsize")) num = &r->fsize;
		else if (!strcmp(key, "stack")) num = &r->stack;
		else if (!strcmp(key, "listen")) num = &r->listen;
		else if (!strcmp(key, "workspace")) str = r->workspace, cap = sizeof r->workspace;
		else if (!strcmp(key, "workspace_sub")) str = r->workspace_sub, cap = sizeof r->workspace_sub;
		if (num) {
			char *end;
			errno = 0;
			*num = strtoll(p, &end, 10);
			if (errno || end == p)
				return -1;
			p = end;
		} else if (str) {
			if (!(p = parse_string(p, str, cap)))
				return -1;
		} else if (!(p = skip_value(p))) {
			return -1;
		}
		p = skip_ws(p);
		if (*p == '}')
			return 0;
		if (*p++ != ',')
			return -1;
	}
}

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#define OPEN_TREE_CLONE_ 1
#define MOVE_MOUNT_F_EMPTY_PATH_ 4

/* mount_session is zygote.py's _mount_session (with _clone_subdir and
 * _clone_workspace). */
static void mount_session(struct request *r, int ws_fd, const char *workspaces) {
	char data[96];
	snprintf(data, sizeof data, "size=%lld,nr_inodes=65536,mode=1777", r->tmp_size);
	check(mount(NULL, "/tmp", NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV, data), "size /tmp");
	snprintf(data, sizeof data, "size=%lld,nr_inodes=16384,mode=1777", r->tmp_size);
	check(mount(NULL, "/dev/shm", NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, data), "size /dev/shm");
	if ((mkdir("/tmp/.sandloop", 0777) && errno != EEXIST) || (mkdir("/tmp/.sandloop/matplotlib", 0777) && errno != EEXIST) ||
	    (mkdir("/tmp/.sandloop/cache", 0777) && errno != EEXIST))
		fail("mkdir /tmp/.sandloop");
	int tree;
	if (r->workspace_sub[0]) {
		const char *sub = r->workspace_sub;
		if (strchr(sub, '/') || !strcmp(sub, ".") || !strcmp(sub, "..")) {
			errno = EINVAL;
			fail("bad workspace directory");
		}
		tree = (int)syscall(SYS_open_tree, ws_fd, sub, OPEN_TREE_CLONE_ | O_CLOEXEC | AT_SYMLINK_NOFOLLOW);
		close(ws_fd);
		if (tree < 0)
			fail("clone the workspace");
		if (workspaces[0])
			check(umount2(workspaces, MNT_DETACH), "detach the workspaces");
	} else if (workspaces[0]) {
		const char *rel = r->workspace;
		int bad = rel[0] == 0 || rel[0] == '/';
		for (const char *p = rel; !bad && *p;) {
			const char *e = strchr(p, '/');
			size_t n = e ? (size_t)(e - p) : strlen(p);
			bad = n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.');
			p += n + (e != NULL);
			if (e && !*p)
				bad = 1;
		}
		if (bad) {
			errno = EINVAL;
			fail("bad workspace path");
		}
		char path[8192];
		snprintf(path, sizeof path, "%s/%s", workspaces, rel);
		tree = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE_ | O_CLOEXEC | AT_SYMLINK_NOFOLLOW);
		if (tree < 0)
			fail("clone the workspace");
		struct stat a, b;
		if (fstat(tree, &a) || fstat(ws_fd, &b))
			fail("stat the workspace");
		close(ws_fd);
		if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
			errno = EXDEV;
			fail("the workspace was replaced while the session started");
		}
		check(umount2(workspaces, MNT_DETACH), "detach the workspaces");
	} else {
		tree = ws_fd;
	}
	check((int)syscall(SYS_move_mount, tree, "", AT_FDCWD, "/workspace", MOVE_MOUNT_F_EMPTY_PATH_), "attach workspace");
	close(tree);
	check(mount(NULL, "/workspace", NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | locked_flags("/workspace"), NULL), "remount /workspace");
}

static int hexval(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	return -1;
}

static int spare(int argc, char **argv) {
	long kpid, sock, ours, last_cap;
	if (argc != 10 || !number(argv[2], &kpid) || !number(argv[3], &sock) || !number(argv[4], &ours) ||
	    !number(argv[8], &last_cap) || kpid <= 1) {
		static const char usage[] = "usage: reaper spare KERNEL_PID SOCKET_FD KERNEL_SOCKET_FD FILTER MASKS READONLY LAST_CAP WORKSPACES\n";
		if (write(2, usage, sizeof usage - 1) < 0) {
		}
		return 2;
	}
	kernel_pid = (pid_t)kpid;
	report_sock = (int)sock;
	/* The filter, decoded now (before any session waits). */
	size_t hexlen = strlen(argv[5]);
	static struct sock_filter insns[BPF_MAXINSNS];
	if (hexlen % 16 != 0 || hexlen / 16 > BPF_MAXINSNS) {
		errno = EINVAL;
		fail("seccomp filter");
	}
	unsigned char *f = (unsigned char *)insns;
	for (size_t i = 0; i < hexlen; i += 2) {
		int hi = hexval(argv[5][i]), lo = hexval(argv[5][i + 1]);
		if (hi < 0 || lo < 0) {
			errno = EINVAL;
			fail("seccomp filter");
		}
		f[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	struct sock_fprog prog = {(unsigned short)(hexlen / 16), insns};
	fcntl((int)sock, F_SETFD, FD_CLOEXEC);
	fcntl((int)ours, F_SETFD, FD_CLOEXEC);

	prepare(argv[6], argv[7]);
	lock_bounding(last_cap);
	send_msg((int)sock, "{\"hello\":\"reaper\"}", NULL, 0);

	stage = "arm the spare";
	char arm[16];
	ssize_t n = recv((int)sock, arm, sizeof arm, 0);
	if (n != 3 || memcmp(arm, "arm", 3) != 0)
		_exit(0); /* the host gave up */
	check(unshare(CLONE_NEWCGROUP), "unshare cgroup namespace");
	send_msg((int)ours, "arm", NULL, 0);

	/* The session: its settings and six descriptors. */
	static char msg[1 << 20];
	int fds[7];
	union {
		char buf[CMSG_SPACE(sizeof fds)];
		struct cmsghdr align;
	} u;
	struct iovec iov = {msg, sizeof msg - 1};
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof u.buf;
	do
		n = recvmsg((int)sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	int nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k && nfds < 7; i++)
				memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		}
	if (n <= 0 || nfds != 6 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		_exit(0);
	msg[n] = 0;

	stage = "build the session's jail";
	fail_code = 126;
	static struct request req;
	if (parse_request(msg, &req) != 0) {
		errno = EINVAL;
		fail("the session's settings");
	}
	mount_session(&req, fds[5], argv[9]);
	int listener = -1;
	if (req.listen) {
		listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int one = 1;
		struct sockaddr_in sin = {0};
		sin.sin_family = AF_INET;
		sin.sin_port = htons((unsigned short)req.listen);
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
		    bind(listener, (struct sockaddr *)&sin, sizeof sin) || listen(listener, 512))
			fail("listen");
	}
	send_msg((int)ours, msg, fds, 5);
	for (int i = 0; i < 5; i++)
		close(fds[i]);
	close((int)ours);
	struct {
		int res;
		long long v;
	} limits[] = {{RLIMIT_NOFILE, req.nofile}, {RLIMIT_FSIZE, req.fsize}, {RLIMIT_CORE, 0}, {RLIMIT_STACK, req.stack}};
	for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
		struct rlimit rl = {(rlim_t)limits[i].v, (rlim_t)limits[i].v};
		check(setrlimit(limits[i].res, &rl), "setrlimit");
	}
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof data);
	check((int)syscall(SYS_capset, &hdr, data), "capset");
	check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), "load seccomp filter");
	send_msg((int)sock, "{\"locked\":true}", &listener, listener >= 0 ? 1 : 0);
	if (listener >= 0)
		close(listener);
	reap((int)sock);
	return 0;
}

int main(int argc, char **argv) {
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (argc > 1 && !strcmp(argv[1], "spare"))
		return spare(argc, argv);
	long kpid, sock;
	if (argc != 3 || !number(argv[1], &kpid) || !number(argv[2], &sock) || kpid <= 1 || sock < 0) {
		static const char usage[] = "usage: reaper KERNEL_PID SOCKET_FD\n";
		if (write(2, usage, sizeof usage - 1) < 0) {
		}
		return 2;
	}
	kernel_pid = (pid_t)kpid;
	reap((int)sock);
}
