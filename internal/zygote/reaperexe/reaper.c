/*
 * sandloop-reaper: a forked session's PID 1 once its session has taken it.
 *
 * The spare's Python reaper (zygote.py, _spare) builds the session's jail,
 * locks itself down, reports {"locked":true} and then executes this
 * program, which replaces the copy of the template it was (~1.5 MiB of
 * copied pages and page tables per idle session) with a few pages:
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
 * Built static with libc only (reapergen: gcc -static -Os), so that it runs
 * in any jail's root. It runs under the session's seccomp filter, without
 * capabilities and with no_new_privs, as any program user code starts. The
 * host installs it execute-only, so the process stays non-dumpable across
 * the execve; it says so again first thing in case the file was readable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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

int main(int argc, char **argv) {
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	long kpid, sock;
	if (argc != 3 || !number(argv[1], &kpid) || !number(argv[2], &sock) || kpid <= 1 || sock < 0) {
		static const char usage[] = "usage: reaper KERNEL_PID SOCKET_FD\n";
		if (write(2, usage, sizeof usage - 1) < 0) {
		}
		return 2;
	}
	kernel_pid = (pid_t)kpid;
	/* The Python reaper blocked SIGCHLD (it waited for it with
	 * sigtimedwait); nothing here needs any signal blocked. */
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* Handlers, not SIG_DFL: an init receives only the signals it
	 * handles. */
	static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = forward;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
		sigaction(forwarded[i], &sa, NULL);
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
		while (send((int)sock, msg, (size_t)n, MSG_NOSIGNAL) < 0 && errno == EINTR) {
		}
		_exit(0);
	}
}
