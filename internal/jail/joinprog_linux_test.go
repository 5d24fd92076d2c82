package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sandloop/sandloop/internal/testutil"
	"golang.org/x/sys/unix"
)

// useJoinScript makes the test's joins start the join script (on) or the
// join program, where there is one (off), until it ends.
func useJoinScript(t testing.TB, on bool) {
	old := joinScriptOnly.Load()
	joinScriptOnly.Store(on)
	t.Cleanup(func() { joinScriptOnly.Store(old) })
}

// generatedJoin says whether this binary embeds the join program.
func generatedJoin() bool {
	_, err := fs.Stat(joinexe, joinexeName)
	return err == nil
}

// joinProgramOrSkip returns the cached join program, and skips the test
// in a binary built without it.
func joinProgramOrSkip(t *testing.T) string {
	t.Helper()
	if !generatedJoin() {
		t.Skip("built without `go generate ./internal/jail`: joins start the script")
	}
	path, about := joinExecutable()
	if path == "" {
		t.Fatalf("the join program is embedded, but joins do not use it: %s", about)
	}
	return path
}

// Where the join program is embedded, every join uses it: a prepared one
// (both its processes) and one made when its command comes.
func TestJoinUsesTheProgram(t *testing.T) {
	path := joinProgramOrSkip(t)
	if info := JoinInfo(); !strings.HasPrefix(info, "a small program") || !strings.Contains(info, path) {
		t.Errorf("JoinInfo: %q", info)
	}
	a := liveJail(t, "program", Limits{})
	w := prepared(t, a)
	// (Its processes are not dumpable: only root reads their exe.)
	runs := func(pid int) string {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil || os.Geteuid() == 0 {
			return exe
		}
		if strings.HasPrefix(readFileString(fmt.Sprintf("/proc/%d/cmdline", pid)), "sandloop-join\x00") {
			return path
		}
		return ""
	}
	for _, pid := range []int{w.ScriptPid(), w.Pid()} {
		if exe := runs(pid); exe != path {
			t.Errorf("prepared join's process %d runs %q, want %s", pid, exe, path)
		}
	}
	target, err := a.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	p, err := Start(context.Background(), &Config{Path: "/bin/sleep", Args: []string{"sleep", "1005"}, Join: target})
	if err != nil {
		t.Fatal(err)
	}
	exe := runs(p.Pid())
	p.Kill()
	p.Wait()
	if exe != path {
		t.Errorf("a join's host-side process runs %q, want %s", exe, path)
	}
	// Without it (SANDLOOP_JOIN_SCRIPT's knob), the script.
	useJoinScript(t, true)
	if got := joinProgPath(); got != "" {
		t.Errorf("with the script forced, joins start %q", got)
	}
}

// confinementProbe prints, as one JSON line after "PROBE ", what a joined
// program is: its credentials, capabilities, securebits, filter, limits,
// session, signals, descriptors, and what it sees of the processes.
const confinementProbe = `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
keep = ['Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'Seccomp_filters', 'SigBlk', 'SigIgn']
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
cmds = b''.join(open('/proc/%d/cmdline' % p, 'rb').read() for p in procs if os.path.exists('/proc/%d/cmdline' % p))
out = {k: st[k].strip() for k in keep}
out.update(limits=open('/proc/self/limits').read(), sid=os.getsid(0) == os.getpid(), pgrp=os.getpgrp() == os.getpid(),
    ppid=os.getppid(), fds=sorted(os.listdir('/proc/self/fd')), cwd=os.getcwd(), env=sorted(os.environ),
    securebits=libc.prctl(27, 0, 0, 0, 0), unshare=libc.unshare(0x20000) == -1 and ctypes.get_errno(),
    host_seen=b'sleep\x001006.5' in cmds, cgroup=open('/proc/self/cgroup').read() == open('/proc/1/cgroup').read())
print('PROBE ' + json.dumps(out, sort_keys=True))
`

var probeRE = regexp.MustCompile(`PROBE (\{.*\})`)

// probe runs confinementProbe in a's jail (through w if not nil, on a
// terminal if terminal) and returns what it printed, decoded.
func probe(t *testing.T, a *Process, w *Joiner, terminal bool) map[string]any {
	t.Helper()
	target, err := a.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	out := &screen{}
	cfg := &Config{Path: DefaultPython, Args: []string{"python3", "-c", confinementProbe}, Join: target, Stdout: out, Stderr: out,
		Limits: Limits{Timeout: 60 * time.Second}}
	if terminal {
		cfg.Terminal = &WindowSize{Cols: 4000, Rows: 24}
	}
	var p *Process
	if w != nil {
		p, err = w.Start(context.Background(), cfg)
	} else {
		p, err = Start(context.Background(), cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Wait()
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("probe: %+v %v\n%s", r, err, out.String())
	}
	var m map[string]any
	var found []string
	testutil.WaitFor(t, 30*time.Second, func() error {
		if found = probeRE.FindStringSubmatch(out.String()); found == nil {
			return fmt.Errorf("no probe output: %q", out.String())
		}
		return nil
	})
	if err := json.Unmarshal([]byte(found[1]), &m); err != nil {
		t.Fatalf("probe output %q: %v", found[1], err)
	}
	return m
}

// A join by the program confines its program exactly as a join by the
// script and runJoin: the same credentials, no capabilities in any set,
// the same securebits, no_new_privs and filter, limits, session, signals
// and descriptors, and nothing of the host's processes in sight; with
// pipes, prepared ahead, and on a terminal.
func TestJoinProgramConfinesAsTheScript(t *testing.T) {
	joinProgramOrSkip(t)
	host := exec.Command("sleep", "1006.5")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	a := liveJail(t, "confined", Limits{Pids: 100})
	useJoinScript(t, true)
	script := probe(t, a, nil, false)
	scriptTTY := probe(t, a, nil, true)
	scriptPrepared := probe(t, a, prepared(t, a), false)
	joinScriptOnly.Store(false)
	for _, c := range []struct {
		name     string
		got, was map[string]any
	}{
		{"pipes", probe(t, a, nil, false), script},
		{"prepared", probe(t, a, prepared(t, a), false), scriptPrepared},
		{"terminal", probe(t, a, nil, true), scriptTTY},
	} {
		for k, v := range c.was {
			if fmt.Sprint(c.got[k]) != fmt.Sprint(v) {
				t.Errorf("%s: %s is %v by the program, %v by the script", c.name, k, c.got[k], v)
			}
		}
		if len(c.got) != len(c.was) {
			t.Errorf("%s: %d fields vs %d", c.name, len(c.got), len(c.was))
		}
		zero := "0000000000000000"
		for k, want := range map[string]string{
			"Uid": "1000\t1000\t1000\t1000", "Gid": "1000\t1000\t1000\t1000",
			"CapInh": zero, "CapPrm": zero, "CapEff": zero, "CapBnd": zero, "CapAmb": zero,
			"NoNewPrivs": "1", "Seccomp": "2", "SigBlk": zero,
			"SigIgn":     "0000000001001000", // SIGPIPE and SIGXFSZ, by python3 itself
			"securebits": "239", "unshare": "1", "sid": "true", "pgrp": "true", "ppid": "0",
			"host_seen": "false", "cgroup": "true", "cwd": "/workspace", "fds": "[0 1 2 3]",
		} {
			if got := fmt.Sprint(c.got[k]); got != want {
				t.Errorf("%s: %s is %q, want %q", c.name, k, got, want)
			}
		}
		// NPROC: the program's 100 and the init's room; 100 alone where
		// no cgroup counts (then DATA holds its memory too).
		nproc := `Max processes\s+116\s+116`
		if a.cg == nil {
			nproc = `Max data size\s+536870912\s+536870912(.|\n)*Max processes\s+100\s+100`
		}
		if lim := fmt.Sprint(c.got["limits"]); !regexp.MustCompile(nproc).MatchString(lim) ||
			!regexp.MustCompile(`Max core file size\s+0\s+0`).MatchString(lim) {
			t.Errorf("%s: limits\n%s", c.name, lim)
		}
	}
}

// A join by the program fails as one by the script does, in the same
// words: a program that cannot be executed, a directory that is not
// there; and a program's end is reported the same (its code, its signal).
func TestJoinProgramReportsAsTheScript(t *testing.T) {
	joinProgramOrSkip(t)
	a, target := liveTarget(t, "errors")
	type outcome struct {
		err            string
		code           int
		signal, output string
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		// (Reported on the status pipe after {ready}: the program's
		// result is exit code 127, as a shell's.)
		{"missing", Config{Path: "/no/such/program"}, "start /no/such/program: no such file or directory"},
		{"not executable", Config{Path: "/etc/passwd"}, "start /etc/passwd: permission denied"},
		{"quoted", Config{Path: "/no/\"such\"\\\n"}, "start /no/\"such\"\\\n: no such file or directory"},
		{"no directory", Config{Path: "/bin/true", Dir: "/no/such/dir"}, "chdir /no/such/dir: no such file or directory"},
		{"exit code", Config{Path: "/bin/sh", Args: []string{"sh", "-c", "echo out; exit 3"}}, ""},
		{"signal", Config{Path: "/bin/sh", Args: []string{"sh", "-c", "kill -KILL $$"}}, ""},
	}
	// reports are the errors a join reports on its status pipe, to its end.
	reports := func(cfg Config) []string {
		j, err := spawnJoin(target, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		setup, _ := target.setup(false)
		if err := j.enter(setup); err != nil {
			t.Fatal(err)
		}
		if err := j.send(joinCommandOf(&cfg)); err != nil {
			t.Fatal(err)
		}
		var errs []string
		for {
			var st joinStatus
			if readJoinStatus(j.status, &st) != nil {
				break
			}
			if st.Error != "" {
				errs = append(errs, st.Error)
			}
		}
		j.wait()
		j.stR.Close()
		return errs
	}
	run := func(cfg Config, w *Joiner) outcome {
		var out bytes.Buffer
		cfg.Join, cfg.Stdout = target, &out
		var p *Process
		var err error
		if w != nil {
			p, err = w.Start(context.Background(), &cfg)
		} else {
			p, err = Start(context.Background(), &cfg)
		}
		if err != nil {
			return outcome{err: err.Error()}
		}
		r, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		return outcome{code: r.ExitCode, signal: r.Signal, output: out.String()}
	}
	for _, c := range cases {
		useJoinScript(t, true)
		was, wasPrepared, wasReported := run(c.cfg, nil), run(c.cfg, prepared(t, a)), reports(c.cfg)
		joinScriptOnly.Store(false)
		got, gotPrepared, gotReported := run(c.cfg, nil), run(c.cfg, prepared(t, a)), reports(c.cfg)
		if got != was || gotPrepared != wasPrepared {
			t.Errorf("%s: the program: %+v, prepared %+v; the script: %+v, prepared %+v", c.name, got, gotPrepared, was, wasPrepared)
		}
		if fmt.Sprint(gotReported) != fmt.Sprint(wasReported) {
			t.Errorf("%s: the program reported %q, the script %q", c.name, gotReported, wasReported)
		}
		if c.want != "" && (len(gotReported) != 1 || gotReported[0] != c.want) {
			t.Errorf("%s: reported %q, want %q", c.name, gotReported, c.want)
		}
		if strings.HasPrefix(c.want, "start ") && got.code != 127 {
			t.Errorf("%s: %+v, want exit code 127", c.name, got)
		}
		if strings.HasPrefix(c.want, "chdir ") && got.err != "join the sandbox: "+c.want {
			t.Errorf("%s: %+v, want the error %q", c.name, got, c.want)
		}
	}
	if o := run(cases[4].cfg, nil); o.code != 3 || o.output != "out\n" {
		t.Errorf("exit code: %+v", o)
	}
	if o := run(cases[5].cfg, nil); o.code != 137 || o.signal != "SIGKILL" {
		t.Errorf("signal: %+v", o)
	}
	// A NUL byte no exec can pass is the caller's to fix, on either way.
	for _, script := range []bool{true, false} {
		joinScriptOnly.Store(script)
		_, err := Start(context.Background(), &Config{Path: "/bin/echo", Args: []string{"echo", "a\x00b"}, Join: target, Stdout: io.Discard})
		if _, ok := err.(*ArgumentError); !ok {
			t.Errorf("a NUL in an argument (script %v): %v", script, err)
		}
	}
}

// A cached join program that cannot be executed (a noexec cache; here:
// not executable) is given up: joins start the script from then on.
func TestJoinWithoutAnExecutableProgram(t *testing.T) {
	path := joinProgramOrSkip(t)
	a := liveJail(t, "noexec", Limits{})
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// (A copy: the cached program is shared with every sandloop here.)
	noexec := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(noexec, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	saved := joinExecutable
	joinExecutable = func() (string, string) { return noexec, "a copy that cannot be executed" }
	t.Cleanup(func() {
		joinExecutable = saved
		joinUnusable.Store(nil)
	})
	r, out, errs := joinPy(t, a, `import os; print(os.getuid())`, nil)
	if r.ExitCode != 0 || out != "1000\n" {
		t.Errorf("a join after the program could not be executed: %+v %q %q", r, out, errs)
	}
	if !strings.Contains(JoinInfo(), "could not be started") || joinProgPath() != "" {
		t.Errorf("JoinInfo after the program could not be executed: %s (joins start %q)", JoinInfo(), joinProgPath())
	}
}

// ignoreInHost ignores signal s in this process, the host, until the test
// ends: GNU make starts its children with 32 and 33 ignored, and so did
// `make test` the server. (The Go runtime leaves 32 to whoever has it.)
func ignoreInHost(t *testing.T, s int) {
	t.Helper()
	ign := kernelSigaction{handler: sigIgn}
	var old kernelSigaction
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s), uintptr(unsafe.Pointer(&ign)), uintptr(unsafe.Pointer(&old)), 8, 0, 0); e != 0 {
		t.Fatalf("ignore signal %d: %v", s, e)
	}
	t.Cleanup(func() {
		unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s), uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
	})
}

// A signal the server was started with ignored is not ignored in its
// sandboxes: a new jail's program, and programs joined to it by the
// script (the init's join mode) and by the join program, find only what
// python3 ignores itself (SIGPIPE and SIGXFSZ).
func TestHostIgnoredSignalsStayOutside(t *testing.T) {
	ignoreInHost(t, 32)
	const want = "0000000001001000"
	out := &screen{}
	p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", confinementProbe},
		Workspace: testWorkspace(t), Stdout: out, Stderr: out, Limits: Limits{Timeout: 60 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(); err != nil || r.ExitCode != 0 {
		t.Fatalf("probe: %+v %v\n%s", r, err, out.String())
	}
	found := probeRE.FindStringSubmatch(out.String())
	if found == nil {
		t.Fatalf("no probe output: %q", out.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(found[1]), &m); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(m["SigIgn"]); got != want {
		t.Errorf("a new jail's program ignores %s, want %s", got, want)
	}
	a := liveJail(t, "ignored", Limits{})
	useJoinScript(t, true)
	if got := fmt.Sprint(probe(t, a, nil, false)["SigIgn"]); got != want {
		t.Errorf("a program joined by the script ignores %s, want %s", got, want)
	}
	if generatedJoin() {
		joinScriptOnly.Store(false)
		if got := fmt.Sprint(probe(t, a, nil, false)["SigIgn"]); got != want {
			t.Errorf("a program joined by the join program ignores %s, want %s", got, want)
		}
	}
}
