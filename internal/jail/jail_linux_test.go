package jail

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMain(m *testing.M) {
	MaybeInit()
	if os.Getenv("SANDLOOP_CGROUP_PROBE_CHILD") != "" {
		// A helper of TestCgroupV2Delegation: where would this process
		// put sandboxes, and where does it run then? (Without asking
		// systemd, where it is the init: the rules below that one.)
		systemdBooted = func() bool { return false }
		h := detectCgroups()
		json.NewEncoder(os.Stdout).Encode(map[string]string{"Mode": h.mode, "V2": h.v2, "Reason": h.reason,
			"Cgroup": strings.TrimPrefix(readFileString("/proc/self/cgroup"), "0::")})
		os.Exit(0)
	}
	if os.Getenv("SANDLOOP_SCOPE_CHILD") != "" {
		scopeChild()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type run struct {
	res            *Result
	stdout, stderr string
	ws             string
}

// testWorkspace is a fresh workspace directly under the temporary
// directory, as sandloop makes them: t.TempDir's parent is private to its
// owner, which a jail run by root inside a container without
// CAP_SYS_ADMIN cannot pass through (it attaches the workspace by path).
func testWorkspace(t *testing.T) string {
	t.Helper()
	if os.Getenv(holderChildEnv) != "" {
		// TestQuotaHolder's run: jails the holder starts.
		q, err := NewQuotaDir(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if q.holderName == "" {
			t.Fatalf("not the holder's workspace: %+v", q)
		}
		t.Cleanup(func() { q.Remove() })
		return q.Path
	}
	ws, err := os.MkdirTemp("", "sandloop-test-ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	return ws
}

// runPy runs code with the sandbox's Python in a fresh jail.
func runPy(t *testing.T, code string, mod func(*Config)) run {
	t.Helper()
	ws := testWorkspace(t)
	var out, errb bytes.Buffer
	cfg := &Config{Path: DefaultPython, Args: []string{"python3", "-c", code}, Workspace: ws, Stdout: &out, Stderr: &errb,
		Limits: Limits{Timeout: 60 * time.Second}}
	if root := os.Getenv("SANDLOOP_JAIL_TEST_ROOT"); root != "" {
		// The attacks again, in a jail whose system root is an image
		// template's tree (its /usr/bin/python3): the layers must hold
		// whatever the root.
		cfg.Mounts = []Mount{{Host: root, Path: "/", Root: true}}
	}
	if mod != nil {
		mod(cfg)
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return run{res, out.String(), errb.String(), ws}
}

// mustPrint runs code that prints one line and fails the test otherwise.
func mustPrint(t *testing.T, code string) string {
	t.Helper()
	r := runPy(t, code, nil)
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.res.ExitCode, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// The code below prints what an attack achieved; each case says what it must print.
func TestAttacksFail(t *testing.T) {
	t.Setenv("SANDLOOP_TEST_SECRET", "hunter2-server-env")
	hostTmp, err := os.CreateTemp("/tmp", "sandloop-host-file-")
	if err != nil {
		t.Fatal(err)
	}
	hostTmp.WriteString("host secret")
	hostTmp.Close()
	t.Cleanup(func() { os.Remove(hostTmp.Name()) })

	tryOpen := `
def attempt(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return type(e).__name__ + ":" + (e.strerror or str(e))
`
	cases := []struct {
		name, code string
		want       func(string) bool
		desc       string
	}{
		{"read /etc/shadow", tryOpen + `print(attempt(lambda: open('/etc/shadow').read()))`, isErr("No such file"), "shadow not present"},
		{"list /root", tryOpen + `import os; print(attempt(lambda: os.listdir('/root')))`, isErr("No such file"), "/root not present"},
		{"host home via /home", `import os; print(os.listdir('/home'), os.readlink('/home/user'), os.path.realpath('/home/user'))`, equals("['user'] /workspace /workspace"), "/home holds only the link to the workspace"},
		{"server environment", `import os; print('leak' if any('hunter2' in v for v in os.environ.values()) else 'clean', sorted(os.environ))`, hasPrefix("clean"), "no server variable"},
		{"host /proc environ", `import os
found = []
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            if b'hunter2' in open('/proc/%s/environ' % p, 'rb').read(): found.append(p)
        except OSError: pass
print('found' if found else 'none', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))`, hasPrefix("none"), "no host process visible"},
		{"write /usr", tryOpen + `print(attempt(lambda: open('/usr/bin/evil', 'w')))`, isErr("Read-only file system"), "EROFS"},
		{"write /etc", tryOpen + `print(attempt(lambda: open('/etc/passwd', 'a')))`, isErr("Read-only file system"), "EROFS"},
		{"host /tmp file", tryOpen + `import os; print(attempt(lambda: open('` + hostTmp.Name() + `').read()), os.listdir('/tmp'))`, isErr("No such file"), "host /tmp invisible"},
		{"root dir", `import os; print(sorted(os.listdir('/')))`, equals("['bin', 'dev', 'etc', 'home', 'lib', 'lib64', 'opt', 'proc', 'sbin', 'tmp', 'usr', 'workspace']"), "only the jail's dirs (/opt holds ToolsDir)"},
		{"dev", `import os; print(sorted(os.listdir('/dev')))`, equals("['fd', 'full', 'null', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']"), "minimal /dev"},
		{"identity", `import os, pwd, socket; print(os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name, os.getcwd(), os.environ['HOME'], socket.gethostname())`, equals("1000 1000 sandbox /workspace /workspace sandbox"), "uid 1000 named sandbox"},
		{"capabilities", `s = dict(l.split(':\t') for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print(s['CapInh'], s['CapPrm'], s['CapEff'], s['CapBnd'], s['CapAmb'], s['NoNewPrivs'], s['Seccomp'])`, equals("0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 1 2"), "no capabilities, no_new_privs, seccomp filter"},
		{"interfaces", `print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))`, equals("['lo']"), "only loopback"},
		{"route out", tryOpen + `import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print(attempt(lambda: s.connect(('192.0.2.1', 9))))`, isErr("Network is unreachable"), "no route (UDP connect sends nothing)"},
		{"ptrace", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    import time; time.sleep(5); os._exit(0)
r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
print(r, os.strerror(ctypes.get_errno())); os.kill(pid, 9)`, equals("-1 Operation not permitted"), "EPERM"},
		{"mount", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"unshare user", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"keyctl", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(250, 0, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"bpf", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(321, 0, 0, 0), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"io_uring", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(120)
print(libc.syscall(425, 8, buf), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"clone newns", `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(56, 0x00020000 | 17, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))`, equals("-1 Operation not permitted"), "EPERM"},
		{"netlink audit", tryOpen + `import socket; print(attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)))`, isErr("Address family not supported"), "EAFNOSUPPORT (NETLINK_AUDIT)"},
		{"netlink uevent", tryOpen + `import socket; print(attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 15)))`, isErr("Address family not supported"), "EAFNOSUPPORT (NETLINK_KOBJECT_UEVENT)"},
		{"netlink netfilter", tryOpen + `import socket; print(attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)))`, isErr("Address family not supported"), "EAFNOSUPPORT (NETLINK_NETFILTER)"},
		// NETLINK_ROUTE lists the jail's own interfaces; changing them
		// needs CAP_NET_ADMIN.
		{"netlink route", `import socket; print(socket.if_nameindex())`, equals("[(1, 'lo')]"), "only loopback, listed"},
		{"netlink route change", tryOpen + `import socket, struct
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
s.bind((0, 0))
# RTM_NEWLINK (16) on lo: set it down (ifi_change IFF_UP).
ifinfo = struct.pack('BxHiII', socket.AF_UNSPEC, 0, 1, 0, 1)
msg = struct.pack('IHHII', 16 + len(ifinfo), 16, 0x5, 1, 0) + ifinfo
s.send(msg)
reply = s.recv(4096)
err = struct.unpack('i', reply[16:20])[0]
print('OK' if err == 0 else 'refused: ' + __import__('os').strerror(-err))`, isErr("Operation not permitted"), "EPERM (no CAP_NET_ADMIN)"},
		{"packet socket", tryOpen + `import socket; print(attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)))`, isErr("Address family not supported"), "EAFNOSUPPORT"},
		{"kernel addresses", `import os
seen = [open(p, 'rb').read(10) for p in ('/proc/kallsyms', '/proc/kcore', '/proc/keys', '/proc/timer_list') if os.path.exists(p)]
print(len(seen) > 0 and all(b == b'' for b in seen))`, equals("True"), "masked (empty)"},
		{"proc sys", tryOpen + `print(attempt(lambda: open('/proc/sys/kernel/hostname', 'w').write('x')))`, isErr("Read-only file system"), "EROFS"},
	}
	// Each attack from a fresh jail's program, then from a command
	// joined to a running jail (Config.Join): the same result.
	live := liveJail(t, "attacks", Limits{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := mustPrint(t, c.code)
			if !c.want(got) {
				t.Errorf("attack %q: got %q, want %s", c.name, got, c.desc)
			}
		})
		t.Run(c.name+" joined", func(t *testing.T) {
			t.Parallel()
			r, out, errs := joinPy(t, live, c.code, nil)
			if got := strings.TrimSpace(out); r.ExitCode != 0 || !c.want(got) {
				t.Errorf("attack %q from a joined command: got %q (exit %d, %s), want %s", c.name, got, r.ExitCode, errs, c.desc)
			}
		})
	}
}

func isErr(substr string) func(string) bool {
	return func(s string) bool { return s != "OK" && strings.Contains(s, substr) }
}
func hasPrefix(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}
func equals(want string) func(string) bool { return func(s string) bool { return s == want } }

func TestHostLoopbackUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	got := mustPrint(t, fmt.Sprintf(`import socket
s = socket.socket()
s.settimeout(5)
try:
    s.connect(('127.0.0.1', %d)); print('connected')
except OSError as e:
    print(type(e).__name__)`, port))
	if got != "ConnectionRefusedError" {
		t.Errorf("connect to the host's listener: got %q, want ConnectionRefusedError", got)
	}
	select {
	case <-accepted:
		t.Error("the host listener accepted a connection from the jail")
	default:
	}
}

func TestLoopbackInsideWorks(t *testing.T) {
	got := mustPrint(t, `import socket, threading
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
port = srv.getsockname()[1]
threading.Thread(target=lambda: srv.accept()[0].sendall(b'pong'), daemon=True).start()
c = socket.create_connection(('127.0.0.1', port)); print(c.recv(4).decode())`)
	if got != "pong" {
		t.Errorf("loopback server inside the jail: got %q, want pong", got)
	}
}

func TestNoInheritedDescriptors(t *testing.T) {
	// A descriptor without close-on-exec, as a careless parent might leave.
	fd, err := syscall.Open("/etc/hostname", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	got := mustPrint(t, `import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))`)
	// 0-2 and the descriptor listdir itself opened.
	if got != "[0, 1, 2, 3]" {
		t.Errorf("descriptors in the jail: %s, want [0, 1, 2, 3]", got)
	}
}

func TestExtraFilesHandedOver(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	res := runPy(t, `import os; os.write(3, b'via fd 3'); print(sorted(int(f) for f in os.listdir('/proc/self/fd')))`, func(c *Config) {
		c.ExtraFiles = []*os.File{w}
	})
	w.Close()
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "via fd 3" || strings.TrimSpace(res.stdout) != "[0, 1, 2, 3, 4]" {
		t.Errorf("extra file: read %q, fds %s", buf[:n], res.stdout)
	}
}

// Limits.Pids counts the program's processes, not the init's threads:
// under a limit of 10, Python (1) can start 9 more, and not many beyond
// (the init's room is a fixed allowance, not an exact count).
func TestPidsCountsTheProgramsProcesses(t *testing.T) {
	r := runPy(t, `import subprocess
ps = []
try:
    for i in range(20):
        ps.append(subprocess.Popen(["sleep", "30"]))
except OSError:
    pass
print(len(ps))
for p in ps: p.kill(); p.wait()`, func(c *Config) { c.Limits.Pids = 10 })
	if n, _ := strconv.Atoi(strings.TrimSpace(r.stdout)); n < 9 || n > 9+initThreads {
		t.Errorf("under a pids limit of 10, python started %q more processes, want about 9 (stderr %q)", r.stdout, r.stderr)
	}
}

func TestForkBombStoppedByPidsLimit(t *testing.T) {
	r := runPy(t, `import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print(n, type(e).__name__)`, func(c *Config) { c.Limits.Pids = 32 })
	f := strings.Fields(r.stdout)
	if len(f) != 2 || f[1] != "BlockingIOError" {
		t.Fatalf("fork bomb: stdout %q stderr %q", r.stdout, r.stderr)
	}
	if n, _ := strconv.Atoi(f[0]); n >= 32+initThreads || n < 8 {
		t.Errorf("fork bomb made %d processes under a limit of 32", n)
	}
	if r.res.Duration > 20*time.Second {
		t.Errorf("the sleeping children outlived the program: run took %s", r.res.Duration)
	}
}

func TestMemoryBombOOMKilled(t *testing.T) {
	if detectCgroups().mode == "" {
		t.Skip("no cgroups: OOM kills cannot be observed")
	}
	r := runPy(t, `chunks = []
while True:
    chunks.append(bytearray(8 << 20))`, func(c *Config) { c.Limits.Memory = 64 << 20 })
	if !r.res.OOMKilled || r.res.ExitCode != 137 {
		t.Errorf("memory bomb: %+v", r.res)
	}
	if r.res.MemoryPeak < 32<<20 || r.res.MemoryPeak > 80<<20 {
		t.Errorf("peak memory %d, want close to the 64 MiB limit", r.res.MemoryPeak)
	}
}

func TestCPUSpinStoppedAtTimeout(t *testing.T) {
	r := runPy(t, `while True: pass`, func(c *Config) { c.Limits.Timeout = time.Second })
	if !r.res.TimedOut || r.res.ExitCode != 137 {
		t.Errorf("spin: %+v", r.res)
	}
	if r.res.Duration < time.Second || r.res.Duration > 15*time.Second {
		t.Errorf("spin ran %s with a 1s timeout", r.res.Duration)
	}
}

func TestCPUQuota(t *testing.T) {
	if detectCgroups().mode == "" {
		t.Skip("no cgroups")
	}
	// Two spinning processes for 1.5s wall under a quota of a quarter core.
	r := runPy(t, `import os, time
end = time.time() + 1.5
pid = os.fork()
while time.time() < end: pass
if pid == 0: os._exit(0)
os.wait()`, func(c *Config) { c.Limits.CPUs = 0.25 })
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", r.res.ExitCode, r.stderr)
	}
	// Unthrottled they would use twice the wall time (~3s of CPU); the
	// quota allows a quarter of it, from the moment the jail starts (so
	// Python's start-up counts against both, on a slow host too), plus a
	// period's burst.
	if limit := r.res.Duration*4/10 + 100*time.Millisecond; r.res.CPUTime > limit {
		t.Errorf("CPU time %s over %s wall under a 0.25 CPU quota (bound %s)", r.res.CPUTime, r.res.Duration, limit)
	}
}

func TestPrintFloodBounded(t *testing.T) {
	flood := func(mib int, timeout time.Duration) (*Result, *Capture, *Capture) {
		capOut := NewCapture(64<<10, 64<<10)
		capErr := NewCapture(64<<10, 64<<10)
		res, err := Run(context.Background(), &Config{
			Path: DefaultPython, Workspace: t.TempDir(), Stdout: capOut, Stderr: capErr,
			Limits: Limits{Timeout: timeout},
			Args: []string{"python3", "-c", fmt.Sprintf(`import sys
chunk = b'x' * (1 << 20)
for _ in range(%d): sys.stdout.buffer.write(chunk)
sys.stdout.flush()
print('the end', flush=True)
def deep(): raise ValueError('after the flood')
deep()`, mib)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return res, capOut, capErr
	}
	// The timeout scales with this machine: 1 GiB takes 32 times what
	// 32 MiB takes here (start included), with room to spare (an
	// emulated one moves ~8 MiB/s; this one ~1 GiB/s).
	start := time.Now()
	flood(32, 10*time.Minute)
	timeout := max(2*time.Minute, 3*32*time.Since(start))
	res, capOut, capErr := flood(1024, timeout)
	if res.ExitCode != 1 {
		t.Errorf("exit %d", res.ExitCode)
	}
	if capOut.Total() < 1<<30 || capOut.Dropped() < (1<<30)-(128<<10) {
		t.Errorf("stdout total %d dropped %d", capOut.Total(), capOut.Dropped())
	}
	if !strings.HasSuffix(string(capOut.Tail()), "the end\n") {
		t.Errorf("stdout tail lost the last line: %q", capOut.Tail()[len(capOut.Tail())-20:])
	}
	if s := capErr.String(); !strings.Contains(s, "Traceback") || !strings.Contains(s, "ValueError: after the flood") {
		t.Errorf("traceback lost: %q", s)
	}
}

func TestDoubleForkedDaemonGone(t *testing.T) {
	marker := "sandloop-daemon-" + rand.Text()
	r := runPy(t, fmt.Sprintf(`import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['sleep', '300', '%s'])
    os._exit(0)
time.sleep(0.3)
print('parent done')`, marker), nil)
	if !strings.Contains(r.stdout, "parent done") {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
		t.Errorf("daemon survived the run: host pids %v", pids)
	}
}

func TestWorkspaceAndLimitsOnFiles(t *testing.T) {
	r := runPy(t, `import os
open('out.txt', 'w').write('written in the jail')
try:
    open('big', 'wb').write(b'x' * (2 << 20))
    print('big written')
except OSError as e:
    print(type(e).__name__)
try:
    for i in range(4):
        open('/tmp/t%d' % i, 'wb').write(b'x' * (900 << 10))
except OSError as e:
    print('tmp', e.strerror)`, func(c *Config) {
		c.Limits.FileSize = 1 << 20
		c.Limits.TmpSize = 2 << 20
	})
	if b, err := os.ReadFile(filepath.Join(r.ws, "out.txt")); err != nil || string(b) != "written in the jail" {
		t.Errorf("workspace file: %q %v", b, err)
	}
	// RLIMIT_FSIZE raises SIGXFSZ, which Python ignores, so write fails with EFBIG.
	if !strings.Contains(r.stdout, "OSError") && !strings.Contains(r.stdout, "File too large") {
		t.Errorf("file size limit not enforced: %q %q", r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "tmp No space left on device") {
		t.Errorf("/tmp cap not enforced: %q", r.stdout)
	}
}

func TestExitCodeSignalAndStats(t *testing.T) {
	r := runPy(t, `import os, signal, sys; x = bytearray(40 << 20); sys.stdout.write('hi'); sys.stdout.flush(); os.kill(os.getpid(), signal.SIGSEGV)`, nil)
	if r.res.ExitCode != 128+11 || r.res.Signal != "SIGSEGV" {
		t.Errorf("signal: %+v", r.res)
	}
	if r.res.MemoryPeak < 40<<20 {
		t.Errorf("peak memory %d below the 40 MiB allocated", r.res.MemoryPeak)
	}
	r = runPy(t, `import sys; sys.exit(7)`, nil)
	if r.res.ExitCode != 7 || r.res.Signal != "" || r.res.CPUTime <= 0 {
		t.Errorf("exit 7: %+v", r.res)
	}
}

func TestBadConfig(t *testing.T) {
	ws := t.TempDir()
	cases := []*Config{
		{Path: "", Workspace: ws},
		{Path: DefaultPython, Workspace: filepath.Join(ws, "missing")},
		{Path: DefaultPython, Workspace: ""}, // never the current directory
		{Path: DefaultPython, Workspace: ws, Limits: Limits{Memory: 1024}},
		{Path: DefaultPython, Workspace: ws, Network: "internet"},
		{Path: DefaultPython, Workspace: ws, Files: []File{{Path: "/workspace/x"}}},
		{Path: DefaultPython, Workspace: ws, Mounts: []Mount{{Host: ws, Path: ToolsDir}}}, // would hide python and pip
		{Path: DefaultPython, Workspace: ws, Mounts: []Mount{{Host: ws, Path: ToolsDir + "/x"}}},
	}
	for _, c := range cases {
		_, err := Run(context.Background(), c)
		var ae *ArgumentError
		if !asArgErr(err, &ae) {
			t.Errorf("config %+v: got %v, want an ArgumentError", c, err)
		}
	}
	// A program that does not exist is a setup error, reported cleanly.
	if _, err := Run(context.Background(), &Config{Path: "/nonexistent", Workspace: ws}); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("missing program: %v", err)
	}
}

func asArgErr(err error, target **ArgumentError) bool {
	ae, ok := err.(*ArgumentError)
	if ok {
		*target = ae
	}
	return ok
}

func TestFilesPlacedReadOnly(t *testing.T) {
	r := runPy(t, `print(open('/opt/sandloop/hello.py').read())
try:
    open('/opt/sandloop/hello.py', 'w')
except OSError as e:
    print(e.strerror)`, func(c *Config) {
		c.Files = []File{{Path: "/opt/sandloop/hello.py", Data: []byte("print('hi')")}}
	})
	if r.stdout != "print('hi')\nRead-only file system\n" {
		t.Errorf("got %q", r.stdout)
	}
}

// E2B's images have `python` and `pip`; a jail has them too, as the
// root's python3 (ToolsDir, last on PATH), whatever the host's /usr has.
func TestPythonAndPipCommands(t *testing.T) {
	want, err := exec.Command(DefaultPython, "-c", "import sys; print(sys.version)").Output()
	if err != nil {
		t.Fatal(err)
	}
	r := runPy(t, "", func(c *Config) {
		c.Path, c.Args = "/bin/sh", []string{"sh", "-c", `python -c 'import sys; print(sys.version)' && command -v python && pip --version >/dev/null && echo pip runs`}
	})
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.res.ExitCode, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || lines[0] != strings.TrimSpace(string(want)) || lines[2] != "pip runs" {
		t.Errorf("python, then pip, in a jail: got %q, want the sandbox's %q then %q", r.stdout, strings.TrimSpace(string(want)), "pip runs")
	}
	// Neither can be replaced from inside: the directory is in the jail's
	// read-only root.
	r = runPy(t, `import os
for p in ('/opt/sandloop/bin/python', '/opt/sandloop/bin/evil'):
    try:
        open(p, 'w')
        print('written', p)
    except OSError as e:
        print(e.strerror)`, nil)
	if r.stdout != "Read-only file system\nRead-only file system\n" {
		t.Errorf("writing into %s: got %q", ToolsDir, r.stdout)
	}
}

// leftovers is what the jails of this process could leave behind.
type leftovers struct {
	cgroups []string
	inits   []int
	mounts  map[string]bool // mount points, with their filesystem type
}

func takeLeftovers() leftovers {
	var l leftovers
	liveGroups.Range(func(k, _ any) bool {
		if _, err := os.Stat(k.(string)); err == nil {
			l.cgroups = append(l.cgroups, k.(string))
		}
		return true
	})
	l.inits = RunningInits()
	// Not the capped workspaces other sandloops on this host mount and
	// unmount meanwhile (this package mounts none).
	l.mounts = map[string]bool{}
	for _, m := range readMountinfo() {
		if !strings.HasPrefix(filepath.Base(m.point), "sandloop-ws-") {
			l.mounts[m.point+" "+m.fstype] = true
		}
	}
	return l
}

func TestNothingLeftAfter200Runs(t *testing.T) {
	if testing.Short() {
		t.Skip("200 runs")
	}
	ws := t.TempDir()
	tmp := t.TempDir()
	hostTmp := os.TempDir()
	t.Setenv("TMPDIR", tmp)
	before := takeLeftovers()
	// A daemon with a unique duration, to find survivors by.
	marker := fmt.Sprintf("60.%09d", time.Now().UnixNano()%1e9)
	for i := 0; i < 200; i++ {
		cfg := &Config{Path: "/bin/sh", Args: []string{"sh", "-c", "sleep " + marker + " & echo $$"}, Workspace: ws}
		if i%4 == 0 {
			cfg.Limits.Timeout = 50 * time.Millisecond
		}
		if _, err := Run(context.Background(), cfg); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	after := takeLeftovers()
	if len(after.cgroups) != len(before.cgroups) || len(after.inits) != len(before.inits) {
		t.Errorf("left behind: before %+v after %+v", before, after)
	}
	// A mount another test process removed meanwhile is not ours to count;
	// one that appeared is, unless it is in the host's temporary
	// directory outside this test's own (where the runs' TMPDIR pointed):
	// other packages' tests, run beside this one, mount there
	// (/tmp/sandloop-zygote-rootless-*/...).
	for m := range after.mounts {
		point, _, _ := strings.Cut(m, " ")
		others := strings.HasPrefix(point, hostTmp+"/") && !strings.HasPrefix(point, tmp+"/") && !strings.HasPrefix(point, ws+"/") && point != tmp && point != ws
		if !before.mounts[m] && !others {
			t.Errorf("a mount appeared: %s", m)
		}
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("temp entries left: %v", entries)
	}
	if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
		t.Errorf("a jailed sleep survived: pids %v", pids)
	}
}

func TestDoctorProbe(t *testing.T) {
	r := Probe()
	if !r.UserNamespaces.OK || !r.Namespaces.OK || !r.Seccomp.OK {
		t.Errorf("probe: %+v", r)
	}
	b, _ := json.Marshal(r)
	t.Logf("%s", b)
}

// TestRlimitsBindTheProgramNotTheInit: where rlimits stand in for cgroups
// (run rootless, by TestRootless), the program gets the memory and process
// limits, soft and hard, and the init keeps its own: a Go init under a
// 64 MiB RLIMIT_DATA died now and then while building the jail, before
// the program ran ("out of memory allocating heap arena metadata").
func TestRlimitsBindTheProgramNotTheInit(t *testing.T) {
	if os.Getenv("SANDLOOP_ROOTLESS_CHILD") == "" {
		t.Skip("run by TestRootless, where limits are rlimits")
	}
	const memory = 64 << 20
	r := runPy(t, `print(open("/proc/self/limits").read()); print("----"); print(open("/proc/1/limits").read())`,
		func(c *Config) { c.Limits.Memory = memory; c.Limits.Pids = 40 })
	if r.res.Enforcement != "rlimits" {
		t.Skipf("limits are enforced by %s here", r.res.Enforcement)
	}
	self, init, ok := strings.Cut(r.stdout, "----")
	if !ok {
		t.Fatalf("no limits read: %q %q", r.stdout, r.stderr)
	}
	limit := func(limits, name string) string {
		for _, l := range strings.Split(limits, "\n") {
			if rest, ok := strings.CutPrefix(l, name); ok {
				f := strings.Fields(rest)
				if len(f) >= 2 {
					return f[0] + " " + f[1]
				}
			}
		}
		t.Fatalf("no %q in %q", name, limits)
		return ""
	}
	wantData := fmt.Sprintf("%d %d", memory, memory)
	if got := limit(self, "Max data size"); got != wantData {
		t.Errorf("the program's data limit is %q, want %q", got, wantData)
	}
	// 40 of the program's own, and the init's threads (the same user) as
	// they were when it started the program: at least one, at most the
	// room the jail keeps for them.
	var soft, hard int
	if got := limit(self, "Max processes"); func() bool { _, err := fmt.Sscan(got, &soft, &hard); return err != nil }() || soft != hard || soft <= 40 || soft > 40+initThreads {
		t.Errorf("the program's process limit is %q, want 40 and the init's threads (at most %d)", got, initThreads)
	}
	if got := limit(init, "Max data size"); strings.HasPrefix(got, fmt.Sprint(memory)) {
		t.Errorf("the init runs under the program's data limit (%q)", got)
	}
	if got := limit(init, "Max processes"); strings.HasPrefix(got, fmt.Sprint(40+initThreads)) {
		t.Errorf("the init runs under the program's process limit (%q)", got)
	}
}

// TestRootless runs a subset of this file as an unprivileged user: the jail
// must still work, with rlimits standing in for cgroups.
func TestRootless(t *testing.T) {
	if os.Getenv("SANDLOOP_ROOTLESS_CHILD") != "" {
		if os.Geteuid() == 0 {
			t.Fatal("child still root")
		}
		r := runPy(t, `import os; print(os.getuid())`, nil)
		if strings.TrimSpace(r.stdout) != "1000" || r.res.Enforcement == "" {
			t.Fatalf("rootless run: %+v %q %q", r.res, r.stdout, r.stderr)
		}
		t.Logf("rootless enforcement: %s warnings: %v", r.res.Enforcement, r.res.Warnings)
		t.Logf("rootless init: %s", InitInfo())
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	bin, tmp := testutil.CopyForNobody(t, "sandloop-rootless-", "jail.test")
	subset := "^(TestRootless|TestFreezeAnyHost|TestRlimitsBindTheProgramNotTheInit|TestAttacksFail|TestForkBombStoppedByPidsLimit|TestCPUSpinStoppedAtTimeout|TestDoubleForkedDaemonGone|TestNoInheritedDescriptors|TestMemoryBombOOMKilled|TestTerminalInteractivePython|TestTerminalIoctlsRefused|TestJoinSharesTheJail|TestJoinKillEndsTheGroup|TestJoinHeldByTheJailsLimits|TestJoinUsesTheProgram|TestJoinProgramConfinesAsTheScript|TestJoinProgramReportsAsTheScript)$"
	rootless := func(t *testing.T, cgroupFD int) string {
		cmd := exec.Command(bin, "-test.run", subset, "-test.v")
		cmd.Env = []string{"SANDLOOP_ROOTLESS_CHILD=1", "TMPDIR=" + tmp, "PATH=/usr/bin:/bin", "HOME=" + tmp}
		cmd.Dir = tmp
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if cgroupFD >= 0 {
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("rootless subset failed: %v\n%s", err, out)
		}
		for _, test := range []string{"TestAttacksFail", "TestTerminalInteractivePython", "TestTerminalIoctlsRefused", "TestJoinSharesTheJail", "TestJoinKillEndsTheGroup", "TestJoinHeldByTheJailsLimits"} {
			if !bytes.Contains(out, []byte("--- PASS: "+test)) {
				t.Errorf("%s did not pass rootless:\n%s", test, out)
			}
		}
		for _, test := range []string{"TestJoinUsesTheProgram", "TestJoinProgramConfinesAsTheScript", "TestJoinProgramReportsAsTheScript"} {
			if generatedJoin() && !bytes.Contains(out, []byte("--- PASS: "+test)) {
				t.Errorf("%s did not pass rootless:\n%s", test, out)
			}
		}
		if !bytes.Contains(out, []byte("--- PASS: TestFreezeAnyHost")) {
			t.Errorf("pausing a jail did not work rootless:\n%s", out)
		}
		if generatedInit(t) && !bytes.Contains(out, []byte("rootless init: a small init")) {
			t.Errorf("the rootless jails did not start the generated init:\n%s", out)
		}
		return string(out)
	}
	t.Run("undelegated", func(t *testing.T) {
		if out := rootless(t, -1); !strings.Contains(out, "rootless enforcement: rlimits") {
			t.Errorf("rootless run did not fall back to rlimits:\n%s", out)
		}
	})
	// A group delegated to the user, as systemd delegates user@UID.service.
	t.Run("delegated", func(t *testing.T) {
		g, fd := delegatedTestGroup(t, 65534)
		if g == "" {
			t.Skip("no cgroup v2 hierarchy with memory, pids and cpu")
		}
		out := rootless(t, fd)
		if !strings.Contains(out, "rootless enforcement: cgroup v2") || !strings.Contains(out, "--- PASS: TestMemoryBombOOMKilled") {
			t.Errorf("a rootless run in a delegated group did not use it:\n%s", out)
		}
	})
}

// delegatedTestGroup makes a cgroup v2 group with memory, pids and cpu,
// owned by uid as systemd delegates one, and returns it and a descriptor
// of it for SysProcAttr.CgroupFD ("" where the host has no such v2
// hierarchy).
func delegatedTestGroup(t *testing.T, uid int) (string, int) {
	t.Helper()
	var mount string
	for _, m := range readMountinfo() {
		if m.fstype == "cgroup2" && hasAll(strings.Fields(readFileString(filepath.Join(m.point, "cgroup.controllers"))), v2Controllers) {
			mount = m.point
			break
		}
	}
	if mount == "" || enableV2(mount, false) != nil {
		return "", -1
	}
	g := filepath.Join(mount, "sandloop-test-"+rand.Text())
	if err := os.Mkdir(g, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(g) })
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(g, f), uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return g, int(f.Fd())
}

// shareGroup starts another process (a sleep) in the cgroup fd, as a
// login session's group holds processes other than sandloop, and returns
// its PID; it is killed at the test's end.
func shareGroup(t *testing.T, fd int) int {
	t.Helper()
	other := exec.Command("sleep", "600")
	other.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	return other.Process.Pid
}

// removeTree removes a cgroup and its children, killing what is in them.
func removeTree(dir string) {
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.procs"))
	for _, s := range subs {
		removeTree(filepath.Dir(s))
	}
	(&cgroup{mode: "cgroup v2", dirs: []string{dir}}).remove()
}

// The group sandloop manages on cgroup v2: its own when it is alone in it
// (moved into a supervisor leaf so the group can enable controllers), a
// group of its own at the top when it shares its group with a process that
// is not its own (never taking that process over).
func TestCgroupV2Delegation(t *testing.T) {
	if os.Getenv("SANDLOOP_CGROUP_PROBE_CHILD") != "" {
		t.Skip("helper")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	self, _ := os.Executable()
	probe := func(t *testing.T, fd int) (cgroupHost, string) {
		t.Helper()
		cmd := exec.Command(self, "-test.run", "^TestMain$")
		cmd.Env = append(os.Environ(), "SANDLOOP_CGROUP_PROBE_CHILD=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		var res struct {
			Mode, V2, Reason, Cgroup string
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("probe said %q", out)
		}
		return cgroupHost{mode: res.Mode, v2: res.V2, reason: res.Reason}, res.Cgroup
	}
	t.Run("alone", func(t *testing.T) {
		g, fd := delegatedTestGroup(t, 0)
		if g == "" {
			t.Skip("no cgroup v2 hierarchy with memory, pids and cpu")
		}
		h, in := probe(t, fd)
		if h.mode != "cgroup v2" || h.v2 != g {
			t.Fatalf("alone in %s, sandloop manages %+v", g, h)
		}
		if want := filepath.Join(g, supervisorLeaf); !strings.HasSuffix(want, in) {
			t.Errorf("sandloop ran in %s, want %s", in, want)
		}
		if got := strings.Fields(readFileString(filepath.Join(g, "cgroup.subtree_control"))); !hasAll(got, v2Controllers) {
			t.Errorf("controllers for the sandboxes: %v", got)
		}
	})
	t.Run("shared", func(t *testing.T) {
		g, fd := delegatedTestGroup(t, 0)
		if g == "" {
			t.Skip("no cgroup v2 hierarchy with memory, pids and cpu")
		}
		other := shareGroup(t, fd)
		h, _ := probe(t, fd)
		if h.mode != "cgroup v2" || filepath.Base(h.v2) != "sandloop" || filepath.Dir(h.v2) != filepath.Dir(g) {
			t.Errorf("sharing %s, sandloop manages %+v, want a group of its own at the top", g, h)
		}
		if procs := readFileString(filepath.Join(g, "cgroup.procs")); procs != strconv.Itoa(other) {
			t.Errorf("the other process was moved: %s holds %q", g, procs)
		}
	})
}

// generatedInit says whether this binary embeds the generated init.
func generatedInit(t *testing.T) bool {
	t.Helper()
	_, err := fs.Stat(initexe, initexeName)
	return err == nil
}

// With the generated init (make test generates it), a jail starts that
// small program, not this binary; without it, this binary, and both work.
func TestJailStartsTheSmallInit(t *testing.T) {
	if !generatedInit(t) {
		t.Skip("no generated init in this build: run `go generate ./internal/jail` (make test does)")
	}
	path, about := initExecutable()
	if path == selfExe {
		t.Fatalf("the generated init is not used: %s", about)
	}
	self, _ := os.Executable()
	initOf := func() string {
		t.Helper()
		p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", "import time; time.sleep(60)"}, Workspace: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Wait()
		defer p.Kill()
		// The path it reads may differ where /run is a mount of its own
		// (the init runs in another mount namespace): compare the files.
		exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", p.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(exe, want) {
			exeName, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.Pid()))
			// Another sandloop (a test package running at the same time)
			// may have written the same init again under the same name,
			// replacing the file this jail started from: same bytes.
			if strings.TrimSuffix(exeName, " (deleted)") == path {
				a, errA := os.ReadFile(fmt.Sprintf("/proc/%d/exe", p.Pid()))
				b, errB := os.ReadFile(path)
				if errA == nil && errB == nil && bytes.Equal(a, b) {
					return path
				}
			}
			return exeName
		}
		return path
	}
	if got := initOf(); got != path {
		t.Errorf("the jail's init is %s, want %s (%s)", got, path, about)
	}
	// Pruned by another sandloop: written again at the next start, which
	// prunes the inits of other builds unused for an hour.
	stale := filepath.Join(filepath.Dir(path), "sandloop-init-0000000000stale")
	if err := os.WriteFile(stale, []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().Add(-2 * time.Hour)
	os.Chtimes(stale, hourAgo, hourAgo)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := initOf(); got != path {
		t.Errorf("after the cached init was removed, the jail's init is %s, want %s", got, path)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		os.Remove(stale)
		t.Errorf("an init unused for two hours was not pruned: %v", err)
	}
	// A cached init that cannot be executed (here: not executable) is
	// given up: the jail starts with this binary instead. (A copy: the
	// cached init is shared with every other sandloop on this machine,
	// other packages' tests among them.)
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	noexec := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(noexec, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	saved := initExecutable
	initExecutable = func() (string, string) { return noexec, "a copy that cannot be executed" }
	r := runPy(t, `print("still ok")`, nil)
	initExecutable = saved
	if strings.TrimSpace(r.stdout) != "still ok" {
		t.Errorf("a jail after the init could not be executed: %+v %q", r.res, r.stderr)
	}
	if !strings.Contains(InitInfo(), "could not be started") {
		t.Errorf("InitInfo after the init could not be executed: %s", InitInfo())
	}
	if got := initOf(); got != self {
		t.Errorf("after giving up the small init, the jail's init is %s, want this binary", got)
	}
	initUnusable.Store(nil)

	initExecutable = func() (string, string) { return selfExe, "forced" }
	defer func() { initExecutable = saved }()
	if got := initOf(); got != self {
		t.Errorf("with the fallback, the jail's init is %s, want this binary %s", got, self)
	}
	r = runPy(t, `print("fallback ok")`, nil)
	if strings.TrimSpace(r.stdout) != "fallback ok" {
		t.Errorf("a jail with this binary as init: %+v %q", r.res, r.stderr)
	}
}

// The cache the init is written to must be this user's alone.
func TestInitCacheMustBeOurs(t *testing.T) {
	dir := t.TempDir()
	if err := ownedByUs(dir, true); err != nil {
		t.Fatalf("a private directory: %v", err)
	}
	os.Chmod(dir, 0o777)
	if err := ownedByUs(dir, true); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("a world-writable directory: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink("/usr/bin/python3", link)
	if err := ownedByUs(link, false); err == nil || !strings.Contains(err.Error(), "not a plain file") {
		t.Errorf("a symlink: %v", err)
	}
	if os.Geteuid() == 0 {
		f := filepath.Join(t.TempDir(), "f")
		os.WriteFile(f, nil, 0o755)
		os.Chown(f, 65534, 65534)
		if err := ownedByUs(f, false); err == nil || !strings.Contains(err.Error(), "another user") {
			t.Errorf("someone else's file: %v", err)
		}
	}
}

// Groups a killed sandloop left behind are removed by the next one; live
// groups and young ones are not.
func TestSweepStaleGroups(t *testing.T) {
	h := detectCgroups()
	if h.mode == "" {
		t.Skip("no cgroups: " + h.reason)
	}
	old := time.Now().Add(-time.Hour)
	mk := func() *cgroup {
		t.Helper()
		cg, err := newCgroup(h, "sandloop-sweeptest-"+rand.Text(), Limits{}.WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cg.remove() })
		for _, d := range cg.dirs {
			liveGroups.Delete(d) // as if another process had made it
		}
		return cg
	}
	left, young, busy := mk(), mk(), mk()
	for _, cg := range []*cgroup{left, busy} {
		for _, d := range cg.dirs {
			if err := os.Chtimes(d, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleeper.Wait()
	defer sleeper.Process.Kill()
	if err := busy.add(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sweepStaleGroups(h, time.Minute)
	exists := func(cg *cgroup) bool {
		_, err := os.Stat(cg.dirs[0])
		return err == nil
	}
	if exists(left) {
		t.Errorf("an empty group left an hour ago is still there: %v", left.dirs)
	}
	if !exists(young) {
		t.Errorf("a group made a moment ago was removed")
	}
	if !exists(busy) {
		t.Errorf("a group with a process in it was removed")
	}
}

func TestListenerHandedToTheHost(t *testing.T) {
	ws := t.TempDir()
	var out, errb bytes.Buffer
	code := `
import socket, os
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"ping")
print(s.recv(16).decode())
# Nothing of the listener is left in the jail: only 0-2 are open.
fds = []
for x in os.listdir("/proc/self/fd"):
    try:
        if int(x) > 2 and int(x) != s.fileno() and os.readlink("/proc/self/fd/" + x).startswith("socket:"):
            fds.append(int(x))
    except OSError:
        pass
print(fds)
# Still no route out.
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.connect(("192.0.2.1", 53)); print("udp: routed")
except OSError as e:
    print("udp:", e.strerror)
`
	p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", code}, Workspace: ws,
		Stdout: &out, Stderr: &errb, Limits: Limits{Timeout: 60 * time.Second}, ListenPort: 3128})
	if err != nil {
		t.Fatal(err)
	}
	ln := p.Listener()
	if ln == nil {
		t.Fatal("no listener")
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 4)
		c.Read(b)
		c.Write([]byte("pong:" + string(b)))
	}()
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %v %v:\n%s", res, err, errb.String())
	}
	if got, want := out.String(), "pong:ping\n[]\nudp: Network is unreachable\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("the listener is still open after the jail ended")
	}
	var ae *ArgumentError
	if _, err := Start(context.Background(), &Config{Path: DefaultPython, Workspace: ws, Network: NetworkHost, ListenPort: 3128}); !errors.As(err, &ae) {
		t.Errorf("ListenPort with the host's network: %v", err)
	}
}

// A workspace whose owner was killed before Remove (its name names a
// process that has ended) is unmounted and removed by the next sandloop;
// one of a live process is left alone.
func TestSweepQuotaDirs(t *testing.T) {
	// (It mounts tmpfs workspaces on the host, as root's are. Without
	// root, workspaces are mounted in a user namespace: nothing to sweep.)
	if r := hostQuotaUnsupported(); r != "" {
		t.Skip("mounts on the host: " + r)
	}
	tmp := t.TempDir()
	deadOwner := deadOwner(t)
	mk := func(owner string, mount bool) string {
		t.Helper()
		p := filepath.Join(tmp, "sandloop-ws-"+owner+"-1")
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if mount {
			if err := syscall.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Unmount(p, syscall.MNT_DETACH) })
		}
		return p
	}
	leftMounted, leftPlain := mk(deadOwner, true), mk(deadOwner+"-zygote", false)
	live := mk(selfOwner, true)
	other := filepath.Join(tmp, "sandloop-ws-12345")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if n := sweepQuotaDirs(tmp); n != 2 {
		t.Errorf("swept %d workspaces, want 2 (a dead owner's, mounted and a zygote's plain one)", n)
	}
	for _, p := range []string{leftMounted, leftPlain} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s of a dead owner is still there (%v)", p, err)
		}
	}
	for _, p := range []string{live, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	mounted := false
	for _, m := range readMountinfo() {
		if m.point == leftMounted {
			t.Errorf("%s is still mounted", leftMounted)
		}
		mounted = mounted || m.point == live
	}
	if !mounted {
		t.Errorf("the live workspace %s was unmounted", live)
	}
}

// A process that lives on sweeps again: a workspace a sandloop killed
// leaves after this process's first sweep is removed by a later call
// (sweepEvery after the last sweep, in the background), not only by the
// next process to start.
func TestSweepRepeats(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	sweepNow() // this process's first sweep, if it has not swept yet
	left := filepath.Join(tmp, "sandloop-ws-"+deadOwner(t)+"-1")
	if err := os.Mkdir(left, 0o755); err != nil {
		t.Fatal(err)
	}
	swept := make(chan struct{})
	sweepMu.Lock()
	every, done := sweepEvery, sweepDone
	sweepEvery, sweepDone = 0, func() { close(swept) }
	sweepMu.Unlock()
	t.Cleanup(func() {
		sweepMu.Lock()
		sweepEvery, sweepDone = every, done
		sweepMu.Unlock()
	})
	d, err := OwnedTempDir("repeat")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(d)
	select {
	case <-swept:
	case <-time.After(30 * time.Second):
		t.Fatal("no sweep after sweepEvery")
	}
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead owner's workspace %s is still there (%v)", left, err)
	}
}

// deadOwner names (as a workspace's name does) a process that has ended.
func deadOwner(t *testing.T) string {
	t.Helper()
	dead := exec.Command("true")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	owner := procOwner(dead.Process.Pid)
	if owner == "" {
		t.Fatal("no start time for a child that has not been waited for")
	}
	if err := dead.Wait(); err != nil {
		t.Fatal(err)
	}
	return owner
}

// A lasting workspace (a durable session's) whose owner died is spared
// by sweeps while it holds files, for LeftoverGrace after the first sweep
// that saw it left (the next server takes its files: Leftover,
// RemoveLeftover); an empty one goes at once, as any other; the note of
// one taken since goes too.
func TestSweepSparesLeftFiles(t *testing.T) {
	if r := hostQuotaUnsupported(); r != "" {
		t.Skip("mounts on the host: " + r)
	}
	tmp := t.TempDir()
	owner := deadOwner(t)
	mk := func(name string, file bool) string {
		t.Helper()
		p := filepath.Join(tmp, "sandloop-ws-"+owner+"-lasting-"+name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unmountAll(p) })
		if file {
			if err := os.WriteFile(filepath.Join(p, "late.txt"), []byte("late"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	full, empty, taken := mk("full", true), mk("empty", false), mk("taken", true)
	mine := filepath.Join(tmp, "sandloop-ws-"+selfOwner+"-lasting-x")
	if err := os.Mkdir(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	if !Leftover(full, 0) || Leftover(mine, 0) || !Leftover(mine, os.Getpid()) {
		t.Fatal("Leftover: want true for a dead owner's lasting workspace, and a live one's only when it is the keeper named")
	}
	os.Remove(mine)
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	marker := func(p string) string { return filepath.Join(tmp, goneMarker+filepath.Base(p)) }

	if n := sweepQuotaDirs(tmp); n != 1 {
		t.Errorf("first sweep removed %d, want 1 (the empty one)", n)
	}
	if exists(empty) || !exists(full) || !exists(marker(full)) || !exists(filepath.Join(full, "late.txt")) {
		t.Fatalf("after the first sweep: empty there %v, full there %v, noted %v", exists(empty), exists(full), exists(marker(full)))
	}
	if n, bytes := leftWorkspaces(tmp); n != 2 || bytes < 4 {
		t.Errorf("left workspaces: %d holding %d bytes, want the 2 holding files", n, bytes)
	}
	// The next server takes one; a later sweep within the grace spares
	// the other and drops the taken one's note.
	if err := RemoveLeftover(taken, 0); err != nil {
		t.Fatal(err)
	}
	if exists(taken) || exists(marker(taken)) {
		t.Errorf("RemoveLeftover left %s or its note", taken)
	}
	os.WriteFile(marker(taken), nil, 0o600) // (as if a sweep noted it between)
	if n := sweepQuotaDirs(tmp); n != 0 || !exists(full) {
		t.Errorf("a sweep within the grace removed %d (the left files there: %v)", n, exists(full))
	}
	if exists(marker(taken)) {
		t.Error("the note of a taken workspace is left")
	}
	// A note dated ahead of the clock (planted: the temporary directory
	// is everyone's) does not keep it forever: a sweep replaces it.
	later := time.Now().Add(24 * time.Hour)
	if err := os.Chtimes(marker(full), later, later); err != nil {
		t.Fatal(err)
	}
	if n := sweepQuotaDirs(tmp); n != 0 || !exists(full) {
		t.Errorf("a sweep with a planted note removed %d", n)
	}
	if fi, err := os.Stat(marker(full)); err != nil || fi.ModTime().After(time.Now().Add(time.Minute)) {
		t.Errorf("the planted note was not replaced: %v %v", fi, err)
	}
	// Past the grace, it goes, with its note and its mount.
	old := time.Now().Add(-LeftoverGrace - time.Minute)
	if err := os.Chtimes(marker(full), old, old); err != nil {
		t.Fatal(err)
	}
	if n := sweepQuotaDirs(tmp); n != 1 || exists(full) || exists(marker(full)) {
		t.Errorf("a sweep past the grace removed %d (there: %v, noted: %v)", n, exists(full), exists(marker(full)))
	}
	for _, m := range readMountinfo() {
		if strings.HasPrefix(m.point, tmp) {
			t.Errorf("%s is still mounted", m.point)
		}
	}
}

// The default workspace quota stays within the memory limit it counts
// toward, and DiskFits refuses one above it.
func TestDiskFitsMemory(t *testing.T) {
	for _, c := range []struct {
		in       Limits
		wantDisk int64
		fits     bool
	}{
		{Limits{}, DefaultDisk, true},
		{Limits{Memory: 128 << 20}, 64 << 20, true},
		{Limits{Memory: 100<<20 + 1}, 50 << 20, true},
		{Limits{Memory: 128 << 20, Disk: 128 << 20}, 128 << 20, true},
		{Limits{Memory: 128 << 20, Disk: 129 << 20}, 129 << 20, false},
		{Limits{Disk: 1 << 30}, 1 << 30, false},
	} {
		l := c.in.WithDefaults()
		err := l.DiskFits()
		var de *DiskOverMemoryError
		if l.Disk != c.wantDisk || (err == nil) != c.fits || (err != nil && (!errors.As(err, &de) || de.Disk != l.Disk || de.Memory != l.Memory)) {
			t.Errorf("%+v: disk %d, %v; want disk %d, fits %v", c.in, l.Disk, err, c.wantDisk, c.fits)
		}
	}
}
