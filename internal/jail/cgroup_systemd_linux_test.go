package jail

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"

	"github.com/sandloop/sandloop/internal/testutil"
)

// systemd is not the init on this machine (nor in the test VM), so most
// of these tests put a fake in its place: a D-Bus peer owning
// org.freedesktop.systemd1 on a private dbus-daemon, answering
// StartTransientUnit as systemd does for a scope (it creates the group,
// moves the PIDs, delegates it to the caller's uid and announces the job's
// end with JobRemoved), and also as it does when it refuses, fails or
// hangs. What sandloop asks for and what it does with each answer is
// tested for real. TestRealSystemdScope then runs the real systemd (a
// manager of its own beside the init) where there is a cgroup v2
// hierarchy with controllers, as in make test-vm.

// privateBus starts a dbus-daemon of its own on a socket in a temporary
// directory and returns its address.
func privateBus(t *testing.T) string {
	t.Helper()
	exe, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("needs dbus-daemon (scripts/deps.sh installs it)")
	}
	dir := testutil.ReadableTempDir(t, "sandloop-bus-")
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path=`+filepath.Join(dir, "bus")+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// It warns that it may not raise its descriptor limit: harmless.
	logPath := filepath.Join(dir, "bus.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("dbus-daemon: %v\n%s", err, readFileString(logPath))
	}
	return strings.TrimSpace(addr)
}

// scopeRequest is one StartTransientUnit call the fake received.
type scopeRequest struct {
	Name, Mode string
	Props      map[string]any
	CallerPID  uint32
}

// fakeSystemd answers StartTransientUnit on the bus.
type fakeSystemd struct {
	conn *dbus.Conn
	// base is the group under which it creates slice/scope groups and
	// moves the PIDs; "" moves nothing.
	base string
	// result is the job's result in JobRemoved ("done", "failed"); ""
	// never announces the job's end.
	result string
	// refuse, if set, is the error the call returns.
	refuse *dbus.Error

	mu   sync.Mutex
	reqs []scopeRequest
}

func startFakeSystemd(t *testing.T, addr string, f *fakeSystemd) *fakeSystemd {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.conn = conn
	if err := conn.Export(f, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"); err != nil {
		t.Fatal(err)
	}
	if reply, err := conn.RequestName("org.freedesktop.systemd1", dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("own org.freedesktop.systemd1: %v %v", reply, err)
	}
	return f
}

func (f *fakeSystemd) requests() []scopeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// StartTransientUnit is systemd's method (org.freedesktop.systemd1(5)).
func (f *fakeSystemd) StartTransientUnit(sender dbus.Sender, name, mode string, props []sddbus.Property, aux []sddbus.PropertyCollection) (dbus.ObjectPath, *dbus.Error) {
	req := scopeRequest{Name: name, Mode: mode, Props: map[string]any{}}
	for _, p := range props {
		req.Props[p.Name] = p.Value.Value()
	}
	var uid uint32
	f.conn.BusObject().Call("org.freedesktop.DBus.GetConnectionUnixProcessID", 0, string(sender)).Store(&req.CallerPID)
	f.conn.BusObject().Call("org.freedesktop.DBus.GetConnectionUnixUser", 0, string(sender)).Store(&uid)
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	n := len(f.reqs)
	f.mu.Unlock()
	if f.refuse != nil {
		return "", f.refuse
	}
	// What systemd refuses for a scope.
	pids, _ := req.Props["PIDs"].([]uint32)
	slice, _ := req.Props["Slice"].(string)
	switch {
	case !strings.HasSuffix(name, ".scope") || len(aux) > 0:
		return "", dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"not a scope"})
	case len(pids) == 0:
		return "", dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"Scope " + name + " has no PIDs. Refusing."})
	case !strings.HasSuffix(slice, ".slice"):
		return "", dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs", []any{"bad slice " + slice})
	}
	job := dbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", n))
	result := f.result
	if f.base != "" && result == "done" {
		if err := f.makeScope(filepath.Join(f.base, slice, name), pids, int(uid), req.Props["Delegate"] == true); err != nil {
			result = "failed"
		}
	}
	if result != "" {
		go f.conn.Emit("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager.JobRemoved", uint32(n), job, name, result)
	}
	return job, nil
}

// makeScope does what systemd does for a delegated scope on cgroup v2:
// the controllers enabled down to it (not in it: that is the delegatee's
// to do, and a group with controllers enabled for children cannot take
// processes), the PIDs moved in and, for another user, the group handed
// over.
func (f *fakeSystemd) makeScope(dir string, pids []uint32, uid int, delegate bool) error {
	for d := f.base; d != dir; {
		var add []string
		for _, c := range strings.Fields(readFileString(filepath.Join(d, "cgroup.controllers"))) {
			if contains(v2Controllers, c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) > 0 {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
				return err
			}
		}
		d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0])
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	for _, pid := range pids {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(int(pid))), 0); err != nil {
			return err
		}
	}
	if delegate && uid != 0 {
		for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
			if err := os.Chown(filepath.Join(dir, f), uid, -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// useFakeSystemd points sandloop at the bus addr as if systemd were the
// init.
func useFakeSystemd(t *testing.T, addr string) {
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", addr)
	saved := systemdBooted
	systemdBooted = func() bool { return true }
	t.Cleanup(func() { systemdBooted = saved })
}

// What sandloop asks systemd for, and what it makes of each answer.
func TestSystemdScopeRequest(t *testing.T) {
	slice := "user.slice"
	if os.Geteuid() == 0 {
		slice = "system.slice"
	}
	pid := os.Getpid()
	here := func() string { return "/sys/fs/cgroup/user.slice/session-1.scope" }
	cases := []struct {
		name string
		fake *fakeSystemd // nil: nobody owns systemd's name
		want string       // in the error
	}{
		{"done but not moved", &fakeSystemd{result: "done"}, "but this process is in /sys/fs/cgroup/user.slice/session-1.scope"},
		{"job failed", &fakeSystemd{result: "failed"}, `sandloop-` + strconv.Itoa(pid) + `.scope ended "failed" (journalctl -u`},
		{"refused", &fakeSystemd{refuse: dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Access denied"})}, "ask systemd for a delegated scope sandloop-" + strconv.Itoa(pid) + ".scope: Access denied"},
		{"no answer", &fakeSystemd{}, "systemd did not start the scope"},
		{"no systemd on the bus", nil, "org.freedesktop.systemd1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := privateBus(t)
			useFakeSystemd(t, addr)
			if c.name == "no answer" {
				saved := scopeTimeout
				scopeTimeout = 500 * time.Millisecond
				t.Cleanup(func() { scopeTimeout = saved })
			}
			if c.fake != nil {
				startFakeSystemd(t, addr, c.fake)
			}
			_, err := systemdScope(here)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
			if c.fake == nil {
				return
			}
			reqs := c.fake.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests, want 1: %+v", len(reqs), reqs)
			}
			r := reqs[0]
			if r.Name != scopeName(pid) || r.Mode != "fail" || r.Props["Delegate"] != true || r.Props["Slice"] != slice ||
				!slices.Equal(r.Props["PIDs"].([]uint32), []uint32{uint32(pid)}) || r.CallerPID != uint32(pid) {
				t.Errorf("asked systemd for %+v, want %s, mode fail, Delegate, PIDs [%d] (the caller), slice %s", r, scopeName(pid), pid, slice)
			}
		})
	}
	t.Run("systemd not the init", func(t *testing.T) {
		useFakeSystemd(t, "unix:path=/nonexistent")
		systemdBooted = func() bool { return false }
		if _, err := systemdScope(here); !errors.Is(err, errNoSystemd) {
			t.Errorf("got %v, want errNoSystemd", err)
		}
	})
}

// scopeChild is a helper of TestSystemdDelegatedScope run by TestMain: a
// sandloop whose cgroup v2 group is shared, with (a fake) systemd as the
// init. It reports where it puts sandboxes and, when that is a real
// cgroup v2 group, whether a memory bomb in a jail is OOM-killed there.
func scopeChild() {
	systemdBooted = func() bool { return true }
	out := map[string]any{}
	for _, m := range readMountinfo() {
		if m.fstype != "cgroup2" {
			continue
		}
		dir, err := probeV2(m)
		out["V2"], out["Cgroup"] = dir, selfCgroups()[""]
		if err != nil {
			out["Err"] = err.Error()
			break
		}
		hostOnce.Do(func() { host = cgroupHost{mode: "cgroup v2", v2: dir} })
		ws, _ := os.MkdirTemp("", "sandloop-test-ws-")
		defer os.RemoveAll(ws)
		res, err := Run(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", "b = []\nwhile True: b.append(bytearray(8 << 20))"},
			Workspace: ws, Limits: Limits{Memory: 64 << 20, Timeout: time.Minute}})
		if err != nil {
			out["Err"] = err.Error()
		} else {
			out["OOM"], out["Enforce"] = res.OOMKilled, res.Enforcement
		}
		break
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

// A sandloop sharing its cgroup v2 group, on a host where systemd is the
// init, asks systemd for a delegated scope holding only itself (as root the
// system manager, as an ordinary user the user's manager), moves into it
// and uses it: on a cgroup v2 host the memory limit of a sandbox is then
// the kernel's (an OOM kill reported); on this hybrid host, whose v2
// hierarchy has no controllers, it says so, naming the scope.
func TestSystemdDelegatedScope(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups and switch users")
	}
	mount := cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup v2 hierarchy")
	}
	v2 := hasAll(strings.Fields(readFileString(filepath.Join(mount, "cgroup.controllers"))), v2Controllers)
	addr := privateBus(t)
	// The fake systemd's tree, and a login session's scope in it that
	// sandloop shares with another process.
	base := filepath.Join(mount, "sandloop-test-"+rand.Text())
	session := filepath.Join(base, "session-1.scope")
	fake := &fakeSystemd{base: base, result: "done"}
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(base) })
	if err := fake.makeScope(session, nil, 0, false); err != nil {
		t.Fatal(err)
	}
	startFakeSystemd(t, addr, fake)
	dirf, err := os.Open(session)
	if err != nil {
		t.Fatal(err)
	}
	defer dirf.Close()
	other := shareGroup(t, int(dirf.Fd()))

	bin, tmp := testutil.CopyForNobody(t, "sandloop-scope-", "jail.test")

	for _, c := range scopeCallers {
		t.Run(c.name, func(t *testing.T) {
			before := len(fake.requests())
			got, pid := runScopeChild(t, bin, tmp, c.busVar+"="+addr, c.uid, dirf)

			reqs := fake.requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("systemd was asked %d times, want once: %+v", len(reqs), reqs)
			}
			r := reqs[0]
			if r.Name != scopeName(int(pid)) || r.Props["Delegate"] != true || r.Props["Slice"] != c.slice ||
				!slices.Equal(r.Props["PIDs"].([]uint32), []uint32{uint32(pid)}) || r.CallerPID != uint32(pid) {
				t.Errorf("asked systemd for %+v, want a delegated scope in %s holding only the caller %d", r, c.slice, pid)
			}
			scope := filepath.Join(base, c.slice, scopeName(int(pid)))
			if procs := readFileString(filepath.Join(session, "cgroup.procs")); procs != strconv.Itoa(other) {
				t.Errorf("the session's other process was moved or joined: %s holds %q", session, procs)
			}
			if v2 {
				if got.Err != "" || got.V2 != scope || !strings.HasSuffix(filepath.Join(scope, supervisorLeaf), got.Cgroup) {
					t.Errorf("sandloop manages %q and runs in %q (%s), want %s and its supervisor leaf", got.V2, got.Cgroup, got.Err, scope)
				}
				if !got.OOM || got.Enforce != "cgroup v2" {
					t.Errorf("a 64 MiB memory bomb in the scope's sandbox group: OOM %v, enforced by %q", got.OOM, got.Enforce)
				}
				return
			}
			// The hybrid host: moved into the scope, which has no controllers.
			if !strings.HasSuffix(scope, got.Cgroup) {
				t.Errorf("sandloop runs in %q, want the scope %s", got.Cgroup, scope)
			}
			if !strings.Contains(got.Err, "systemd's scope "+scope+": controller memory not available") {
				t.Errorf("on a v2 hierarchy without controllers: %q, want it to name the scope and the missing controller", got.Err)
			}
		})
	}
}

// scopeCallers are who asks systemd for a scope: root (the system
// manager) and an ordinary user (the user's manager), with the slice each
// scope goes to and the variable that names each bus.
var scopeCallers = []struct {
	name, slice, busVar string
	uid                 uint32
}{
	{"root", "system.slice", "DBUS_SYSTEM_BUS_ADDRESS", 0},
	{"ordinary user", "user.slice", "DBUS_SESSION_BUS_ADDRESS", testutil.Nobody},
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted, or "".
func cgroup2Mount() string {
	for _, m := range readMountinfo() {
		if m.fstype == "cgroup2" {
			return m.point
		}
	}
	return ""
}

// scopeReport is what scopeChild reports.
type scopeReport struct {
	V2, Cgroup, Err, Enforce string
	OOM                      bool
}

// runScopeChild runs scopeChild (the test binary bin, from tmp) as uid in
// the group session, with busVar ("NAME=address") pointing it at a
// systemd, and returns its report and its PID.
func runScopeChild(t *testing.T, bin, tmp, busVar string, uid uint32, session *os.File) (scopeReport, int) {
	t.Helper()
	child := exec.Command(bin, "-test.run", "^TestMain$")
	child.Env = []string{"SANDLOOP_SCOPE_CHILD=1", busVar, "PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp}
	child.Dir = tmp
	child.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(session.Fd())}
	if uid != 0 {
		child.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	var stdout, stderr bytes.Buffer
	child.Stdout, child.Stderr = &stdout, &stderr
	if err := child.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	var got scopeReport
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("child said %q (%v)\n%s", stdout.String(), err, stderr.String())
	}
	t.Logf("child: %+v", got)
	return got, child.Process.Pid
}

// The same with the real systemd: its manager (a user manager, the only
// kind that can be started beside another init; its D-Bus API is the
// system manager's) on its own bus, over a cgroup v2 tree of its own as
// user@UID.service has. sandloop, sharing a login session's group with
// another process, asks it for a delegated scope and runs a sandbox there
// whose memory limit the kernel enforces. As root sandloop asks "the
// system bus", here that manager's bus, for a scope in system.slice.
//
// What this does not cover: from a real login session (a group of
// logind's, owned by root) a user manager cannot move the caller itself
// and asks the system manager to (systemd's AttachProcessesToUnit); here
// the session's parent is the user's, as inside a delegated tree.
//
// It needs cgroup v2 with controllers (the VM of make test-vm; a systemd
// host) and root; systemd refuses to run a user manager unless
// /run/systemd/system exists, so the manager gets a /run of its own.
func TestRealSystemdScope(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups and switch users")
	}
	mount := cgroup2Mount()
	if mount == "" || !hasAll(strings.Fields(readFileString(filepath.Join(mount, "cgroup.controllers"))), v2Controllers) {
		t.Skip("needs a cgroup v2 hierarchy with the memory, pids and cpu controllers (make test-vm runs this)")
	}
	systemd := ""
	for _, p := range []string{"/usr/lib/systemd/systemd", "/lib/systemd/systemd"} {
		if exists(p) {
			systemd = p
			break
		}
	}
	if systemd == "" {
		t.Skip("systemd is not installed")
	}
	bin, tmp := testutil.CopyForNobody(t, "sandloop-realsd-", "jail.test")
	for _, c := range scopeCallers {
		t.Run(c.name, func(t *testing.T) {
			// base (the user's, as user-UID.slice's subtree is the user's
			// inside a delegated tree): manager/ (user@UID.service) and
			// session/ (root's, shared with another process).
			base := filepath.Join(mount, "sandloop-test-"+rand.Text())
			manager, session := filepath.Join(base, "manager"), filepath.Join(base, "session")
			for _, d := range []string{base, manager, session} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { removeTree(base) })
			if err := os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0); err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{base, manager} {
				for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
					if err := os.Chown(filepath.Join(d, f), int(c.uid), int(c.uid)); err != nil {
						t.Fatal(err)
					}
				}
			}
			addr := startRealSystemd(t, systemd, manager, c.uid)

			sessf, err := os.Open(session)
			if err != nil {
				t.Fatal(err)
			}
			defer sessf.Close()
			other := shareGroup(t, int(sessf.Fd()))

			got, pid := runScopeChild(t, bin, tmp, c.busVar+"="+addr, c.uid, sessf)
			scope := filepath.Join(manager, c.slice, scopeName(pid))
			if got.Err != "" || got.V2 != scope || !strings.HasSuffix(filepath.Join(scope, supervisorLeaf), got.Cgroup) {
				t.Errorf("sandloop manages %q and runs in %q (%s), want systemd's scope %s and its supervisor leaf", got.V2, got.Cgroup, got.Err, scope)
			}
			if !got.OOM || got.Enforce != "cgroup v2" {
				t.Errorf("a 64 MiB memory bomb in a sandbox in systemd's scope: OOM %v, enforced by %q", got.OOM, got.Enforce)
			}
			if procs := readFileString(filepath.Join(session, "cgroup.procs")); procs != strconv.Itoa(other) {
				t.Errorf("the session's other process was moved or joined: %s holds %q", session, procs)
			}
		})
	}
}

// startRealSystemd starts systemd's manager as uid in the group dir with
// a /run of its own holding /run/systemd/system (what it checks to know it
// may run), waits until it answers on its bus (the user's bus, which it
// starts itself on first use: dbus.socket, dbus-user-session) and returns
// that bus's address. It stops the manager at the test's end.
func startRealSystemd(t *testing.T, systemd, dir string, uid uint32) string {
	t.Helper()
	if !exists("/usr/lib/systemd/user/dbus.socket") {
		t.Skip("needs the user bus units of systemd (apt-get install dbus-user-session)")
	}
	runtime := filepath.Join(testutil.ReadableTempDir(t, "sandloop-xdg-"), "run")
	if err := os.Mkdir(runtime, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(runtime, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
	dirf, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer dirf.Close()
	addr := "unix:path=" + filepath.Join(runtime, "bus")
	env := []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + runtime, "XDG_RUNTIME_DIR=" + runtime, "DBUS_SESSION_BUS_ADDRESS=" + addr}
	asUser := []string{"setpriv", "--reuid=" + strconv.Itoa(int(uid)), "--regid=" + strconv.Itoa(int(uid)), "--clear-groups"}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o mode=755 sandloop-test /run && mkdir -p /run/systemd/system && exec "$@"`, "sh")
	cmd.Args = append(append(cmd.Args, asUser...), systemd, "--user")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dirf.Fd())}
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-exited
		}
	})
	// Up when its name is on the bus (seconds, also under emulation; the
	// first connection starts the bus).
	testutil.WaitFor(t, 2*time.Minute, func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("systemd --user exited (%v):\n%s", err, log.String())
		default:
		}
		busctl := exec.Command(asUser[0], append(asUser[1:], "busctl", "--user", "status", "org.freedesktop.systemd1")...)
		busctl.Env = env
		if status, err := busctl.CombinedOutput(); err != nil {
			return fmt.Errorf("systemd --user does not answer on its bus: busctl: %v %s\n%s", err, status, log.String())
		}
		return nil
	})
	return addr
}

// syncBuffer is a bytes.Buffer safe to write from one goroutine and read
// from another.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
