package zygote

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/session/sessiontest"
	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

// light is what most tests import in the template: they test the fork,
// not the libraries (TestDataScienceSession does).
var light = []string{"json"}

func newZygote(t testing.TB, modules []string) *Zygote {
	t.Helper()
	return newZygoteWithin(t, modules, startTimeout)
}

// newZygoteWithin is newZygote with a bound on the template's start.
func newZygoteWithin(t testing.TB, modules []string, timeout time.Duration) *Zygote {
	t.Helper()
	return newZygoteOpts(t, &Options{Modules: modules, Env: session.KernelEnv()}, timeout)
}

// newZygoteWith is newZygote with options.
func newZygoteWith(t testing.TB, opts *Options) *Zygote {
	t.Helper()
	return newZygoteOpts(t, opts, startTimeout)
}

func newZygoteOpts(t testing.TB, opts *Options, timeout time.Duration) *Zygote {
	t.Helper()
	if err := Supported(); err != nil {
		t.Skipf("no zygote on this host: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	z, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	startTook.Store(z, time.Since(start))
	t.Cleanup(func() { z.Close() })
	return z
}

// startTook holds how long New took for each Zygote newZygote made: the
// measure of this machine's speed that bounded waits scale with (an
// emulated machine is 10-50 times slower than this one).
var startTook sync.Map

// patience is how long to wait for something the template or the kernel
// does on its own: at least floor, else a few template starts.
func (z *Zygote) patience(floor time.Duration) time.Duration {
	d, _ := startTook.Load(z)
	took, _ := d.(time.Duration)
	return max(floor, 5*took)
}

// forked is a session whose kernel was forked, and its process.
type forked struct {
	*session.Session
	proc *Process
}

func newSession(t testing.TB, z *Zygote, opts session.Options) forked {
	t.Helper()
	var proc *Process
	if opts.Workspace == "" {
		opts.Workspace = t.TempDir()
	}
	opts.Launcher = func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		limits := opts.Limits
		p, err := z.Fork(ctx, opts.Workspace, limits, session.KernelEnv(), 0, f)
		if err == nil {
			proc = p
		}
		return p, err
	}
	s, err := session.New(context.Background(), &opts)
	if err != nil {
		t.Fatalf("session.New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return forked{s, proc}
}

func run(t testing.TB, s *session.Session, code string) *kernel.Result {
	t.Helper()
	res, err := s.Execute(context.Background(), kernel.Request{Code: code, Timeout: 60 * time.Second}, nil)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return res
}

// out runs code that must succeed and returns its stdout, trimmed.
func out(t testing.TB, s *session.Session, code string) string {
	t.Helper()
	res := run(t, s, code)
	if res.Status != "ok" {
		t.Fatalf("status %s: %+v\nstderr: %s", res.Status, res.Error, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

func TestForkRuns(t *testing.T) {
	z := newZygote(t, light)
	s := newSession(t, z, session.Options{})
	if got := out(t, s.Session, "import os; print(os.getpid(), os.getppid(), os.getcwd(), os.getuid())"); got != "2 1 /workspace 1000" {
		t.Fatalf("pid, ppid, cwd, uid = %q, want 2 1 /workspace 1000", got)
	}
	if got := out(t, s.Session, "x = 41\nprint(x + 1)"); got != "42" {
		t.Fatalf("got %q", got)
	}
	// On the host the kernel is the sandbox user's id: nobody as root,
	// the user's own without root.
	want := os.Getuid()
	if want == 0 {
		want = jail.HostID
	}
	kpid := s.proc.HostPids()[1]
	if uid := strings.Fields(statusField(readFile(fmt.Sprintf("/proc/%d/status", kpid)), "Uid")); len(uid) == 0 || uid[0] != strconv.Itoa(want) {
		t.Errorf("the kernel's host uid is %v, want %d", uid, want)
	}
	if os.Getuid() != 0 {
		t.Logf("rootless zygote: uid %d, template %d, kernel %d in %s", os.Getuid(), z.Pid(), kpid, strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/cgroup", kpid))))
	}
}

// probe reports what a sandboxed process can see and do, as JSON.
const probe = `
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def err(r):
    return 0 if r >= 0 else ctypes.get_errno()
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
mounts = sorted(set(l.split()[4] for l in open("/proc/self/mountinfo")))
print(json.dumps({
    "caps": [st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "nnp": st["NoNewPrivs"].strip(), "seccomp": st["Seccomp"].strip(),
    "ptrace": err(libc.syscall(101, 0, 0, 0, 0)),             # PTRACE_TRACEME
    "mount": err(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "unshare": err(libc.unshare(0x00020000)),                  # CLONE_NEWNS
    "bpf": err(libc.syscall(321, 0, 0, 0)),
    "netdev": [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]],
    "root": sorted(os.listdir("/")),
    "mounts": mounts,
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()),
    "pid": os.getpid(),
    "whoami": [os.getppid(), os.getuid(), os.getgid(), os.getcwd(), os.uname().nodename],
    "cgroup": open("/proc/self/cgroup").read().split(":")[-1].strip(),
    "masked": sum(len(open("/proc/" + n, "rb").read()) for n in ("kallsyms", "timer_list", "sched_debug", "keys") if os.path.isfile("/proc/" + n)),
    "ws": os.listdir("/workspace"),
    "limits": open("/proc/self/limits").read(),
    "env": sorted(k for k in os.environ),
}, sort_keys=True))
`

// The security checks of the jail hold in a forked session, and it sees
// exactly what a cold session sees.
func TestForkedSessionIsAJail(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe uses x86_64 syscall numbers")
	}
	z := newZygote(t, light)
	fork := newSession(t, z, session.Options{})
	cold, err := session.New(context.Background(), &session.Options{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cold.Close() })
	var got, want map[string]any
	if err := json.Unmarshal([]byte(out(t, fork.Session, probe)), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out(t, cold, probe)), &want); err != nil {
		t.Fatal(err)
	}
	zero := "0000000000000000"
	if caps := fmt.Sprint(got["caps"]); caps != fmt.Sprint([]string{zero, zero, zero, zero, zero}) {
		t.Errorf("capabilities %s, want all zero", caps)
	}
	eperm := float64(syscall.EPERM)
	for k, v := range map[string]any{
		"nnp": "1", "seccomp": "2", "ptrace": eperm, "mount": eperm, "unshare": eperm, "bpf": eperm,
		"netdev": []any{"lo"}, "cgroup": "/", "masked": float64(0), "ws": []any{},
		"pid": float64(2), "whoami": []any{float64(1), float64(1000), float64(1000), "/workspace", "sandbox"},
		"pids": []any{float64(1)},
	} {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for _, m := range got["mounts"].([]any) {
		if strings.Contains(m.(string), "sandloop") || m == "/oldroot" {
			t.Errorf("mount point %s visible", m)
		}
	}
	delete(want, "pid") // a cold jail's init has threads: its kernel is PID 6 or so
	// A cold jail's program has an RLIMIT_NPROC of its --pids and its init's
	// threads (the init is the same user there); a fork's processes are
	// counted by its own cgroup instead. Every other limit is the same.
	noNproc := regexp.MustCompile(`(?m)^Max processes .*\n`)
	for _, m := range []map[string]any{got, want} {
		if l, ok := m["limits"].(string); ok {
			m["limits"] = noNproc.ReplaceAllString(l, "")
		}
	}
	for k := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(want[k]) {
			t.Errorf("%s differs from a cold session's:\nfork: %v\ncold: %v", k, got[k], want[k])
		}
	}
}

// Forked siblings share nothing they could use to reach each other.
func TestSiblingsIsolated(t *testing.T) {
	z := newZygote(t, light)
	a := newSession(t, z, session.Options{})
	b := newSession(t, z, session.Options{})

	// Files.
	out(t, a.Session, `open("/workspace/secret.txt", "w").write("A"); open("/tmp/a-tmp", "w").write("A")`)
	if _, err := os.Stat(filepath.Join(a.Workspace(), "secret.txt")); err != nil {
		t.Fatalf("the host does not see A's file: %v", err)
	}
	if got := out(t, b.Session, `import os; print(os.listdir("/workspace"), os.path.exists("/tmp/a-tmp"))`); got != "[] False" {
		t.Errorf("B sees %s in its workspace and /tmp", got)
	}

	// Processes and signals: B can name (and so signal) only its own.
	out(t, a.Session, `import subprocess; child = subprocess.Popen(["sleep", "300"])`)
	got := out(t, b.Session, `
import os
own = set(int(p) for p in os.listdir("/proc") if p.isdigit())
reached = []
for pid in range(1, 4096):
    try:
        os.kill(pid, 0)
        reached.append(pid)
    except ProcessLookupError:
        pass
    except PermissionError:
        reached.append(pid)
print(sorted(set(reached) - own), sorted(own))`)
	if !strings.HasPrefix(got, "[] ") {
		t.Errorf("B can reach processes that are not its own: %s", got)
	}
	if got := out(t, a.Session, `print(child.poll())`); got != "None" {
		t.Errorf("A's child ended: %s", got)
	}

	// Memory: a write in one is not seen by the other or by later forks.
	out(t, a.Session, `import json; json.sandloop_mark = "A"`)
	c := newSession(t, z, session.Options{})
	for name, s := range map[string]forked{"B": b, "C": c} {
		if got := out(t, s.Session, `import json; print(hasattr(json, "sandloop_mark"))`); got != "False" {
			t.Errorf("%s sees A's write", name)
		}
	}

	// A's kernel dies; B lives on, and the zygote still forks.
	if res := run(t, a.Session, `import os, signal; os.kill(os.getpid(), signal.SIGKILL)`); res.Status != "killed" {
		t.Errorf("A's suicide: status %s, want killed", res.Status)
	}
	if got := out(t, b.Session, `print("alive")`); got != "alive" {
		t.Errorf("B after A died: %q", got)
	}
	d := newSession(t, z, session.Options{})
	out(t, d.Session, `print(1)`)
}

// Each fork has its own cgroup and limits: one running into them leaves
// its sibling alone.
func TestLimitsPerFork(t *testing.T) {
	z := newZygote(t, light)
	small := newSession(t, z, session.Options{Limits: jail.Limits{Memory: 64 << 20, Pids: 16, TmpSize: 2 << 20, NoFile: 128}})
	big := newSession(t, z, session.Options{})

	if got := out(t, small.Session, `
import errno
try:
    open("/tmp/big", "wb").write(b"x" * (4 << 20))
    print("wrote")
except OSError as e:
    print(errno.errorcode[e.errno])`); got != "ENOSPC" {
		t.Errorf("4 MiB in a 2 MiB /tmp: %s", got)
	}
	if got := out(t, big.Session, `open("/tmp/big", "wb").write(b"x" * (4 << 20)); print("wrote")`); got != "wrote" {
		t.Errorf("sibling's /tmp: %s", got)
	}
	if got := out(t, small.Session, `
fs = []
try:
    for i in range(200):
        fs.append(open("/dev/null"))
except OSError as e:
    pass
print(len(fs) < 128)
for f in fs: f.close()`); got != "True" {
		t.Errorf("RLIMIT_NOFILE not applied: %s", got)
	}
	spawn := `
import subprocess
procs = []
try:
    for i in range(30):
        procs.append(subprocess.Popen(["sleep", "60"]))
except OSError as e:
    pass
print(len(procs))
for p in procs: p.kill(); p.wait()`
	if n, _ := strconv.Atoi(out(t, small.Session, spawn)); n >= 16 || n == 0 {
		t.Errorf("started %d processes under a pids limit of 16", n)
	}
	if got := out(t, big.Session, spawn); got != "30" {
		t.Errorf("sibling started %s of 30 processes", got)
	}

	res := run(t, small.Session, `x = bytearray(200 << 20)`)
	if res.Status != "killed" || !strings.Contains(res.Error.Value, "out-of-memory") {
		t.Errorf("200 MiB under a 64 MiB limit: status %s, error %+v", res.Status, res.Error)
	}
	if got := out(t, big.Session, `x = bytearray(200 << 20); print(len(x) >> 20)`); got != "200" {
		t.Errorf("sibling after the OOM: %q", got)
	}
}

// A template that dies is replaced without the caller noticing, and the
// sessions it forked live on.
func TestZygoteRestarts(t *testing.T) {
	z := newZygote(t, light)
	first := newSession(t, z, session.Options{})
	old := z.Pid()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := newSession(t, z, session.Options{})
	if got := out(t, second.Session, `print("forked")`); got != "forked" {
		t.Fatalf("after the template was killed: %q", got)
	}
	// The template is started again in the background (the fork above may
	// have taken a spare the dead one had ready, needing no template).
	testutil.WaitFor(t, 30*time.Second, func() error {
		if now := z.Pid(); now == old || now == 0 {
			return fmt.Errorf("template pid %d after killing %d", now, old)
		}
		return nil
	})
	if got := out(t, first.Session, `print("alive")`); got != "alive" {
		t.Errorf("a session forked by the dead template: %q", got)
	}

	// The whole jail of the template (its init): the next fork still works.
	z.mu.Lock()
	inst := z.cur
	z.mu.Unlock()
	// A session in that jail's PID namespace (second may come from a spare
	// the killed template had left ready, in the jail before it).
	victim := second
	for i := 0; !descendsFrom(victim.proc.HostPids()[0], inst.proc.Pid()); i++ {
		if i == 20 {
			t.Fatal("no session forked in the restarted template's jail")
		}
		victim = newSession(t, z, session.Options{})
	}
	inst.proc.Kill()
	<-inst.ended // (a spare it left ready dies with it, not at once)
	third := newSession(t, z, session.Options{})
	if got := out(t, third.Session, `print("forked")`); got != "forked" {
		t.Fatalf("after the template's jail was killed: %q", got)
	}
	// Sessions in the killed jail's PID namespace die with it.
	if res, err := victim.Execute(context.Background(), kernel.Request{Code: "print(1)"}, nil); err == nil && res.Status == "ok" {
		t.Errorf("a session of the killed jail still runs")
	}
}

// descendsFrom reports whether pid is a descendant of ancestor (host PIDs).
func descendsFrom(pid, ancestor int) bool {
	for pid > 1 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
		if pid == ancestor {
			return true
		}
	}
	return false
}

// Closing a session leaves no process and no cgroup behind.
func TestCloseCleansUp(t *testing.T) {
	z := newZygote(t, light)
	s := newSession(t, z, session.Options{})
	out(t, s.Session, `import subprocess; subprocess.Popen(["sleep", "300"], start_new_session=True)`)
	pids := s.proc.HostPids()
	cg := readCgroups(t, pids[1])
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.proc.Wait()
	for _, pid := range pids {
		// A killed process may be a zombie for a moment, until the
		// template jail's init reaps it: give that a bounded while.
		testutil.WaitFor(t, z.patience(5*time.Second), func() error {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return fmt.Errorf("process %d still exists", pid)
			}
			return nil
		})
	}
	for _, dir := range cg {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("cgroup %s still exists", dir)
		}
	}
}

// readCgroups returns the cgroup directories (v1 memory and pids, else the
// v2 group) of a host process.
func readCgroups(t *testing.T, pid int) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	v2 := ""
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == "memory" || parts[1] == "pids") {
			if !strings.Contains(parts[2], "sandloop-") {
				t.Fatalf("kernel in cgroup %s, not a session's", parts[2])
			}
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parts[1], parts[2]))
		}
		if len(parts) == 3 && parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
	}
	if len(dirs) == 0 && strings.Contains(v2, "sandloop-") && !strings.Contains(string(data), ":memory:") {
		dirs = []string{filepath.Join("/sys/fs/cgroup", v2)} // cgroup v2 only
	}
	if len(dirs) == 0 {
		t.Fatalf("no memory or pids cgroup in %q", data)
	}
	return dirs
}

// The default template: numpy, pandas and matplotlib are ready, rich
// output works, and random generators differ between forks.
func TestDataScienceSession(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skipf("no zygote on this host: %v", err)
	}
	// The template imports them before New returns: allow a few times
	// what importing them takes in a cold session here (~1 s on this
	// machine, minutes on an emulated one, where New's own two minutes
	// ran out).
	cold, err := session.New(context.Background(), &session.Options{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := cold.Execute(context.Background(), kernel.Request{Code: "import " + strings.Join(DefaultModules, ", "), Timeout: 15 * time.Minute}, nil)
	took := time.Since(start)
	cold.Close()
	if err != nil || res.Status != "ok" {
		t.Fatalf("cold import: %v %+v", err, res)
	}
	z := newZygoteWithin(t, nil, max(startTimeout, 4*took))
	a := newSession(t, z, session.Options{})
	b := newSession(t, z, session.Options{})
	res = run(t, a.Session, `
import sys
assert "pandas" in sys.modules
import pandas as pd, numpy as np, matplotlib.pyplot as plt
plt.plot([1, 2, 3])
pd.DataFrame({"a": [1, 2]})`)
	if res.Status != "ok" {
		t.Fatalf("status %s: %+v", res.Status, res.Error)
	}
	var png, html bool
	for _, r := range res.Results {
		_, p := r.Data["image/png"]
		_, h := r.Data["text/html"]
		png, html = png || p, html || h
	}
	if !png || !html {
		t.Errorf("results have png %v, html %v: %+v", png, html, res.Results)
	}
	draw := `import random, numpy as np; print(random.random(), np.random.rand())`
	if x, y := out(t, a.Session, draw), out(t, b.Session, draw); x == y {
		t.Errorf("two forks drew the same random numbers: %s", x)
	}
}

// armedSparePids waits (bounded) until the template's spares are all
// armed and returns their processes.
func (z *Zygote) armedSparePids(t testing.TB) []int {
	t.Helper()
	z.mu.Lock()
	inst := z.cur
	z.mu.Unlock()
	testutil.WaitFor(t, z.patience(10*time.Second), func() error {
		if n := len(inst.spares); n < z.opts.Spares {
			return fmt.Errorf("the template has %d of its %d spares", n, z.opts.Spares)
		}
		return nil
	})
	var pids []int
	for range len(inst.spares) { // (more than Options.Spares after a burst)
		r := <-inst.spares
		if r.sp != nil {
			pids = append(pids, r.sp.reaperPid, r.sp.kernelPid)
		}
		inst.spares <- r
	}
	return pids
}

// A spare is armed before any session takes it: its kernel has no
// capability and its seccomp filter, its reaper an empty bounding set, both
// in a cgroup of their own. A spare that dies before it is taken is
// skipped.
func TestSparesArmedAhead(t *testing.T) {
	z := newZygote(t, light)
	pids := z.armedSparePids(t)
	if len(pids) != 2 {
		t.Fatalf("spare pids %v", pids)
	}
	reaper, kern := pids[0], pids[1]
	want := map[int]map[string]string{
		kern:   {"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"},
		reaper: {"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1"},
	}
	for pid, fields := range want {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range fields {
			if got := statusField(string(status), k); got != v {
				t.Errorf("pid %d (%s): %s = %q, want %q", pid, map[int]string{reaper: "reaper", kern: "kernel"}[pid], k, got, v)
			}
		}
		readCgroups(t, pid) // fails unless in a sandloop- cgroup
	}

	if err := syscall.Kill(reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, z, session.Options{})
	if got := out(t, s.Session, `print("forked")`); got != "forked" {
		t.Fatalf("after the spare was killed: %q", got)
	}
	if hp := s.proc.HostPids(); slices.Contains(hp, reaper) || slices.Contains(hp, kern) {
		t.Errorf("the session got the killed spare's processes: %v", hp)
	}
}

func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// The session manager (what `sandloop serve --zygote` runs) forks pooled
// and direct sessions from the template, each in a PID namespace of its own.
func TestManagerForksSessions(t *testing.T) {
	z := newZygote(t, []string{"colorsys"}) // which nothing else imports
	mgr := session.NewManager(&session.ManagerOptions{PoolSize: 1, Zygote: z})
	defer mgr.Close()
	for i := range 3 {
		ms, err := mgr.Create(context.Background(), session.CreateOptions{Owner: "t"})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if got := out(t, ms.Session, `import os, sys; print(os.getpid(), "colorsys" in sys.modules)`); got != "2 True" {
			t.Errorf("session %d: pid, template's module loaded = %s, want 2 True (forked, under its reaper)", i, got)
		}
		if err := mgr.Delete("t", ms.ID()); err != nil {
			t.Fatal(err)
		}
	}
}

// Forks asked for at once each get a spare of their own (the template
// makes more as they are taken) and distinct processes.
func TestConcurrentForks(t *testing.T) {
	z := newZygote(t, light)
	const n = 4
	type got struct {
		pids []int
		out  string
		err  error
	}
	if _, err := z.Fork(context.Background(), "", jail.Limits{}, nil, 0, kernel.Files{}); err == nil || !strings.Contains(err.Error(), "workspace") {
		t.Fatalf("a fork without a workspace: %v", err)
	}
	results := make(chan got, n)
	for range n {
		ws := t.TempDir()
		go func() {
			var proc *Process
			s, err := session.New(context.Background(), &session.Options{Workspace: ws,
				Launcher: func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
					p, err := z.Fork(ctx, ws, jail.Limits{}, session.KernelEnv(), 0, f)
					proc = p
					return p, err
				}})

			if err != nil {
				results <- got{err: err}
				return
			}
			defer s.Close()
			res, err := s.Execute(context.Background(), kernel.Request{Code: `print("hi")`}, nil)
			if err == nil && res.Status != "ok" {
				err = fmt.Errorf("status %s", res.Status)
			}
			results <- got{pids: proc.HostPids(), out: res.Stdout, err: err}
		}()
	}
	seen := map[int]bool{}
	for range n {
		r := <-results
		if r.err != nil {
			t.Errorf("fork: %v", r.err)
			continue
		}
		if strings.TrimSpace(r.out) != "hi" {
			t.Errorf("output %q", r.out)
		}
		for _, pid := range r.pids {
			if seen[pid] {
				t.Errorf("process %d serves two sessions", pid)
			}
			seen[pid] = true
		}
	}
}

func TestForkQuota(t *testing.T) {
	c := jail.QuotaSupport()
	if !c.OK {
		t.Skip("workspace quotas: " + c.Detail)
	}
	if os.Geteuid() != 0 {
		t.Logf("rootless zygote: workspace quota: %s", c.Detail)
	}
	z := newZygote(t, []string{"colorsys"}) // which nothing else imports
	const disk, files = 48 << 20, 2000
	s, err := session.New(context.Background(), &session.Options{Zygote: z, Limits: jail.Limits{Disk: disk, Files: files}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if got := out(t, s, "import sys\nprint('colorsys' in sys.modules)"); got != "True" {
		t.Fatalf("the session was not forked from the template: %q", got)
	}
	sessiontest.CheckQuota(t, s, disk, files)
}

// A command joined to a forked session's jail (jail.Config.Join on the
// reaper) is in the session: its /tmp, processes, cgroup, filter and
// limits, and no capability; a sibling's are out of its reach.
func TestJoinForkedSession(t *testing.T) {
	// Joined through its reaper once that is the small one (the host
	// still reaches a non-dumpable program's namespaces).
	z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), reaperDelay: time.Millisecond})
	a := newSession(t, z, session.Options{Limits: jail.Limits{Pids: 64}})
	b := newSession(t, z, session.Options{})
	if bin, _ := reaperProgram(); bin != nil {
		testutil.WaitFor(t, z.patience(30*time.Second), func() error {
			if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", a.proc.HostPids()[0]))); comm != "reaper" {
				return fmt.Errorf("the session's PID 1 runs %q, not yet the small reaper", comm)
			}
			return nil
		})
	}
	kernel := out(t, a.Session, "import os; open('/tmp/k', 'w').write('kernel a'); print(os.getpid(), repr(open('/proc/self/limits').read()))")
	out(t, b.Session, "open('/tmp/k', 'w').write('kernel b')")
	target, err := a.proc.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	var o, e bytes.Buffer
	r, err := jail.Run(context.Background(), &jail.Config{Path: jail.DefaultPython, Args: []string{"python3", "-c", `import os
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
procs = [p for p in os.listdir('/proc') if p.isdigit()]
print(open('/tmp/k').read(), os.getuid(), st['CapBnd'], st['CapEff'], st['NoNewPrivs'], st['Seccomp'], open('/proc/self/cgroup').read().strip().split(':')[-1])
print(sorted(int(p) for p in procs)[:2], repr(open('/proc/self/limits').read()))`}, Join: target, Stdout: &o, Stderr: &e})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("joined: %v %+v %s", err, r, e.String())
	}
	lines := strings.Split(strings.TrimSpace(o.String()), "\n")
	if len(lines) != 2 || lines[0] != "kernel a 1000 0000000000000000 0000000000000000 1 2 /" {
		t.Fatalf("joined command: %q", o.String())
	}
	kpid, klimits, _ := strings.Cut(kernel, " ")
	if want := "[1, " + kpid + "] " + klimits; lines[1] != want {
		t.Errorf("processes and limits:\n%s\nwant (the kernel's):\n%s", lines[1], want)
	}
}

// The template's anonymous memory is collapsed into huge pages (where the
// kernel can: 6.1 and later), and forks sharing them stay apart: each
// session's writes (to every module's dictionary, across the template's
// heap and arenas) are its own, and numpy, pandas and a subprocess work.
func TestHugePagesTemplate(t *testing.T) {
	z := newZygote(t, nil)
	z.mu.Lock()
	huge := z.cur.huge
	z.mu.Unlock()
	var done, tried int
	if _, err := fmt.Sscanf(huge, "%d of %d ranges", &done, &tried); err != nil || done == 0 {
		if strings.HasPrefix(huge, "none collapsed") || (err == nil && done == 0) {
			t.Skipf("this kernel collapses none: %s", huge)
		}
		t.Fatalf("the template says %q, want how many ranges it collapsed", huge)
	}
	rollup := readFile(fmt.Sprintf("/proc/%d/smaps_rollup", z.Pid()))
	if kb, _ := strconv.Atoi(strings.Fields(statusField(rollup, "AnonHugePages") + " 0")[0]); kb == 0 {
		t.Errorf("the template reports %q but has no huge pages:\n%s", huge, rollup)
	}
	a := newSession(t, z, session.Options{})
	b := newSession(t, z, session.Options{})
	compute := `
import numpy as np, pandas as pd, subprocess
df = pd.DataFrame({"k": np.arange(100000) % 7, "v": np.arange(100000, dtype=float)})
s = df.groupby("k")["v"].sum()
m = np.linalg.inv(np.array([[2.0, 1.0], [1.0, 3.0]])) @ np.array([1.0, 2.0])
print(int(s.sum()), [round(x, 6) for x in m], subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())`
	want := "4999950000 [0.2, 0.6] sub"
	mark := `
import sys
for m in list(sys.modules.values()):
    try:
        m.__dict__["sandloop_mark"] = "A"
    except Exception:
        pass
print(sum(1 for m in list(sys.modules.values()) if getattr(m, "sandloop_mark", None) == "A") > 500)`
	if got := out(t, a.Session, mark); got != "True" {
		t.Fatalf("A marked its modules: %s", got)
	}
	for name, s := range map[string]forked{"A": a, "B": b} {
		if got := out(t, s.Session, compute); got != want {
			t.Errorf("%s computes %q, want %q", name, got, want)
		}
	}
	c := newSession(t, z, session.Options{})
	seen := `import sys; print(sum(1 for m in list(sys.modules.values()) if "sandloop_mark" in getattr(m, "__dict__", {})))`
	for name, s := range map[string]forked{"B": b, "C": c} {
		if got := out(t, s.Session, seen); got != "0" {
			t.Errorf("%s sees A's writes in %s modules", name, got)
		}
	}
}

// Where the kernel collapses nothing (here an advice it does not know, as
// a kernel before 6.1 answers MADV_COLLAPSE), the template goes on in
// small pages, the host's log says so once, and sessions run.
func TestHugePagesRefused(t *testing.T) {
	var log lockedBuffer
	z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), refusedHugePages: true,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	z.mu.Lock()
	huge := z.cur.huge
	z.mu.Unlock()
	if !strings.HasPrefix(huge, "none collapsed") {
		t.Fatalf("the template says %q, want none collapsed", huge)
	}
	if got := log.String(); strings.Count(got, "stays in small pages") != 1 || !strings.Contains(got, "Invalid argument") {
		t.Errorf("the host's log does not say once why the template stays in small pages:\n%s", got)
	}
	s := newSession(t, z, session.Options{})
	if got := out(t, s.Session, "x = 41; print(x + 1)"); got != "42" {
		t.Fatalf("got %q, want 42", got)
	}
}

// lockedBuffer is a bytes.Buffer a logger and a test may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The template's loop runs in C (trampoline.c's sandloop_serve): making
// spares while earlier ones and their sessions share its pages writes none
// of them, so every range it collapsed stays a huge page (its loop in
// Python split about half of them at its first spares, for good).
func TestTemplateKeepsHugePages(t *testing.T) {
	if _, why := trampolineProgram(); why != "" {
		t.Skip("no trampoline: ", why)
	}
	for _, python := range []bool{false, true} {
		z := newZygoteWith(t, &Options{Env: session.KernelEnv(), Spares: 2, pythonLoop: python})
		z.mu.Lock()
		huge := z.cur.huge
		z.mu.Unlock()
		var done, tried int
		if _, err := fmt.Sscanf(huge, "%d of %d ranges", &done, &tried); err != nil || done == 0 {
			t.Skipf("this kernel collapses none: %s", huge)
		}
		var open []forked
		for range 6 {
			s := newSession(t, z, session.Options{})
			if got := out(t, s.Session, "print(1+1)"); got != "2" {
				t.Fatalf("1+1 printed %q", got)
			}
			open = append(open, s)
		}
		for _, s := range open {
			s.Close()
		}
		z.armedSparePids(t)
		rollup := readFile(fmt.Sprintf("/proc/%d/smaps_rollup", z.Pid()))
		kb, _ := strconv.Atoi(strings.Fields(statusField(rollup, "AnonHugePages") + " 0")[0])
		if python {
			t.Logf("the loop in Python: %d of %d KiB collapsed still huge after 6 sessions", kb, done*2048)
		} else if kb < done*2048 {
			t.Errorf("the template's AnonHugePages %d KiB after 6 sessions, want the %d KiB it collapsed (%s)", kb, done*2048, huge)
		}
		z.Close()
	}
}

// A kernel made by the C loop skips the after-fork hooks that only
// reinitialize threads and locks (the template has one thread and holds
// no lock as it forks), but random's reseed still runs, and the kernel's
// own forks (user code's) run every hook again: a child forked from a
// thread sees that thread as its main one (threading's hook).
func TestForkHooksInSession(t *testing.T) {
	z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv()})
	a, b := newSession(t, z, session.Options{}), newSession(t, z, session.Options{})
	ra, rb := out(t, a.Session, "import random; print(random.random())"), out(t, b.Session, "import random; print(random.random())")
	if ra == rb {
		t.Errorf("two sessions drew the same random number %s: random was not reseeded", ra)
	}
	// The main thread's record is the kernel's own (threading's hook would
	// have set it; the template's thread id would be a stranger's).
	if got := out(t, a.Session, "import threading\nm = threading.main_thread()\nprint(m is threading.current_thread(), m.native_id == threading.get_native_id(), m.ident == threading.get_ident())"); got != "True True True" {
		t.Errorf("a session's main thread: current, native id and ident its own = %s, want True True True", got)
	}
	code := `
import os, threading
r, w = os.pipe()
def fork():
    pid = os.fork()
    if pid == 0:
        ok = threading.main_thread() is threading.current_thread() and len(threading.enumerate()) == 1
        os.write(w, b"ok" if ok else b"stale")
        os._exit(0)
    os.waitpid(pid, 0)
t = threading.Thread(target=fork)
t.start()
t.join()
print(os.read(r, 10).decode())`
	if got := out(t, a.Session, code); got != "ok" {
		t.Errorf("a child forked from a session's thread: threading's state %q, want ok (its after-fork hook)", got)
	}
}
