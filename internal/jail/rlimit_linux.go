package jail

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// setRlimits applies the per-process limits: always NOFILE, FSIZE, CORE
// and STACK; DATA and NPROC where no cgroup enforces memory and pids.
// NPROC is counted per user per user namespace, so it bounds this jail
// alone.
func setRlimits(cfg *initConfig) error {
	l := cfg.Limits
	type rlimit struct {
		name string
		res  int
		val  uint64
	}
	set := []rlimit{
		{"NOFILE", unix.RLIMIT_NOFILE, uint64(l.NoFile)},
		{"FSIZE", unix.RLIMIT_FSIZE, uint64(l.FileSize)},
		{"CORE", unix.RLIMIT_CORE, 0},
		{"STACK", unix.RLIMIT_STACK, uint64(l.Stack)},
	}
	if cfg.RlimitMemory {
		set = append(set, rlimit{"DATA", unix.RLIMIT_DATA, uint64(l.Memory)})
	}
	if cfg.RlimitPids {
		set = append(set, rlimit{"NPROC", unix.RLIMIT_NPROC, uint64(l.Pids)})
	}
	for _, s := range set {
		if err := unix.Setrlimit(s.res, &unix.Rlimit{Cur: s.val, Max: s.val}); err != nil {
			return fmt.Errorf("setrlimit %s=%d: %w", s.name, s.val, err)
		}
	}
	return nil
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

func readFileString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
