package main

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// A zygote asked for explicitly on a host that cannot run one (here: not
// root, and no cgroup delegated to the user) is a startup error: exit 2,
// one line.
func TestZygoteOnWithoutCgroupsFails(t *testing.T) {
	for _, args := range [][]string{ // serve: TestZygoteAskedForButUnsupported
		{"mcp", "--zygote"},
		{"agent", "--zygote=on", "a task"},
	} {
		code, out, errOut := asNobody(t, args...)
		if code != 2 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
			!strings.Contains(errOut, "--zygote cannot work on this host: the zygote needs cgroups: cgroups unavailable") {
			t.Errorf("%v as nobody: exit %d, stdout %q, stderr %q; want exit 2 and one line saying the zygote needs cgroups", args, code, out, errOut)
		}
	}
}

// By default a host that cannot run the zygote serves cold sessions, after
// one log line saying why.
func TestZygoteAutoFallsBackToCold(t *testing.T) {
	cmd := nobodyCommand(t, "serve", "--addr", "127.0.0.1:0", "--pool", "0", "--data-dir", "data")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "sandloop serving on http://") {
		t.Fatalf("serve as nobody: %q %v; stderr %s", line, err, stderr.String())
	}
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
	if n := strings.Count(stderr.String(), "sessions start cold: the zygote needs cgroups: cgroups unavailable"); n != 1 {
		t.Errorf("want one line saying sessions start cold, got %d:\n%s", n, stderr.String())
	}
}
