package jail

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// pidMaxLimit is the kernel's ceiling for kernel.pid_max (and pids.max).
const pidMaxLimit = 4 << 20

// MaxPids is the largest Limits.Pids this host can honour: kernel.pid_max,
// less the room kept for the jail's init (a cgroup refuses a pids.max above
// the kernel's limit).
func MaxPids() int {
	n := pidMaxLimit
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			n = min(v, pidMaxLimit)
		}
	}
	return n - initThreads
}

// HostMemory is this host's memory and swap in bytes (0 if unknown): a
// memory limit above it limits nothing.
func HostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "MemTotal" && k != "SwapTotal" {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err == nil {
			total += kib << 10
		}
	}
	return total
}
