package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// testVersion is stamped into the built binary as `make build` stamps its own.
const testVersion = "v0.0.0-test+ux"

// builtBinary is sandloop built with `go build`, once per test process.
func builtBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sandloop-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "sandloop")
		out, err := exec.Command("go", "build", "-ldflags", "-X main.buildVersion="+testVersion, "-o", builtBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// binary runs the built sandloop with stdin and returns exit code, stdout, stderr.
func binary(t *testing.T, dir, stdin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(builtBinary(t), args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// `sandloop --version` and `sandloop version` print the build's version,
// and MCP's serverInfo carries the same.
func TestVersion(t *testing.T) {
	code, out, errOut := binary(t, "", "", "--version")
	want := testVersion
	if code != 0 || out != "sandloop "+want+"\n" {
		t.Fatalf("--version: exit %d, %q %q", code, out, errOut)
	}
	if code, out, _ := binary(t, "", "", "version"); code != 0 || !strings.HasPrefix(out, "sandloop "+want+" (go") {
		t.Errorf("version: exit %d, %q, want sandloop %s (go...)", code, out, want)
	}
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(builtBinary(t), "mcp")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := cs.InitializeResult().ServerInfo.Version; got != want {
		t.Errorf("MCP serverInfo.version %q, want %q", got, want)
	}
}

// Flags mean what they say: --pids counts the program's processes, 0 is
// refused, --cpus above the host's is capped with a note, a missing FILE
// says what to give.
func TestLimitFlagsMeanWhatTheySay(t *testing.T) {
	spawn := `import subprocess
ps = []
try:
    for i in range(9):
        ps.append(subprocess.Popen(["sleep", "30"]))
except OSError as e:
    print("refused", e)
print(len(ps))
for p in ps: p.kill(); p.wait()`
	if code, out, errOut := binary(t, "", "", "exec", "--pids", "10", "-c", spawn); code != 0 || out != "9\n" {
		t.Errorf("--pids 10 did not allow python and 9 more processes: exit %d, %q %q", code, out, errOut)
	}
	// And no more: the init's threads are not the program's room.
	if code, out, errOut := binary(t, "", "", "exec", "--pids", "8", "-c", strings.Replace(spawn, "range(9)", "range(30)", 1)); code != 0 || !strings.HasSuffix(out, "\n7\n") && !strings.HasSuffix(out, "\n6\n") {
		t.Errorf("--pids 8 let python have other than 7 more processes (6 if the init needed a thread): exit %d, %q %q", code, out, errOut)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--pids", "0", "-c", "1"}, "--pids 0 is not a limit"},
		{[]string{"exec", "--cpus", "0", "-c", "1"}, "--cpus 0 is not a limit"},
		{[]string{"exec", "--files", "0", "-c", "1"}, "--files 0 is not a limit"},
		{[]string{"exec", "--disk", "0", "-c", "1"}, "--disk 0 is not a limit"},
		{[]string{"exec", "--memory", "0", "-c", "1"}, "--memory 0 is not a limit"},
		{[]string{"exec", "--pids", "3", "-c", "1"}, "--pids must be at least 8"},
		{[]string{"exec", "--memory", "8M", "-c", "1"}, "--memory must be at least 16M"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--max-sessions", "0"}, "--max-sessions 0 is not a limit"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--pool", "100"}, "--pool 100 is more than --max-sessions 64"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--max-pids", "0"}, "--max-pids 0 is not a limit"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--max-files", "3"}, "--max-files must be at least 16"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--spare-memory", "0"}, `"0" is not a size (use e.g. 512M or 2G)`},
		{[]string{"run"}, "give the script: sandloop run FILE"},
	} {
		if code, out, errOut := binary(t, "", "", tt.args...); code != 2 || out != "" || !strings.Contains(errOut, tt.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("sandloop %s: exit %d, %q %q; want 2 and one line with %q", strings.Join(tt.args, " "), code, out, errOut, tt.want)
		}
	}
	// Above what the host has: capped, with a note, and the program runs.
	for _, tt := range []struct{ flag, value, note string }{
		{"--pids", "100000000", "--pids 100000000 is more than this host can run (kernel.pid_max): using "},
		{"--memory", "1T", "--memory 1024G is more than this host's memory and swap: using "},
	} {
		code, out, errOut := binary(t, "", "", "exec", tt.flag, tt.value, "-c", "print('ran')")
		if code != 0 || out != "ran\n" || !strings.Contains(errOut, "sandloop: note: "+tt.note) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s %s: exit %d, %q %q", tt.flag, tt.value, code, out, errOut)
		}
	}
	n := runtime.NumCPU()
	code, out, errOut := binary(t, "", "", "exec", "--cpus", fmt.Sprint(n+7), "-c", "print('ran')")
	if code != 0 || out != "ran\n" || !strings.Contains(errOut, fmt.Sprintf("more than this host's %d CPUs: using %d", n, n)) {
		t.Errorf("--cpus %d: exit %d, %q %q", n+7, code, out, errOut)
	}
}

// `sandloop run FILE` behaves like `python3 FILE`: stdin is forwarded
// (input() works when piped), sibling modules import, --with keeps the
// layout of files and directories, --out never silently overwrites and
// leaves caches out.
func TestRunBehavesLikePython(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "helper.py", "X = 41\n")
	os.MkdirAll(filepath.Join(dir, "lib"), 0o755)
	writeFile(t, dir, "lib/__init__.py", "")
	writeFile(t, dir, "lib/m.py", "Y = 1\n")
	os.MkdirAll(filepath.Join(dir, "data", "raw"), 0o755)
	writeFile(t, dir, "data/sales.csv", "day,amount\n")
	writeFile(t, dir, "data/raw/jan.csv", "1\n")
	writeFile(t, dir, "x.py", `import helper, lib.m, os, sys
name = input("name? ")
print("hi", name, helper.X + lib.m.Y, sys.stdin.read().strip())
print(open("data/sales.csv").read().strip(), os.path.exists("data/raw/jan.csv"))
open("result.txt", "w").write("new")
os.makedirs(".cache/pip", exist_ok=True); open(".cache/pip/x", "w").write("c")
os.makedirs("__pycache__", exist_ok=True)
`)
	code, out, errOut := binary(t, dir, "bob\nand the rest\n", "run", "--with", "data", "x.py")
	if code != 0 || out != "name? hi bob 42 and the rest\nday,amount True\n" {
		t.Fatalf("run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// A single file keeps its directory too.
	writeFile(t, dir, "y.py", `print(open("data/sales.csv").read().strip())`)
	if code, out, errOut := binary(t, dir, "", "run", "--with", "data/sales.csv", "y.py"); code != 0 || out != "day,amount\n" {
		t.Errorf("--with data/sales.csv: exit %d, %q %q", code, out, errOut)
	}

	res := filepath.Join(dir, "res")
	if code, _, errOut := binary(t, dir, "bob\n", "run", "--with", "data", "--out", res, "x.py"); code != 0 {
		t.Fatalf("--out: exit %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(res, "result.txt")); string(b) != "new" {
		t.Errorf("--out result.txt: %q", b)
	}
	for _, cache := range []string{".cache", "__pycache__"} {
		if _, err := os.Stat(filepath.Join(res, cache)); err == nil {
			t.Errorf("--out copied the cache %s", cache)
		}
	}
	// The same run again overwrites nothing that differs: fine. A file
	// changed since is refused, and nothing is copied.
	if code, _, errOut := binary(t, dir, "bob\n", "run", "--with", "data", "--out", res, "x.py"); code != 0 {
		t.Errorf("--out over identical files: exit %d %q", code, errOut)
	}
	writeFile(t, res, "result.txt", "mine")
	code, _, errOut = binary(t, dir, "bob\n", "run", "--with", "data", "--out", res, "x.py")
	if code != 2 || !strings.Contains(errOut, "would overwrite 1 existing file(s) (result.txt)") || !strings.Contains(errOut, "--force") {
		t.Errorf("--out over a changed file: exit %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(res, "result.txt")); string(b) != "mine" {
		t.Errorf("the refused --out overwrote result.txt: %q", b)
	}
	if code, _, errOut := binary(t, dir, "bob\n", "run", "--with", "data", "--out", res, "--force", "--keep-caches", "x.py"); code != 0 {
		t.Fatalf("--force: exit %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(res, "result.txt")); string(b) != "new" {
		t.Errorf("--force did not overwrite: %q", b)
	}
	if _, err := os.Stat(filepath.Join(res, ".cache", "pip", "x")); err != nil {
		t.Errorf("--keep-caches: %v", err)
	}
}

// The README's examples of `sandloop run` and `exec` work as written.
func TestReadmeRunExamples(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "### Run code in a sandbox\n\n```console\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || block == "" {
		t.Fatal("README has no console block under \"Run code in a sandbox\"")
	}
	dir := t.TempDir()
	writeFile(t, dir, "job.py", `import sys, os
print("args", sys.argv[1:])
if "--input" in sys.argv:
    print(open(sys.argv[sys.argv.index("--input") + 1]).read().strip())
if os.path.isdir("data"):
    open("summary.txt", "w").write(str(sorted(os.listdir("data"))))
`)
	writeFile(t, dir, "data.csv", "a,b\n1,2\n")
	writeFile(t, dir, "greet.py", "print('hello', input())\n")
	os.Mkdir(filepath.Join(dir, "data"), 0o755)
	writeFile(t, dir, "data/in.csv", "x\n")
	bin := builtBinary(t)
	n := 0
	for _, line := range strings.Split(block, "\n") {
		cmdline, ok := strings.CutPrefix(line, "$ ")
		if !ok {
			continue
		}
		if i := strings.Index(cmdline, "  #"); i >= 0 {
			cmdline = cmdline[:i]
		}
		n++
		sh := exec.Command("sh", "-c", cmdline)
		sh.Dir = dir
		sh.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
		sh.Stdin = strings.NewReader("")
		out, err := sh.CombinedOutput()
		if err != nil {
			t.Errorf("README: $ %s\n%v\n%s", cmdline, err, out)
		}
		switch {
		case strings.Contains(cmdline, "--input data.csv") && !strings.Contains(string(out), "a,b"):
			t.Errorf("$ %s: %s", cmdline, out)
		case strings.Contains(cmdline, "greet.py") && string(out) != "hello hi\n":
			t.Errorf("$ %s: %q", cmdline, out)
		case strings.Contains(cmdline, "--out ./result"):
			if b, _ := os.ReadFile(filepath.Join(dir, "result", "summary.txt")); string(b) != "['in.csv']" {
				t.Errorf("$ %s: result/summary.txt %q\n%s", cmdline, b, out)
			}
		}
	}
	if n < 5 {
		t.Errorf("only %d examples found in the README", n)
	}
}

// The list and remove commands answer to the words users type: every
// `ls` also as `list`, every `rm` as `remove` and `delete` (a user who
// typed `sandloop sessions list` got "unknown command").
func TestListAndRemoveAliases(t *testing.T) {
	var walk func(c *cobra.Command)
	seen := map[string]int{}
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			want := map[string][]string{"ls": {"list"}, "rm": {"remove", "delete"}}[sub.Name()]
			for _, a := range want {
				seen[sub.Name()]++
				if !slices.Contains(sub.Aliases, a) {
					t.Errorf("%s: no alias %q", sub.CommandPath(), a)
				}
			}
			walk(sub)
		}
	}
	walk(newRootCmd(strings.NewReader(""), io.Discard, io.Discard))
	if seen["ls"] < 4 || seen["rm"] < 6 {
		t.Errorf("found %d ls and %d rm aliases to check; the command tree changed?", seen["ls"], seen["rm"]/2)
	}
	if code, out, errOut := binary(t, "", "", "runs", "list", "--help"); code != 0 || !strings.Contains(out, "List recent runs") {
		t.Errorf("runs list --help: exit %d, %q %q", code, out, errOut)
	}
}
