package host

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// filesPerSession is what the server holds open for one session (9
// measured by bench/load -mode idle: 4 pipes, 2 sockets, 2 pidfds, an
// eventfd) with room to spare; filesBase is the rest of the server.
const filesPerSession, filesBase = 12, 1024

// raiseFileLimit makes room for maxSessions sessions' open files. Go
// raises the soft limit to the hard one at start, but a hard limit of a
// few thousand (common in containers) fails creates with EMFILE long
// before --max-sessions: the hard limit is raised where the process may
// (root: CAP_SYS_RESOURCE), up to fs.nr_open; where it cannot, a warning
// says what to raise. It returns the soft limit in force.
func raiseFileLimit(maxSessions int, log *slog.Logger) uint64 {
	want := uint64(filesBase + filesPerSession*maxSessions)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur >= want {
		return rl.Cur
	}
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if nr, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && nr < want {
			want = nr
		}
	}
	next := syscall.Rlimit{Cur: want, Max: max(want, rl.Max)}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next) == nil {
		log.Info("raised the open files limit for --max-sessions", "from", rl.Cur, "to", want, "max_sessions", maxSessions)
		return want
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	log.Warn("the open files limit is too low for --max-sessions: creates will fail with 'too many open files' before it; raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=) or lower --max-sessions",
		"limit", rl.Cur, "max_sessions", maxSessions, "needs", want)
	return rl.Cur
}
