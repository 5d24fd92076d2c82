package zygote

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	os.Exit(m.Run())
}

// light is what most tests import in the template: they test the fork,
// not the libraries (TestDataScienceSession does).
var light = []string{"json"}

func newZygote(t testing.TB, modules []string) *Zygote {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the zygote needs root (open_tree of the workspace)")
	}
	z, err := New(context.Background(), &Options{Modules: modules, Env: session.KernelEnv()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { z.Close() })
	return z
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
		p, err := z.Fork(ctx, opts.Workspace, limits, session.KernelEnv(), f)
		if err == nil {
			proc = p
		}
		return p, err
	}
	s, err := session.New(context.Background(), opts)
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
	cold, err := session.New(context.Background(), session.Options{Workspace: t.TempDir()})
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
		"pids":   []any{float64(1)},
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
	for k := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(want[k]) {
			t.Errorf("%s differs from a cold session's:\nfork: %v\ncold: %v", k, got[k], want[k])
		}
	}
}
