package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	if args := os.Getenv("SANDLOOP_CLI_CHILD"); args != "" {
		// The CLI itself, for asNobody.
		os.Exit(execute(strings.Split(args, "\x1f"), os.Stdin, os.Stdout, os.Stderr))
	}
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin)) // the binary builtBinary made (120 MB)
	}
	os.Exit(code)
}

// asNobody runs the CLI as uid 65534 (a copy of this test binary, in a
// directory nobody may read) and returns exit code, stdout, stderr.
func asNobody(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := nobodyCommand(t, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// nobodyCommand returns the CLI with args as a command run by nobody (a
// copy of this test binary it can execute), in a directory of its own.
func nobodyCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	dir, err := os.MkdirTemp("", "sandloop-cli-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandloop.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"SANDLOOP_CLI_CHILD=" + strings.Join(args, "\x1f"), "TMPDIR=" + dir, "HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// Without root (and no cgroup delegated to nobody here, or on a v2 host
// a group shared with root's test), cgroups fall back to rlimits: doctor
// says warn with the fix, not FAIL, and its verdict agrees; run prints one
// short warning line.
func TestRootlessFallbackIsAWarning(t *testing.T) {
	code, out, errOut := asNobody(t, "doctor")
	if code != 0 {
		t.Fatalf("doctor exit %d:\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "warn  cgroups") || !regexp.MustCompile(`warn  cgroups .*\n +fix: (systemd-run --user --scope -p Delegate=yes|give the container its own writable cgroup)`).MatchString(out) ||
		!strings.Contains(out, "can be built on this host, with weaker limits") {
		t.Errorf("rootless doctor:\n%s", out)
	}
	// Without root the workspace quota is a tmpfs made in a user
	// namespace (detached, or held by the holder before 6.15), and the
	// zygote is not used: said, not failed.
	if !strings.Contains(out, "ok    workspace quota   256M and 20000 files per workspace by default (--disk, --files): a size- and inode-capped tmpfs per workspace, made in a user namespace") ||
		!strings.Contains(out, "--    zygote            not used: ") ||
		!strings.Contains(out, "--    fork files        each child of a fork gets its own copy of the parent's files (shared only as root: ") {
		t.Errorf("rootless doctor does not say how the quota is enforced and that the zygote is not used:\n%s", out)
	}
	if !strings.Contains(out, "of which importing 6 packages took") {
		t.Errorf("doctor's jail timing does not say what it includes:\n%s", out)
	}
	dir, err := os.MkdirTemp("", "sandloop-cli-script-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	script := writeFile(t, dir, "two.py", "print(1)\nprint(2)\nopen('res.txt', 'w').write(open('in.txt').read() * 2)\n")
	// --with and --out reach the workspace (a tmpfs held by a descriptor).
	in := writeFile(t, dir, "in.txt", "ab")
	outDir := filepath.Join(dir, "out")
	os.Mkdir(outDir, 0o755)
	os.Chown(outDir, 65534, 65534)
	code, out, errOut = asNobody(t, "run", "--with", in, "--out", outDir, script)
	if code != 0 || out != "1\n2\n" {
		t.Fatalf("rootless run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(outDir, "res.txt")); err != nil || string(b) != "abab" {
		t.Errorf("rootless run --out: res.txt %q, %v", b, err)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "warning") || len(lines[0]) > 120 {
		t.Errorf("want one short warning line, got:\n%s", errOut)
	}
}

// sandloop runs the CLI in-process and returns exit code, stdout, stderr.
func sandloop(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunMirrorsExitCodeAndStreams(t *testing.T) {
	dir := t.TempDir()
	script := writeFile(t, dir, "hello.py", `import sys
print("args", sys.argv[1:])
print("to stderr", file=sys.stderr)
sys.exit(3)`)
	code, out, errOut := sandloop(t, "", "run", script, "a", "--flag-for-script")
	if code != 3 {
		t.Errorf("exit code %d, want 3 (stderr %q)", code, errOut)
	}
	if out != "args ['a', '--flag-for-script']\n" || !strings.Contains(errOut, "to stderr") {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
}

func TestRunWithOutAndStats(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	os.Mkdir(data, 0o755)
	writeFile(t, data, "in.csv", "a,b\n1,2\n")
	script := writeFile(t, dir, "job.py", `import csv
rows = list(csv.reader(open("data/in.csv")))
open("result.txt", "w").write(str(len(rows)))`)
	out := filepath.Join(dir, "out")
	code, _, errOut := sandloop(t, "", "run", "--with", data, "--out", out, "--stats", "--memory", "256M", "--cpus", "0.5", "--pids", "64", "--timeout", "30s", "--env", "X=1", script)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(out, "result.txt")); err != nil || string(b) != "2" {
		t.Errorf("--out result.txt: %q %v", b, err)
	}
	if !strings.Contains(errOut, "sandloop: duration ") || !strings.Contains(errOut, "peak memory") {
		t.Errorf("--stats missing: %q", errOut)
	}
}

// A run without --out that leaves files says they go with the sandbox,
// naming them; its inputs (the script, --with) and caches are not named,
// nor is anything when the program wrote nothing.
func TestRunSaysFilesAreDiscarded(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	os.Mkdir(data, 0o755)
	writeFile(t, data, "in.csv", "a,b\n")
	script := writeFile(t, dir, "job.py", `import os
os.makedirs("results", exist_ok=True)
open("results/summary.txt", "w").write("2")
os.makedirs(".cache", exist_ok=True)
open(".cache/x", "w").write("c")
open("data/in.csv", "a").write("1,2\n")`)
	code, _, errOut := sandloop(t, "", "run", "--with", data, script)
	want := "sandloop: note: the program wrote 2 file(s) (data/in.csv, results/summary.txt), discarded with its sandbox; to keep them, run again with --out DIR\n"
	if code != 0 || errOut != want {
		t.Errorf("exit %d, stderr %q; want 0, %q", code, errOut, want)
	}
	code, _, errOut = sandloop(t, "", "run", "--with", data, writeFile(t, dir, "read.py", `print(open("data/in.csv").read())`))
	if code != 0 || errOut != "" {
		t.Errorf("a run that wrote nothing: exit %d, stderr %q", code, errOut)
	}
}

func TestExecCodeAndStdin(t *testing.T) {
	code, out, _ := sandloop(t, "", "exec", "-c", "print(6*7)")
	if code != 0 || out != "42\n" {
		t.Errorf("exec -c: %d %q", code, out)
	}
	code, out, _ = sandloop(t, "import os\nprint(os.environ['GREETING'])\n", "exec", "--env", "GREETING=hi")
	if code != 0 || out != "hi\n" {
		t.Errorf("exec stdin: %d %q", code, out)
	}
	code, _, errOut := sandloop(t, "", "exec", "--timeout", "500ms", "-c", "while True: pass")
	if code != 124 || !strings.Contains(errOut, "timed out after 500ms") {
		t.Errorf("timeout: %d %q", code, errOut)
	}
	code, _, errOut = sandloop(t, "", "exec", "--memory", "64M", "-c", "x = [bytearray(8<<20) for _ in range(100)]")
	if code != 137 || !strings.Contains(errOut, "out of memory") {
		t.Errorf("oom: %d %q", code, errOut)
	}
}

func TestBadInputExitsTwo(t *testing.T) {
	dir := t.TempDir()
	script := writeFile(t, dir, "ok.py", "print(1)")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", filepath.Join(dir, "missing.py")}, "cannot read"},
		{[]string{"run"}, "give the script: sandloop run FILE"},
		{[]string{"run", "--memory", "lots", script}, `"lots" is not a size`},
		{[]string{"run", "--timeout", "soon", script}, "invalid argument"},
		{[]string{"exec", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"exec", "--env", "NOEQUALS", "-c", "1"}, "must be KEY=VALUE"},
		{[]string{"exec", "--memory", "1k", "-c", "1"}, "--memory must be at least 16M"},
		{[]string{"run", "--with", filepath.Join(dir, "nodir"), script}, "--with"},
		{[]string{"exec", "--disk", "1k", "-c", "1"}, "--disk must be at least 1M"},
		{[]string{"exec", "--files", "3", "-c", "1"}, "--files must be at least 16"},
		{[]string{"exec", "--max-output", "10", "-c", "1"}, "--max-output must be at least 1K"},
		// The workspace counts toward memory: a quota above it is refused
		// in every command that makes workspaces, naming both numbers.
		{[]string{"exec", "--disk", "1G", "-c", "1"}, "--disk 1G is more than --memory 512M: the workspace is held in memory"},
		{[]string{"run", "--memory", "256M", "--disk", "300M", script}, "--disk 300M is more than --memory 256M"},
		{[]string{"mcp", "--disk", "600M"}, "--disk 600M is more than --memory 512M"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--memory", "1G", "--disk", "2G"}, "--disk 2G is more than --memory 1G"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--max-memory", "1G", "--max-disk", "2G"}, "--max-disk 2G is more than --max-memory 1G"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--max-disk", "1G"}, "--max-disk 1G is more than --max-memory 512M"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--idle-action", "kill"}, `--idle-action: idle action "kill": must be "close" or "pause"`},
		{[]string{"doctor", "--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"frobnicate"}, "unknown command"},
		// A wrong number of arguments says how the command is used.
		{[]string{"sessions", "exec", "abc", "print(1)"}, "accepts 1 arg(s), received 2 (usage: sandloop sessions exec ID [-c CODE]; see 'sandloop sessions exec --help')"},
		{[]string{"sessions", "rm"}, "(usage: sandloop sessions rm ID...;"},
	}
	for _, c := range cases {
		code, out, errOut := sandloop(t, "", c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || out != "" {
			t.Errorf("%v: exit %d stderr %q stdout %q; want exit 2 and one line containing %q", c.args, code, errOut, out, c.want)
		}
	}
}

func TestDoctor(t *testing.T) {
	code, out, errOut := sandloop(t, "", "doctor")
	if code != 0 {
		t.Fatalf("doctor exit %d:\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"ok    user namespaces", "ok    seccomp", "ok    jail", "Python 3.", "ok    egress proxy      allow mode: a round trip", "numpy", "a safe sandbox can be built",
		"ok    workspace quota   256M and 20000 files per workspace by default", "ok    zygote            serve, mcp and agent fork sessions",
		"ok    pause             cgroup v", "ok    fork files        a fork's children share one read-only copy", "jail join         "} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}

// A flood of output (256 MiB: the bound does not depend on the size)
// reaches the caller bounded by --max-output, with the traceback at its end
// intact and a note of what was dropped; the exit status stays the program's.
func TestExecOutputBounded(t *testing.T) {
	code, out, errOut := sandloop(t, "", "exec", "--max-output", "1M", "-c",
		"import sys\nfor _ in range(16): sys.stdout.write('A' * (16 << 20))\nraise ValueError('the end')")
	if code != 1 {
		t.Errorf("exit %d, want 1 (the program's)", code)
	}
	if len(out)+len(errOut) > 1<<20+200 {
		t.Errorf("passed on %d bytes of stdout and %d of stderr, want at most 1 MiB and a note", len(out), len(errOut))
	}
	if !strings.Contains(errOut, "bytes of stdout dropped (--max-output 1M)") || !strings.HasSuffix(errOut, "ValueError: the end\n") {
		t.Errorf("stderr lacks the note or the traceback: %q", errOut)
	}
	if !strings.HasSuffix(out, strings.Repeat("A", 1000)) {
		t.Errorf("stdout's tail was not kept")
	}
}

// The workspace of exec is capped: writes past --disk and --files fail
// with ENOSPC inside.
func TestExecWorkspaceQuota(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("workspace quotas need root")
	}
	args := []string{"exec", "--disk", "8M", "--files", "40", "-c", `
import errno
def stop(f):
    try:
        f()
    except OSError as e:
        return errno.errorcode[e.errno]
print(stop(lambda: open('big', 'wb').write(b'x' * (64 << 20))))
print(stop(lambda: [open(f'f{i}', 'w').close() for i in range(1000)]))
`}
	code, out, errOut := sandloop(t, "", args...)
	if code != 0 || out != "ENOSPC\nENOSPC\n" {
		t.Errorf("exit %d, stdout %q (want ENOSPC twice), stderr %q", code, out, errOut)
	}
	// Without root too (a tmpfs made in a user namespace).
	if code, out, errOut = asNobody(t, args...); code != 0 || out != "ENOSPC\nENOSPC\n" {
		t.Errorf("as nobody: exit %d, stdout %q (want ENOSPC twice), stderr %q", code, out, errOut)
	}
}

// A zygote asked for where it cannot work (without root, no cgroup
// delegated to the user) is refused at startup: exit 2, one line saying why.
func TestZygoteAskedForButUnsupported(t *testing.T) {
	code, out, errOut := asNobody(t, "serve", "--zygote", "--addr", "127.0.0.1:0")
	if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "--zygote cannot work on this host") ||
		!strings.Contains(errOut, "the zygote needs cgroups: cgroups unavailable") {
		t.Errorf("serve --zygote without root or cgroups: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
