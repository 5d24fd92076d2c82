package jail

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/sandloop/sandloop/internal/jail/jailtest"
)

// systemd is not on this machine (nor in the test VM), so these tests
// put a fake in its place: a D-Bus peer owning org.freedesktop.systemd1
// on a private dbus-daemon, answering StartTransientUnit as systemd does
// for a scope (it creates the group, moves the PIDs, delegates it to the
// caller's uid and announces the job's end with JobRemoved). What sandloop
// asks for and what it does with each answer is tested for real; that
// systemd answers the same way is argued from its documentation
// (org.freedesktop.systemd1(5)) and from runc's use of the same calls.

// privateBus starts a dbus-daemon of its own on a socket in a temporary
// directory and returns its address.
func privateBus(t *testing.T) string {
	t.Helper()
	exe, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("needs dbus-daemon (scripts/deps.sh installs it)")
	}
	dir := jailtest.ReadableTempDir(t, "sandloop-bus-")
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
	var mount string
	for _, m := range readMountinfo() {
		if m.fstype == "cgroup2" {
			mount = m.point
			break
		}
	}
	if mount == "" {
		t.Skip("no cgroup v2 hierarchy")
	}
	v2 := hasAll(strings.Fields(readFileString(filepath.Join(mount, "cgroup.controllers"))), v2Controllers)
	addr := privateBus(t)
	// The fake systemd's tree, and a login session's scope in it that
	// sandloop shares with another process.
	base := filepath.Join(mount, "sandloop-test-"+randomID())
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
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dirf.Fd())}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })

	bin, tmp := jailtest.CopyForNobody(t, "sandloop-scope-", "jail.test")

	for _, c := range []struct {
		name, slice, busVar string
		uid                 uint32
	}{
		{"root", "system.slice", "DBUS_SYSTEM_BUS_ADDRESS", 0},
		{"ordinary user", "user.slice", "DBUS_SESSION_BUS_ADDRESS", 65534},
	} {
		t.Run(c.name, func(t *testing.T) {
			child := exec.Command(bin, "-test.run", "^TestMain$")
			child.Env = []string{"SANDLOOP_SCOPE_CHILD=1", c.busVar + "=" + addr, "PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp}
			child.Dir = tmp
			child.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dirf.Fd())}
			if c.uid != 0 {
				child.SysProcAttr.Credential = &syscall.Credential{Uid: c.uid, Gid: c.uid}
			}
			var stdout, stderr bytes.Buffer
			child.Stdout, child.Stderr = &stdout, &stderr
			before := len(fake.requests())
			if err := child.Run(); err != nil {
				t.Fatalf("child: %v\n%s", err, stderr.String())
			}
			var got struct {
				V2, Cgroup, Err, Enforce string
				OOM                      bool
			}
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("child said %q (%v)\n%s", stdout.String(), err, stderr.String())
			}
			t.Logf("child: %+v", got)

			reqs := fake.requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("systemd was asked %d times, want once: %+v", len(reqs), reqs)
			}
			r, pid := reqs[0], uint32(child.Process.Pid)
			if r.Name != scopeName(int(pid)) || r.Props["Delegate"] != true || r.Props["Slice"] != c.slice ||
				!slices.Equal(r.Props["PIDs"].([]uint32), []uint32{pid}) || r.CallerPID != pid {
				t.Errorf("asked systemd for %+v, want a delegated scope in %s holding only the caller %d", r, c.slice, pid)
			}
			scope := filepath.Join(base, c.slice, scopeName(int(pid)))
			if procs := readFileString(filepath.Join(session, "cgroup.procs")); procs != strconv.Itoa(other.Process.Pid) {
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
