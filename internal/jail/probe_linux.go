package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// containersDoc is where each container setting is explained.
const containersDoc = "docs/containers.md"

// Probe reports what this host supports, without starting a jail (it
// starts /bin/true in new namespaces to see whether it may).
func Probe() HostReport {
	r := HostReport{Root: os.Geteuid() == 0, HostID: os.Getuid(), Container: container()}
	if r.Root {
		r.HostID = HostID
	}
	r.UserNamespaces = probeUserNS(r.Root, r.Container)
	var missing []string
	for _, ns := range []string{"pid", "mnt", "net", "ipc", "uts", "cgroup", "user"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	if len(missing) == 0 {
		r.Namespaces = Check{OK: true, Detail: "pid, mount, network, ipc, uts, cgroup"}
	} else {
		r.Namespaces = Check{Detail: "missing: " + strings.Join(missing, ", "),
			Fix: "use a kernel built with CONFIG_" + strings.ToUpper(strings.Join(missing, "_NS, CONFIG_")) + "_NS"}
	}
	if SeccompSupported() {
		r.Seccomp = Check{OK: true, Detail: "filter mode"}
	} else {
		r.Seccomp = Check{Detail: "the kernel has no seccomp filter support", Fix: "use a kernel built with CONFIG_SECCOMP_FILTER"}
	}
	const landlockCreateRulesetVersion = 1
	if v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, landlockCreateRulesetVersion); errno == 0 {
		r.Landlock = Check{OK: true, Detail: fmt.Sprintf("ABI v%d (not required: the mount namespace already hides the host)", v)}
	} else {
		r.Landlock = Check{Detail: "unavailable (" + errno.Error() + "); not required"}
	}
	h := detectCgroups()
	switch {
	case h.mode == "cgroup v1":
		r.Cgroups = Check{OK: true, Detail: "cgroup v1: memory, pids, cpu, cpuacct"}
	case h.mode != "":
		r.Cgroups = Check{OK: true, Detail: h.mode + ": memory, pids, cpu under " + h.v2}
		if b := filepath.Base(h.v2); strings.HasPrefix(b, "sandloop-") && strings.HasSuffix(b, ".scope") {
			r.Cgroups.Detail += " (a scope systemd made for sandloop, Delegate=yes)"
		}
	default:
		r.Cgroups = Check{Fallback: true, Detail: h.reason + "; limits fall back to rlimits (memory: RLIMIT_DATA, processes: RLIMIT_NPROC, CPU: not limited)",
			Fix: cgroupFix(r.Root, r.Container)}
	}
	r.Pause = FreezeSupport()
	return r
}

func cgroupFix(root bool, ctr string) string {
	switch {
	case ctr != "":
		return "give the container its own writable cgroup: --cgroupns=private with a user namespace (Podman: --userns=auto), see " + containersDoc
	case root:
		return "systemd-run --scope -p Delegate=yes sandloop ..., or the service deploy/systemd/sandloop.service"
	}
	return "systemd-run --user --scope -p Delegate=yes sandloop ..., or the user service deploy/systemd/sandloop-user.service"
}

// probeUserNS starts /bin/true in the namespaces a jail uses and, if it
// cannot, names the setting that forbids them and its fix.
func probeUserNS(root bool, ctr string) Check {
	maxNS := readFileString("/proc/sys/user/max_user_namespaces")
	err := tryNamespaces(root)
	if err == nil {
		// Ubuntu's restriction lets the namespace be made but strips its
		// capabilities, unless an AppArmor profile grants userns.
		if !root && readFileString("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" && !strings.Contains(readFileString("/proc/self/attr/current"), "sandloop") {
			return Check{Detail: "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)",
				Fix: "install deploy/apparmor/sandloop: sudo cp deploy/apparmor/sandloop /etc/apparmor.d/ && sudo apparmor_parser -r /etc/apparmor.d/sandloop"}
		}
		return Check{OK: true, Detail: "max " + maxNS}
	}
	switch {
	case maxNS == "0":
		return Check{Detail: "disabled: user.max_user_namespaces is 0", Fix: "sudo sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/)"}
	case !root && readFileString("/proc/sys/kernel/unprivileged_userns_clone") == "0":
		return Check{Detail: "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)",
			Fix: "sudo sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/), or run as root"}
	case ctr != "":
		return Check{Detail: "the container refuses new namespaces (" + err.Error() + "): its seccomp profile (Docker's default allows them only with CAP_SYS_ADMIN) or AppArmor profile",
			Fix: "run the container with --security-opt seccomp=deploy/seccomp/sandloop.json --security-opt apparmor=unconfined and a user namespace (--userns=auto), see " + containersDoc}
	}
	return Check{Detail: "cannot create namespaces: " + err.Error(), Fix: "check the kernel's user namespace settings and any seccomp or LSM policy applied to this process"}
}

// tryNamespaces starts /bin/true in a new user, mount, PID, network, IPC
// and UTS namespace, as a jail's init is started.
func tryNamespaces(root bool) error {
	path := "/bin/true"
	if _, err := os.Stat(path); err != nil {
		path = "/usr/bin/true"
	}
	uid, gid := os.Getuid(), os.Getgid()
	if root {
		uid, gid = HostID, HostID
	}
	cmd := exec.Command(path)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: SandboxUID, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: SandboxGID, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil // it ran
	}
	return err
}

// container names the container runtime this process runs in, or "".
func container() string {
	switch {
	case exists("/run/.containerenv"):
		return "podman"
	case exists("/.dockerenv"):
		return "docker"
	}
	if v := os.Getenv("container"); v != "" {
		return v
	}
	if env, err := os.ReadFile("/proc/1/environ"); err == nil {
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "container="); ok && v != "" {
				return v
			}
		}
	}
	return ""
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

// ProbeConfinement reports how the runtime confines this process.
func ProbeConfinement() Confinement {
	var c Confinement
	// The host's user namespace maps every uid to itself.
	if m := strings.Fields(readFileString("/proc/self/uid_map")); len(m) != 3 || m[0] != "0" || m[1] != "0" || m[2] != "4294967295" {
		c.OwnUserNS = true
	}
	for _, line := range strings.Split(readFileString("/proc/self/mountinfo"), "\n") {
		// id parent major:minor root mountpoint ...
		// binfmt_misc is mounted on a directory procfs keeps empty, which
		// the kernel does not count against a new procfs.
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], "/proc/") && f[4] != "/proc/sys/fs/binfmt_misc" {
			c.MaskedProc = append(c.MaskedProc, f[4])
		}
	}
	// Each call below fails on its arguments before any permission check
	// when it is allowed, so EPERM can only come from a seccomp filter:
	// unshare(0) changes nothing, mount on "" and setns on -1 are invalid.
	if unix.Unshare(0) == unix.EPERM {
		c.SeccompBlocked = append(c.SeccompBlocked, "unshare")
	}
	if unix.Mount("none", "", "", 0, "") == unix.EPERM {
		c.SeccompBlocked = append(c.SeccompBlocked, "mount")
	}
	if unix.Setns(-1, 0) == unix.EPERM {
		c.SeccompBlocked = append(c.SeccompBlocked, "setns")
	}
	if readFileString("/sys/module/apparmor/parameters/enabled") == "Y" {
		c.AppArmor = readFileString("/proc/self/attr/apparmor/current")
		if c.AppArmor == "" {
			c.AppArmor = readFileString("/proc/self/attr/current")
		}
	}
	return c
}
