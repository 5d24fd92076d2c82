package jail

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// liveJail starts a jail whose program writes marker into its /tmp, then
// waits on its stdin; it is killed when the test ends.
func liveJail(t *testing.T, marker string, l Limits) *Process {
	t.Helper()
	in, stdinW := io.Pipe()
	var out bytes.Buffer
	p, err := Start(context.Background(), &Config{
		Path: DefaultPython,
		Args: []string{"python3", "-c", fmt.Sprintf(`import os, sys
open('/tmp/marker', 'w').write(%q)
os.rename('/tmp/marker', '/tmp/kernel')
sys.stdin.read()`, marker)},
		Workspace: testWorkspace(t), Limits: l, Stdin: in, Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdinW.Close()
		p.Kill()
		p.Wait()
	})
	return p
}

// liveTarget is liveJail's jail with no limits of its own, and a join
// target of it (closed at the test's end, before the jail).
func liveTarget(t *testing.T, marker string) (*Process, *JoinTarget) {
	t.Helper()
	a := liveJail(t, marker, Limits{})
	target, err := a.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	return a, target
}

// joinPy runs code in p's jail and returns what it printed.
func joinPy(t *testing.T, p *Process, code string, mod func(*Config)) (*Result, string, string) {
	t.Helper()
	target, err := p.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	var out, errb bytes.Buffer
	cfg := &Config{Path: DefaultPython, Args: []string{"python3", "-c", code}, Join: target, Stdout: &out, Stderr: &errb,
		Limits: Limits{Timeout: 60 * time.Second}}
	if mod != nil {
		mod(cfg)
	}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("join: %v\n%s%s", err, out.String(), errb.String())
	}
	return r, out.String(), errb.String()
}

func TestJoinSharesTheJail(t *testing.T) {
	t.Setenv("SANDLOOP_TEST_SECRET", "hunter2-server-env")
	a := liveJail(t, "jail A", Limits{})
	b := liveJail(t, "jail B", Limits{})
	testutil.WaitFor(t, 60*time.Second, func() error {
		_, out, _ := joinPy(t, a, `print(open('/tmp/kernel').read())`, nil)
		if strings.TrimSpace(out) != "jail A" {
			return fmt.Errorf("the kernel's /tmp/kernel not seen yet: %q", out)
		}
		return nil
	})

	hostFile, err := os.CreateTemp("/tmp", "sandloop-host-file-")
	if err != nil {
		t.Fatal(err)
	}
	hostFile.Close()
	t.Cleanup(func() { os.Remove(hostFile.Name()) })
	// What the joined process is: the jail's user, namespaces, filter.
	r, out, errs := joinPy(t, a, `import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
cmdlines = [open('/proc/%d/cmdline' % p, 'rb').read() for p in procs if os.path.exists('/proc/%d/cmdline' % p)]
print('uid', os.getuid(), os.getgid())
print('cwd', os.getcwd(), os.path.realpath('/home/user'))
print('host', socket.gethostname())
print('caps', st['CapInh'], st['CapPrm'], st['CapEff'], st['CapBnd'], st['CapAmb'])
print('nnp', st['NoNewPrivs'], 'seccomp', st['Seccomp'])
print('unshare', libc.unshare(0x10000000), ctypes.get_errno())
print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())
print('kernel seen', any(b'/tmp/kernel' in c for c in cmdlines))
print('other jail seen', any(b'jail ' + b'B' in c for c in cmdlines))
print('pid1', open('/proc/1/cmdline', 'rb').read().split(b'\0')[0].decode())
print('cgroup same', open('/proc/self/cgroup').read() == open('/proc/1/cgroup').read())
print('secret', any('hunter2' in v for v in os.environ.values()))
print('host file', os.path.exists('`+hostFile.Name()+`'))
print('lo', socket.create_server(('127.0.0.1', 0)) is not None)
`, nil)
	if r.ExitCode != 0 {
		t.Fatalf("joined program: %+v\n%s%s", r, out, errs)
	}
	for _, want := range []string{
		"uid 1000 1000", "cwd /workspace /workspace", "host sandbox",
		"caps 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000",
		"nnp 1 seccomp 2", "unshare -1 1", "mount -1 1", "kernel seen True", "other jail seen False",
		"pid1 " + initArg0, "cgroup same True", "secret False", "host file False", "lo True",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("joined program: want %q in:\n%s", want, out)
		}
	}
	// From the host: in the jail's cgroup.
	if a.cg != nil {
		target, err := a.JoinTarget()
		if err != nil {
			t.Fatal(err)
		}
		defer target.Close()
		j, err := Start(context.Background(), &Config{Path: "/bin/sleep", Args: []string{"sleep", "600"}, Join: target})
		if err != nil {
			t.Fatal(err)
		}
		theirs, ours := readFileString(fmt.Sprintf("/proc/%d/cgroup", a.Pid())), readFileString(fmt.Sprintf("/proc/%d/cgroup", j.joinPid))
		j.Kill()
		j.Wait()
		if theirs == "" || theirs != ours {
			t.Errorf("the joined program's cgroups:\n%s\nthe jail's:\n%s", ours, theirs)
		}
	}

	// Jail B's /tmp is its own.
	_, out, _ = joinPy(t, b, `print(open('/tmp/kernel').read())`, nil)
	if strings.TrimSpace(out) != "jail B" {
		t.Errorf("jail B's /tmp: %q", out)
	}

	// A server a joined command leaves running answers another joined
	// command on the jail's loopback, and lives until the jail ends.
	r, out, errs = joinPy(t, a, `import subprocess
p = subprocess.Popen(['nohup', 'python3', '-c', 'import socket\ns = socket.create_server(("127.0.0.1", 8765))\nwhile True:\n    c, _ = s.accept(); c.sendall(b"hello from the server\\n"); c.close()'],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print(p.pid)`, nil)
	if r.ExitCode != 0 {
		t.Fatalf("start a server: %+v %s %s", r, out, errs)
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		_, out, errs := joinPy(t, a, `import socket; print(socket.create_connection(('127.0.0.1', 8765)).recv(100).decode())`, nil)
		if !strings.Contains(out, "hello from the server") {
			return fmt.Errorf("no answer: %q %q", out, errs)
		}
		return nil
	})
	// Jail B's loopback is another.
	_, out, _ = joinPy(t, b, `import socket
try:
    socket.create_connection(('127.0.0.1', 8765)); print('reached')
except OSError as e:
    print('refused')`, nil)
	if strings.TrimSpace(out) != "refused" {
		t.Errorf("jail B reached jail A's server: %q", out)
	}
	servers := testutil.PidsWithArg("hello from the server")
	if len(servers) != 1 {
		t.Fatalf("the background server on the host: %v", servers)
	}
	a.Kill()
	a.Wait()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if err := syscall.Kill(servers[0], 0); err == nil {
			return fmt.Errorf("the background server %d outlived its jail", servers[0])
		}
		return nil
	})
	if _, err := a.JoinTarget(); err == nil {
		t.Error("a target of an ended jail")
	}
}

func TestJoinKillEndsTheGroup(t *testing.T) {
	a, target := liveTarget(t, "kill")
	out := &screen{}
	// A job of an interactive shell has a process group of its own.
	p, err := Start(context.Background(), &Config{Path: "/bin/bash", Args: []string{"bash", "-i", "-c", "sleep 1001.5 & sleep 1002.5 & echo started; wait"},
		Join: target, Stdout: out, Terminal: &WindowSize{Cols: 80, Rows: 24}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		if len(testutil.PidsWithArg("1002.5")) == 0 || !strings.Contains(out.String(), "started") {
			return fmt.Errorf("not started")
		}
		return nil
	})
	for _, pid := range testutil.PidsWithArg("1002.5") {
		st := strings.Fields(readFileString(fmt.Sprintf("/proc/%d/stat", pid)))
		if len(st) > 5 && st[1] == "(sleep)" && st[4] == st[5] {
			t.Errorf("the job's group is its session's: %v", st[:6])
		}
	}
	p.Kill()
	r, err := p.Wait()
	if err != nil || r.Signal != "SIGKILL" || r.Unreported {
		t.Fatalf("killed: %+v %v, want SIGKILL as its waiter reported it", r, err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if left := append(testutil.PidsWithArg("1001.5"), testutil.PidsWithArg("1002.5")...); len(left) > 0 {
			return fmt.Errorf("left behind: %v", left)
		}
		return nil
	})
	// The jail itself lives on.
	select {
	case <-a.Done():
		t.Fatal("killing a joined command ended its jail")
	default:
	}
}

func TestJoinHeldByTheJailsLimits(t *testing.T) {
	a := liveJail(t, "limits", Limits{Memory: 64 << 20, Pids: 16})
	// (The children end with their parent: they wait for the end of a
	// pipe it holds.)
	r, out, errs := joinPy(t, a, `import os
r, w = os.pipe()
n = 0
try:
    for i in range(64):
        if os.fork() == 0:
            os.close(w); os.read(r, 1); os._exit(0)
        n += 1
except OSError as e:
    print('refused', n)`, nil)
	if !strings.Contains(out, "refused") {
		t.Errorf("64 processes in a jail of 16: %+v %s %s", r, out, errs)
	}
	var res *Result
	testutil.WaitFor(t, 60*time.Second, func() error {
		target, err := a.JoinTarget()
		if err != nil {
			return err
		}
		defer target.Close()
		var o, e bytes.Buffer
		res, err = Run(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", "b = bytearray(200 << 20); print('allocated')"},
			Join: target, Stdout: &o, Stderr: &e})
		out, errs = o.String(), e.String()
		return err
	})
	r = res
	if strings.Contains(out, "allocated") || r.ExitCode == 0 {
		t.Errorf("200 MiB in a jail of 64: %+v %s %s", r, out, errs)
	}
	if r.Signal != "SIGKILL" && !strings.Contains(errs, "MemoryError") {
		t.Errorf("over the memory limit: %+v %s", r, errs)
	}
	t.Logf("over the memory limit: exit %d %s (%s)", r.ExitCode, r.Signal, r.Enforcement)
}

// A joined program on a terminal: it answers what is typed, with the
// terminal as its controlling terminal, in the foreground.
func TestJoinTerminal(t *testing.T) {
	_, target := liveTarget(t, "terminal")
	for _, args := range [][]string{{"python3", "-q"}, {"bash", "-i", "-l", "-c", "python3 -q"}, {"bash", "-i", "-l"}} {
		in, typed := io.Pipe()
		out := &screen{}
		path := DefaultPython
		if args[0] == "bash" {
			path = "/bin/bash"
		}
		p, err := Start(context.Background(), &Config{Path: path, Args: args, Join: target, Stdin: in, Stdout: out, Terminal: &WindowSize{Cols: 80, Rows: 24}})
		if err != nil {
			t.Fatal(err)
		}
		at := 0
		if len(args) == 3 {
			at = out.waitShown(t, 0, `\$ $`)
			io.WriteString(typed, "python3 -q\n")
		}
		at = out.waitShown(t, at, `>>> $`)
		io.WriteString(typed, "import os; print('tty', [os.isatty(i) for i in range(3)], os.tcgetpgrp(0) == os.getpgrp(), 6*7)\n")
		out.waitShown(t, at, `\r\ntty \[True, True, True\] True 42\r\n`)
		p.Kill()
		if r, err := p.Wait(); err != nil || r.Signal != "SIGKILL" {
			t.Errorf("%v after Kill: %+v, %v", args, r, err)
		}
		typed.Close()
	}
}

// A job a joined command leaves running may write to the command's output
// after the command ended (a server's log): it must not die of a closed
// pipe. The command's own output is all there.
func TestJoinLeftJobKeepsWriting(t *testing.T) {
	a := liveJail(t, "writer", Limits{})
	r, out, _ := joinPy(t, a, `import subprocess
subprocess.Popen(['sh', '-c', 'while [ ! -e /tmp/go ]; do sleep 0.05; done; echo late; echo late >&2; touch /tmp/survived'])
print('early')`, nil)
	if r.ExitCode != 0 || out != "early\n" || r.Signal != "" {
		t.Fatalf("the command: %+v %q", r, out)
	}
	joinPy(t, a, `open('/tmp/go', 'w')`, nil)
	testutil.WaitFor(t, 60*time.Second, func() error {
		if _, out, _ := joinPy(t, a, `import os; print(os.path.exists('/tmp/survived'))`, nil); out != "True\n" {
			return fmt.Errorf("the job did not get past its writes")
		}
		return nil
	})
}

// A joined program whose waiter (the join program, on the host's side of
// the jail) dies before it reports the end is taken as killed, and the
// result says its end was not reported.
func TestJoinUnreportedEnd(t *testing.T) {
	_, target := liveTarget(t, "unreported")
	p, err := Start(context.Background(), &Config{Path: "/bin/sleep", Args: []string{"sleep", "1003.5"}, Join: target})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	testutil.WaitFor(t, 60*time.Second, func() error {
		pids := testutil.PidsWithArg("1003.5")
		if len(pids) != 1 {
			return fmt.Errorf("sleep not started: %v", pids)
		}
		pid = pids[0]
		return nil
	})
	t.Cleanup(testutil.Pin(t, pid).Kill) // not by its number: it may be long gone
	st := strings.Fields(readFileString(fmt.Sprintf("/proc/%d/stat", pid)))
	if len(st) < 4 {
		t.Fatalf("stat of the program: %v", st)
	}
	waiter, _ := strconv.Atoi(st[3])
	if comm := strings.TrimSpace(readFileString(fmt.Sprintf("/proc/%d/comm", waiter))); !strings.HasPrefix(comm, "sandloop-join") {
		t.Skipf("the program's parent is %q, not the join program (the join script's path)", comm)
	}
	if err := syscall.Kill(waiter, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r, err := p.Wait()
	if err != nil || !r.Unreported || r.Signal != "SIGKILL" {
		t.Fatalf("a program whose waiter died: %+v %v, want Unreported and SIGKILL", r, err)
	}
}
