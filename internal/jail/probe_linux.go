package jail

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Probe reports what this host supports, without starting a jail.
func Probe() HostReport {
	r := HostReport{Root: os.Geteuid() == 0, HostID: os.Getuid()}
	if r.Root {
		r.HostID = HostID
	}
	maxNS := readFileString("/proc/sys/user/max_user_namespaces")
	switch {
	case maxNS == "0":
		r.UserNamespaces = Check{false, "disabled: /proc/sys/user/max_user_namespaces is 0"}
	case readFileString("/proc/sys/kernel/unprivileged_userns_clone") == "0" && !r.Root:
		r.UserNamespaces = Check{false, "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)"}
	default:
		r.UserNamespaces = Check{true, "max " + maxNS}
	}
	var missing []string
	for _, ns := range []string{"pid", "mnt", "net", "ipc", "uts", "cgroup", "user"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	if len(missing) == 0 {
		r.Namespaces = Check{true, "pid, mount, network, ipc, uts, cgroup"}
	} else {
		r.Namespaces = Check{false, "missing: " + strings.Join(missing, ", ")}
	}
	if SeccompSupported() {
		r.Seccomp = Check{true, "filter mode"}
	} else {
		r.Seccomp = Check{false, "the kernel has no seccomp filter support"}
	}
	const landlockCreateRulesetVersion = 1
	if v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, landlockCreateRulesetVersion); errno == 0 {
		r.Landlock = Check{true, fmt.Sprintf("ABI v%d (not required: the mount namespace already hides the host)", v)}
	} else {
		r.Landlock = Check{false, "unavailable (" + errno.Error() + "); not required"}
	}
	h := detectCgroups()
	if h.mode != "" {
		detail := h.mode
		if h.mode == "cgroup v1" {
			detail += ": memory, pids, cpu, cpuacct"
		} else {
			detail += ": memory, pids, cpu under " + h.v2
		}
		r.Cgroups = Check{true, detail}
	} else {
		r.Cgroups = Check{false, h.reason + "; limits fall back to rlimits"}
	}
	return r
}

// RunningInits returns the host PIDs of jails this process started whose
// init is still alive (for leak checks).
func RunningInits() []int {
	var out []int
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.HasPrefix(string(cmd), initArg0+"\x00") {
			continue
		}
		stat := readFileString("/proc/" + e.Name() + "/stat")
		// pid (comm) state ppid ...: comm may hold spaces, so split after ")".
		if i := strings.LastIndexByte(stat, ')'); i >= 0 {
			f := strings.Fields(stat[i+1:])
			if len(f) > 1 && f[1] == strconv.Itoa(self) {
				out = append(out, pid)
			}
		}
	}
	return out
}
