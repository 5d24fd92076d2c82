package jail

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

type rlimit struct {
	name string
	res  int
	val  uint64
}

// setRlimits applies the limits the init shares with the program: NOFILE,
// FSIZE, CORE and STACK.
func setRlimits(cfg *initConfig) error {
	l := cfg.Limits
	return applyRlimits([]rlimit{
		{"NOFILE", unix.RLIMIT_NOFILE, uint64(l.NoFile)},
		{"FSIZE", unix.RLIMIT_FSIZE, uint64(l.FileSize)},
		{"CORE", unix.RLIMIT_CORE, 0},
		{"STACK", unix.RLIMIT_STACK, uint64(l.Stack)},
	})
}

func applyRlimits(set []rlimit) error {
	for _, s := range set {
		if err := unix.Setrlimit(s.res, &unix.Rlimit{Cur: s.val, Max: s.val}); err != nil {
			return fmt.Errorf("setrlimit %s=%d: %w", s.name, s.val, err)
		}
	}
	return nil
}

// programRlimits are DATA and NPROC where no cgroup enforces memory and
// pids. They bind the program, not the init: RLIMIT_DATA counts every
// private writable mapping, and the init's Go runtime maps its heap's
// metadata in large ones, so an init living under a 64 MiB DATA limit dies
// ("out of memory allocating heap arena metadata") as soon as its heap
// grows — while supervising a program that hit the same limit.
// NPROC is counted per user per user namespace, so it bounds this jail
// alone. It counts every task of the user there, the init's threads (the
// same user) included: the program's limit is its own share plus the
// threads the init has when it starts the program, so that --pids 8 means
// 8 of the program's processes and threads, not 8 and the init's spare
// room. The init makes every thread it needs before the fork
// (warmThreads), so none comes out of the program's share later; and it is
// never refused one: its own NPROC is not lowered, and the cgroup keeps
// room for it.
func programRlimits(cfg *initConfig) []rlimit {
	var set []rlimit
	if cfg.RlimitMemory {
		set = append(set, rlimit{"DATA", unix.RLIMIT_DATA, uint64(cfg.Limits.Memory)})
	}
	switch {
	case cfg.ProgramPids > 0:
		set = append(set, rlimit{"NPROC", unix.RLIMIT_NPROC, uint64(cfg.ProgramPids + ownThreads())})
	case cfg.RlimitPids:
		set = append(set, rlimit{"NPROC", unix.RLIMIT_NPROC, uint64(cfg.Limits.Pids)})
	}
	return set
}

// ownThreads is how many threads this process has (at least 1).
func ownThreads() int {
	des, err := os.ReadDir("/proc/self/task")
	if err != nil || len(des) == 0 {
		return initThreads // no /proc: the room the cgroup keeps
	}
	return len(des)
}

// forkWithRlimits starts the program under set without leaving the init
// under it: the init lowers only its soft limits around the fork, so the
// program runs limited from its first instruction, then fixes the
// program's hard limits too (before it can have run any of the user's
// code: it is still starting its interpreter) and raises its own soft
// limits back.
// The set is made (limits(), see programRlimits) just before the fork,
// once the init's garbage collector has run and started its threads.
func forkWithRlimits(limits func() []rlimit, fork func() (int, error)) (int, error) {
	// Room on the heap that is already mapped, for what the fork itself
	// allocates while the init is under the program's DATA limit.
	room := make([]byte, 4<<20)
	room[len(room)-1] = 1
	room = nil
	runtime.GC()
	set := limits()
	if len(set) == 0 {
		return fork()
	}
	old := make([]unix.Rlimit, len(set))
	for i, s := range set {
		if err := unix.Getrlimit(s.res, &old[i]); err != nil {
			return 0, fmt.Errorf("getrlimit %s: %w", s.name, err)
		}
	}
	restore := func() error {
		for i, s := range set {
			if err := unix.Setrlimit(s.res, &old[i]); err != nil {
				return fmt.Errorf("restore the init's %s limit: %w", s.name, err)
			}
		}
		return nil
	}
	for i, s := range set {
		if s.val > old[i].Max {
			return 0, fmt.Errorf("setrlimit %s=%d: above the hard limit %d", s.name, s.val, old[i].Max)
		}
		if err := unix.Setrlimit(s.res, &unix.Rlimit{Cur: s.val, Max: old[i].Max}); err != nil {
			restore()
			return 0, fmt.Errorf("setrlimit %s=%d: %w", s.name, s.val, err)
		}
	}
	pid, err := fork()
	if rerr := restore(); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		if pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
		return 0, err
	}
	for _, s := range set {
		if err := unix.Prlimit(pid, s.res, &unix.Rlimit{Cur: s.val, Max: s.val}, nil); err != nil {
			unix.Kill(pid, unix.SIGKILL)
			return 0, fmt.Errorf("prlimit %s=%d on the program: %w", s.name, s.val, err)
		}
	}
	return pid, nil
}

// loopbackUp brings up "lo" in the jail's fresh network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// readFileString returns the file at path, trimmed, or "" if it cannot be
// read. It reads with plain system calls: the files it is for (cgroup and
// /proc files, a few per session created and closed) gain nothing from
// os.File's poller registration and stat, which took about as long as the
// read itself (issue 26's profile).
func readFileString(path string) string {
	fd, err := openRaw(path, unix.O_RDONLY)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	return readFDString(fd)
}

// readFDString reads fd to its end, trimmed, or "" on an error.
func readFDString(fd int) string {
	var buf [512]byte
	var out []byte
	for {
		n, err := unix.Read(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ""
		}
		if n == 0 {
			break
		}
		out = append(out, buf[:n]...)
	}
	return strings.TrimSpace(string(out))
}

// writeFileString writes val to the existing file at path (a cgroup's
// interface file) in one write, with plain system calls (see
// readFileString). Its errors are *os.PathError, as os.WriteFile's.
func writeFileString(path, val string) error {
	fd, err := openRaw(path, unix.O_WRONLY)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	return writeFDString(fd, path, val)
}

// writeFDString writes val to fd (path's, open for writing) in one write,
// and closes it.
func writeFDString(fd int, path, val string) error {
	var err error
	for {
		_, err = unix.Write(fd, []byte(val))
		if err != unix.EINTR {
			break
		}
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil && cerr != unix.EINTR {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

func openRaw(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
