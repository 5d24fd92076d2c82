package zygote

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// rootlessChild is set in a test binary run as an unprivileged user by
// asUser.
const rootlessChild = "SANDLOOP_ZYGOTE_ROOTLESS_CHILD"

// Where the zygote cannot work (here: an unprivileged user without a
// delegated cgroup), New says so at once with jail.ErrUnsupported, so that
// sessions start cold instead.
func TestUnsupportedFailsFast(t *testing.T) {
	if os.Getenv(rootlessChild) != "" || os.Geteuid() != 0 {
		if os.Getenv(rootlessChild) == "" && Supported() == nil {
			t.Skip("this user has a delegated cgroup: the zygote works here")
		}
		start := time.Now()
		_, err := New(context.Background(), &Options{Modules: light})
		if !errors.Is(err, jail.ErrUnsupported) || !strings.Contains(err.Error(), "cgroups") {
			t.Fatalf("New without cgroups: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("New took %s to fail: no template should have started", d)
		}
		t.Logf("rootless New: %v", err)
		return
	}
	out := asUser(t, "^TestUnsupportedFailsFast$", nil, nil)
	if !strings.Contains(out, "rootless New: zygote: the zygote needs cgroups: jail: not supported") {
		t.Fatalf("rootless, no delegated cgroup:\n%s", out)
	}
}

// The zygote works without root: an unprivileged user with a delegated
// cgroup (as systemd delegates user@UID.service) forks sessions that are
// jails as a cold session is, with their own limits, from a template in a
// user namespace that user made.
func TestRootlessZygote(t *testing.T) { rootlessZygote(t) }

func rootlessZygote(t *testing.T) string {
	if os.Getenv(rootlessChild) != "" {
		t.Skip("run by the parent")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user (as this user, the other tests fork rootless where Supported allows)")
	}
	setup, env := delegate(t, 65534)
	tests := []string{"TestForkRuns", "TestRootlessWorkspaceOutsideTemp"}
	if !testing.Short() { // (make test's smoke test of the VM runs it short)
		tests = append(tests, "TestForkedSessionIsAJail", "TestSiblingsIsolated", "TestLimitsPerFork", "TestCloseCleansUp", "TestForkQuota", "TestJoinForkedSession", "TestSmallReaper")
	}
	out := asUser(t, "^("+strings.Join(tests, "|")+")$", env, setup)
	for _, name := range tests {
		// (TestForkQuota too: before 6.15 the holder mounts the
		// workspaces and starts the template.)
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass rootless", name)
		}
	}
	if t.Failed() {
		t.Logf("rootless run:\n%s", out)
		return out
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "--- ") || strings.Contains(l, "rootless zygote:") {
			t.Log(strings.TrimSpace(l))
		}
	}
	return out
}

// TestRootlessZygoteHolder is TestRootlessZygote with the workspaces
// mounted by the holder, as kernels before 6.15 have them, on any kernel
// (TestForkQuota then forks from a template the holder started).
func TestRootlessZygoteHolder(t *testing.T) {
	if testutil.KernelBefore(6, 15) {
		t.Skip("TestRootlessZygote uses the holder on this kernel already")
	}
	t.Setenv(jail.HolderForceEnv, "1")
	// (TestForkQuota says how the workspaces are capped; not run -short.)
	if out := rootlessZygote(t); !testing.Short() && !strings.Contains(out, "held there by a helper process") {
		t.Errorf("the workspaces were not the holder's:\n%s", out)
	}
}

// Without root the template sees only the temporary directory: a session
// whose workspace lies elsewhere starts cold, and works.
func TestRootlessWorkspaceOutsideTemp(t *testing.T) {
	outside := os.Getenv("SANDLOOP_TEST_OUTSIDE")
	if os.Geteuid() == 0 || outside == "" {
		t.Skip("rootless, with a workspace outside the temporary directory (TestRootlessZygote runs it)")
	}
	z := newZygote(t, []string{"colorsys"}) // which nothing else imports
	if z.Launcher(outside, jail.Limits{}, nil, 0) != nil {
		t.Fatalf("a launcher for %s, which the template cannot reach", outside)
	}
	forkedFrom := func(ws string) string {
		s, err := session.New(context.Background(), &session.Options{Zygote: z, Workspace: ws})
		if err != nil {
			t.Fatalf("session in %q: %v", ws, err)
		}
		defer s.Close()
		return out(t, s, "import sys, os\nprint('colorsys' in sys.modules, os.listdir('/workspace'))")
	}
	os.WriteFile(filepath.Join(outside, "mine"), nil, 0o644)
	if got := forkedFrom(outside); got != "False ['mine']" {
		t.Errorf("session outside the temporary directory: %q, want a cold one with its workspace", got)
	}
	if got := forkedFrom(t.TempDir()); got != "True []" {
		t.Errorf("session in the temporary directory: %q, want a forked one", got)
	}
}

// asUser runs this test binary as uid and gid 65534 with -test.run run,
// in a temporary directory of its own, and returns its output; setup may
// place it in cgroups.
func asUser(t *testing.T, run string, env []string, setup func(*exec.Cmd)) string {
	t.Helper()
	bin, tmp := testutil.CopyForNobody(t, "sandloop-zygote-rootless-", "zygote.test")
	outside := filepath.Join(filepath.Dir(tmp), "outside")
	os.Mkdir(outside, 0o700)
	os.Chown(outside, testutil.Nobody, testutil.Nobody)
	// A mount below the temp dir, as a root sandloop's tmpfs workspaces
	// are: in the user's namespace it is locked, and the template must
	// still see the workspaces (a plain bind failed with EINVAL in the VM).
	below := filepath.Join(tmp, "mounted-below")
	os.Mkdir(below, 0o700)
	if err := syscall.Mount("tmpfs", below, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(below, syscall.MNT_DETACH) })
	cmd := exec.Command(bin, "-test.run", run, "-test.v", "-test.count=1")
	cmd.Env = append([]string{rootlessChild + "=1", "SANDLOOP_TEST_OUTSIDE=" + outside, "TMPDIR=" + tmp, "PATH=/usr/bin:/bin", "HOME=" + tmp}, env...)
	if v := os.Getenv(jail.HolderForceEnv); v != "" {
		cmd.Env = append(cmd.Env, jail.HolderForceEnv+"="+v)
	}
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if setup != nil {
		setup(cmd)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as an unprivileged user: %v\n%s", err, out)
	}
	return string(out)
}

// delegate makes cgroups owned by uid, as systemd delegates a user's own:
// on cgroup v2 one group (the child starts in it: clone3 into a cgroup),
// else one group per v1 controller the jail uses (the child joins them
// itself, as the user: SANDLOOP_TEST_GROUPS). It skips the test where
// neither can be made.
func delegate(t *testing.T, uid int) (setup func(*exec.Cmd), env []string) {
	t.Helper()
	own := map[string]string{} // controller ("" for v2) -> this process's group
	for _, l := range strings.Split(strings.TrimSpace(readFile("/proc/self/cgroup")), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				own[strings.TrimPrefix(c, "name=")] = f[2]
			}
		}
	}
	var v2 string
	v1 := map[string]string{}
	for _, m := range mountinfo() {
		switch {
		case m.fstype == "cgroup2" && strings.Contains(" "+readFile(filepath.Join(m.point, "cgroup.subtree_control"))+" ", " memory ") &&
			strings.Contains(readFile(filepath.Join(m.point, "cgroup.subtree_control")), "pids"):
			v2 = m.point
		case m.fstype == "cgroup":
			for _, c := range []string{"memory", "pids", "cpu", "cpuacct"} {
				if strings.Contains(","+m.opts+",", ","+c+",") && own[c] != "" && v1[c] == "" {
					v1[c] = filepath.Join(m.point, own[c])
				}
			}
		}
	}
	name := fmt.Sprintf("sandloop-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	mk := func(parent string) string {
		g := filepath.Join(parent, name)
		if err := os.Mkdir(g, 0o755); err != nil {
			t.Skipf("cannot make a cgroup to delegate: %v", err)
		}
		t.Cleanup(func() { removeGroups(g) })
		for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads", "tasks"} {
			if err := os.Chown(filepath.Join(g, f), uid, uid); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		return g
	}
	if v2 != "" {
		g := mk(v2)
		f, err := os.Open(g)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return func(cmd *exec.Cmd) { cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd()) }, nil
	}
	if len(v1) < 4 {
		t.Skip("no cgroup v2 hierarchy with memory and pids, nor v1 memory, pids, cpu and cpuacct")
	}
	var parents, groups []string
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct"} {
		if !slices.Contains(parents, v1[c]) { // (cpu and cpuacct may share a hierarchy)
			parents = append(parents, v1[c])
			groups = append(groups, mk(v1[c]))
		}
	}
	return func(cmd *exec.Cmd) {
		// The child moves itself (as the user) into the groups, then runs the test binary.
		cmd.Args = append([]string{"/bin/sh", "-c", `for g in $SANDLOOP_TEST_GROUPS; do echo $$ >"$g/cgroup.procs" || exit 97; done; exec "$0" "$@"`}, cmd.Args...)
		cmd.Path = "/bin/sh"
		cmd.Env = append(cmd.Env, "SANDLOOP_TEST_GROUPS="+strings.Join(groups, " "))
	}, nil
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

type mount struct{ point, fstype, opts string }

// mountinfo returns this process's mounts: mount point, file system type
// and its super block options (where cgroup v1 names its controllers).
func mountinfo() []mount {
	var ms []mount
	for _, l := range strings.Split(readFile("/proc/self/mountinfo"), "\n") {
		f := strings.Fields(l)
		if i := slices.Index(f, "-"); i > 4 && len(f) >= i+4 {
			ms = append(ms, mount{point: f[4], fstype: f[i+1], opts: f[i+3]})
		}
	}
	return ms
}

// removeGroups removes a cgroup and the groups below it, killing what
// is left in them (cgroup v2), waiting (bounded) for them to empty.
func removeGroups(dir string) {
	subs, _ := os.ReadDir(dir)
	for _, s := range subs {
		if s.IsDir() {
			removeGroups(filepath.Join(dir, s.Name()))
		}
	}
	os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 100 && syscall.Rmdir(dir) == syscall.EBUSY; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}
