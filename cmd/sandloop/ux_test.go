package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--pids", "0", "-c", "1"}, "--pids 0 is not a limit"},
		{[]string{"exec", "--cpus", "0", "-c", "1"}, "--cpus 0 is not a limit"},
		{[]string{"run"}, "give the script: sandloop run FILE"},
	} {
		if code, out, errOut := binary(t, "", "", tt.args...); code != 2 || out != "" || !strings.Contains(errOut, tt.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("sandloop %s: exit %d, %q %q; want 2 and one line with %q", strings.Join(tt.args, " "), code, out, errOut, tt.want)
		}
	}
	n := runtime.NumCPU()
	code, out, errOut := binary(t, "", "", "exec", "--cpus", fmt.Sprint(n+7), "-c", "print('ran')")
	if code != 0 || out != "ran\n" || !strings.Contains(errOut, fmt.Sprintf("more than this host's %d CPUs: using %d", n, n)) {
		t.Errorf("--cpus %d: exit %d, %q %q", n+7, code, out, errOut)
	}
}
