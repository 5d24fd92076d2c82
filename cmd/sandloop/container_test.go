package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sandloop inside a container, run by crun from an OCI bundle whose root is
// this host's /usr and /etc (read-only): with the settings
// docs/containers.md gives (a user namespace, deploy/seccomp/sandloop.json,
// /proc unmasked, a cgroup namespace) the jail's attack tests pass, a
// session keeps its state and memory limits hold (on a cgroup v2 host in
// the container's own delegated group, on cgroup v1 as rlimits); with Docker's stock settings (its default
// seccomp profile, masked /proc, no user namespace) doctor fails with the
// fix, and nothing crashes.

// dockerCaps are the capabilities Docker and Podman give a container by default.
var dockerCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// dockerMasked and dockerReadOnly are the /proc and /sys paths Docker hides.
var (
	dockerMasked = []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
		"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	dockerReadOnly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// ociSeccomp turns a Docker-format seccomp profile (as shipped in deploy/)
// into the OCI runtime spec's form for an x86_64 container holding caps, as
// Docker and Podman do when they start a container with it.
func ociSeccomp(t *testing.T, path string, caps []string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type filter struct {
		Caps   []string `json:"caps"`
		Arches []string `json:"arches"`
	}
	var p struct {
		DefaultAction   string `json:"defaultAction"`
		DefaultErrnoRet *int   `json:"defaultErrnoRet"`
		Syscalls        []struct {
			Names    []string         `json:"names"`
			Action   string           `json:"action"`
			ErrnoRet *int             `json:"errnoRet"`
			Args     []map[string]any `json:"args"`
			Includes filter           `json:"includes"`
			Excludes filter           `json:"excludes"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	const arch = "amd64"
	var rules []map[string]any
	for _, r := range p.Syscalls {
		if len(r.Includes.Arches) > 0 && !slices.Contains(r.Includes.Arches, arch) || slices.Contains(r.Excludes.Arches, arch) {
			continue
		}
		held := func(c string) bool { return slices.Contains(caps, c) }
		if !all(r.Includes.Caps, held) || slices.ContainsFunc(r.Excludes.Caps, held) {
			continue
		}
		rule := map[string]any{"names": r.Names, "action": r.Action}
		if r.ErrnoRet != nil {
			rule["errnoRet"] = *r.ErrnoRet
		}
		if len(r.Args) > 0 {
			rule["args"] = r.Args
		}
		rules = append(rules, rule)
	}
	out := map[string]any{"defaultAction": p.DefaultAction, "architectures": []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}, "syscalls": rules}
	if p.DefaultErrnoRet != nil {
		out["defaultErrnoRet"] = *p.DefaultErrnoRet
	}
	return out
}

func all[T any](list []T, f func(T) bool) bool {
	for _, x := range list {
		if !f(x) {
			return false
		}
	}
	return true
}

// containerSettings are a container's security settings.
type containerSettings struct {
	seccomp  string // path of a Docker-format profile
	userns   bool   // a user namespace: container root is host uid 100000
	unmasked bool   // /proc not masked
}

// inContainer runs args (the first a path inside the container: /opt is
// dir, read-only) in a container built by crun and returns its exit code
// and output.
func inContainer(t *testing.T, dir string, s containerSettings, env []string, args ...string) (int, string) {
	t.Helper()
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"usr", "etc", "opt", "proc", "dev", "sys", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} { // Debian 12 has merged /usr
		if target, err := os.Readlink("/" + l); err == nil {
			os.Symlink(target, filepath.Join(rootfs, l))
		}
	}
	bind := func(src, dst string) map[string]any {
		return map[string]any{"destination": dst, "type": "bind", "source": src, "options": []string{"rbind", "ro", "nosuid", "nodev"}}
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
		{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": []string{"nosuid", "noexec", "nodev", "relatime", "rw"}},
		{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
		{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=755"}},
		bind("/usr", "/usr"), bind("/etc", "/etc"), bind(dir, "/opt"),
	}
	namespaces := []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}}
	linux := map[string]any{
		"namespaces": namespaces,
		"seccomp":    ociSeccomp(t, s.seccomp, dockerCaps),
	}
	if s.userns {
		linux["namespaces"] = append(namespaces, map[string]string{"type": "user"})
		linux["uidMappings"] = []map[string]int{{"containerID": 0, "hostID": 100000, "size": 65536}}
		linux["gidMappings"] = []map[string]int{{"containerID": 0, "hostID": 100000, "size": 65536}}
	}
	if !s.unmasked {
		linux["maskedPaths"], linux["readonlyPaths"] = dockerMasked, dockerReadOnly
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0},
			"args": args,
			// container= tells programs they run in a container, as Podman
			// and systemd-nspawn set it.
			"env":             append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "container=oci"}, env...),
			"cwd":             "/tmp",
			"capabilities":    map[string][]string{"bounding": dockerCaps, "effective": dockerCaps, "permitted": dockerCaps},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": "rootfs", "readonly": true},
		"hostname": "sandloop-test",
		"mounts":   mounts,
		"linux":    linux,
	}
	id := "sandloop-test-" + randomHex()
	if cgroupV2Host() {
		// The container gets a group of its own, which crun hands to
		// the container's root (in its user namespace) and shows as
		// the root of the container's cgroup namespace.
		linux["cgroupsPath"] = "/" + id
	}
	data, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	crun := "exec crun --cgroup-manager=cgroupfs run --bundle \"$1\" \"$2\""
	if exists("/sys/fs/cgroup/unified/cgroup.controllers") {
		// A hybrid host (v1 controllers, a v2 hierarchy beside them),
		// which crun refuses: hide the v2 one from it.
		crun = "umount /sys/fs/cgroup/unified && exec crun --cgroup-manager=disabled run --bundle \"$1\" \"$2\""
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", crun, "sh", bundle, id)
	out, err := cmd.CombinedOutput()
	exec.Command("crun", "delete", "--force", id).Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("crun: %v\n%s", err, out)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// containerDir skips the test where containers cannot run, and returns
// a directory holding the built sandloop (mounted as /opt in containers)
// and the repository's root.
func containerDir(t *testing.T) (dir, root string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs containers")
	}
	if _, err := exec.LookPath("crun"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and crun (scripts/deps.sh installs it)")
	}
	dir, err := os.MkdirTemp("", "sandloop-container-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "sandloop")
	if data, err := os.ReadFile(builtBinary(t)); err != nil || os.WriteFile(bin, data, 0o755) != nil {
		t.Fatal("copy sandloop", err)
	}
	root, _ = filepath.Abs("../..")
	return dir, root
}

func TestInContainer(t *testing.T) {
	dir, root := containerDir(t)
	if out, err := exec.Command("go", "test", "-c", "-o", filepath.Join(dir, "jail.test"), filepath.Join(root, "internal/jail")).CombinedOutput(); err != nil {
		t.Fatalf("build the jail's tests: %v\n%s", err, out)
	}
	safe := containerSettings{seccomp: filepath.Join(root, "deploy/seccomp/sandloop.json"), userns: true, unmasked: true}

	t.Run("documented settings", func(t *testing.T) {
		// (--timeout: under emulation, as in make test-vm, importing the
		// packages takes minutes.)
		code, out := inContainer(t, dir, safe, nil, "/opt/sandloop", "doctor", "--timeout", "10m")
		if code != 0 || strings.Contains(out, "FAIL") || !strings.Contains(out, "in a container") || !strings.Contains(out, "ok    jail") || strings.Contains(out, "pod ") {
			t.Fatalf("doctor in the container: exit %d\n%s", code, out)
		}
		t.Logf("doctor in the container:\n%s", out)
		// Limits: on a cgroup v2 host the container's own group, which
		// crun delegated to it, holds a group per sandbox, so a memory
		// limit is the kernel's and an OOM kill is reported as one. On a
		// cgroup v1 host the container's cgroups are read-only: rlimits,
		// and doctor and exec say so.
		bomb := "b = []\nwhile True: b.append(bytearray(8 << 20))"
		bombCode, bombOut := inContainer(t, dir, safe, nil, "/opt/sandloop", "exec", "--memory", "64M", "-c", bomb)
		if cgroupV2Host() {
			if !regexp.MustCompile(`(?m)^ok +cgroups +cgroup v2: memory, pids, cpu under /sys/fs/cgroup$`).MatchString(out) {
				t.Errorf("doctor in a container with a delegated cgroup v2 group, want cgroup v2 under /sys/fs/cgroup:\n%s", out)
			}
			if bombCode != 137 || !strings.Contains(bombOut, "sandloop: out of memory: the sandbox's memory limit (64M) was reached") {
				t.Errorf("a memory bomb under --memory 64M: exit %d, want 137 and the OOM kill reported\n%s", bombCode, bombOut)
			}
		} else {
			if !regexp.MustCompile(`(?m)^warn +cgroups +cgroup v1: .*not writable`).MatchString(out) {
				t.Errorf("doctor in a container with read-only cgroup v1, want a warning:\n%s", out)
			}
			// (The jail's init shares the program's RLIMIT_DATA, and may
			// itself fail to allocate when the program hits it: not
			// asserted here.)
			if bombCode == 0 || !strings.Contains(bombOut, "sandloop: warning: no cgroups") {
				t.Errorf("a memory bomb under --memory 64M with rlimits: exit %d, want a failure and the rlimits warning\n%s", bombCode, bombOut)
			}
		}
		t.Logf("a memory bomb in the container: exit %d\n%s", bombCode, bombOut)
		// The attack tests (host files, other processes, the network,
		// devices, escapes), as root in the container.
		code, out = inContainer(t, dir, safe, nil, "/opt/jail.test", "-test.run", "^(TestAttacksFail|TestNoInheritedDescriptors|TestForkBombStoppedByPidsLimit|TestDoubleForkedDaemonGone)$", "-test.v")
		if code != 0 || !strings.Contains(out, "--- PASS: TestAttacksFail") {
			t.Fatalf("attack tests in the container: exit %d\n%s", code, out)
		}
		// A session keeps its state from one cell to the next.
		code, out = inContainer(t, dir, safe, nil, "/bin/sh", "-c", `printf 'x = 41\nprint(x + 1)\n' | /opt/sandloop repl`)
		if code != 0 || !strings.Contains(out, "42") {
			t.Fatalf("a session in the container: exit %d\n%s", code, out)
		}
	})

	t.Run("Docker's stock settings", func(t *testing.T) {
		stock := containerSettings{seccomp: filepath.Join(root, "deploy/seccomp/docker-default.json")}
		code, out := inContainer(t, dir, stock, nil, "/opt/sandloop", "doctor")
		if code != 1 || !strings.Contains(out, "FAIL  user namespaces") || !strings.Contains(out, "seccomp=deploy/seccomp/sandloop.json") ||
			!strings.Contains(out, "a safe sandbox cannot be built") || strings.Contains(out, "goroutine ") {
			t.Errorf("doctor under Docker's stock settings: exit %d\n%s", code, out)
		}
		code, out = inContainer(t, dir, stock, nil, "/opt/sandloop", "exec", "-c", "print(1)")
		if code == 0 || strings.Contains(out, "goroutine ") || strings.Count(strings.TrimSpace(out), "\n") > 0 || !strings.Contains(out, "sandloop doctor") {
			t.Errorf("exec under Docker's stock settings: exit %d\n%s", code, out)
		}
		t.Logf("exec under Docker's stock settings: exit %d: %s", code, out)
	})
}

// TestDoctorInPod runs doctor in containers that look like Kubernetes pods
// (KUBERNETES_SERVICE_HOST set) with the chart's settings, and with one
// missing at a time: doctor names the missing pod setting and fails, or
// passes when nothing is missing. (AppArmor cannot be taken away here: the
// kernel has none; podChecks' unit test covers it.)
func TestDoctorInPod(t *testing.T) {
	dir, root := containerDir(t)
	pod := []string{"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"}
	chart := containerSettings{seccomp: filepath.Join(root, "deploy/seccomp/sandloop.json"), userns: true, unmasked: true}
	runtimeDefault := filepath.Join(root, "deploy/seccomp/docker-default.json")
	podLine := regexp.MustCompile(`(?m)^(ok  |warn|FAIL|--  )  (pod \w+) `)
	// The pod lines' marks with every setting; each case says what differs.
	allSet := map[string]string{"pod hostUsers": "ok  ", "pod procMount": "ok  ", "pod seccomp": "ok  ", "pod AppArmor": "--  ",
		"pod cgroups": "warn"} // a user namespace's cgroups are not delegated here
	for _, tc := range []struct {
		name string
		s    containerSettings
		want map[string]string // marks that differ from allSet
		fix  string            // what a fix line must say
	}{
		{name: "all settings", s: chart},
		// Kubernetes unmasks /proc only with hostUsers: false, so a pod
		// without it has a masked /proc too.
		{name: "no hostUsers: false", s: containerSettings{seccomp: chart.seccomp},
			want: map[string]string{"pod hostUsers": "FAIL", "pod procMount": "FAIL", "pod cgroups": "ok  "}, fix: "set hostUsers: false in the pod spec"},
		{name: "no procMount: Unmasked", s: containerSettings{seccomp: chart.seccomp, userns: true},
			want: map[string]string{"pod procMount": "FAIL"}, fix: "set securityContext.procMount: Unmasked"},
		{name: "RuntimeDefault seccomp", s: containerSettings{seccomp: runtimeDefault, userns: true, unmasked: true},
			want: map[string]string{"pod seccomp": "FAIL"},
			fix:  "set securityContext.seccompProfile: {type: Localhost, localhostProfile: sandloop.json} (chart value host.seccompProfile)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := inContainer(t, dir, tc.s, pod, "/opt/sandloop", "doctor")
			t.Logf("doctor: exit %d\n%s", code, out)
			if strings.Contains(out, "goroutine ") || !strings.Contains(out, "--    kubernetes        in a pod (KUBERNETES_SERVICE_HOST is set)") {
				t.Fatal("doctor did not see the pod, or crashed")
			}
			want := maps.Clone(allSet)
			maps.Copy(want, tc.want)
			got := map[string]string{}
			for _, m := range podLine.FindAllStringSubmatch(out, -1) {
				got[m[2]] = m[1]
			}
			if !maps.Equal(got, want) {
				t.Errorf("pod lines %q, want %q", got, want)
			}
			if tc.fix == "" {
				if code != 0 || strings.Contains(out, "FAIL") || !strings.Contains(out, "a safe sandbox can be built") {
					t.Errorf("exit %d with every setting", code)
				}
				return
			}
			if code != 1 || !strings.Contains(out, "a safe sandbox cannot be built") || !strings.Contains(out, "fix: "+tc.fix) ||
				!strings.Contains(out, "FAIL  jail              cannot start a sandbox") || !strings.Contains(out, "fix: see the pod lines below") {
				t.Errorf("exit %d; want 1, the failed jail, the verdict and the fix %q", code, tc.fix)
			}
		})
	}
}

// cgroupV2Host says whether this host has cgroup v2 only (the unified
// hierarchy at /sys/fs/cgroup).
func cgroupV2Host() bool { return exists("/sys/fs/cgroup/cgroup.controllers") }

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
