package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

func TestMain(m *testing.M) {
	jail.MaybeInit() // the jail re-executes this binary as its init
	os.Exit(m.Run())
}

// TestLoadShort is the load program's short version: fewer clients for
// 15 seconds, with the same checks (no failed request, nothing left).
// Its latencies are logged, not asserted.
func TestLoadShort(t *testing.T) {
	if testing.Short() {
		t.Skip("15 s of load")
	}
	var log strings.Builder
	rep, err := Run(context.Background(), Config{Duration: 15 * time.Second, Clients: 8, Creators: 3, PoolSize: 2, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.Print(&out)
	t.Logf("\n%s%s", log.String(), out.String())
	if p := rep.Problems(); len(p) > 0 {
		t.Errorf("load failed: %v", p)
	}
	// The run must have exercised what it claims to.
	for _, kind := range []string{"quick", "state/stream", "error", "first"} {
		if rep.ExecByKind[kind] == 0 {
			t.Errorf("no %q execution succeeded: %v", kind, rep.ExecByKind)
		}
	}
	if rep.Leaks.CgroupsSeen == 0 {
		t.Errorf("the sampler saw no jail cgroup, so the cgroup check proved nothing")
	}
}

// TestFindLeaksSeesPlantedLeaks plants one of each leftover and checks the
// detector reports it, so a clean report means something.
func TestFindLeaksSeesPlantedLeaks(t *testing.T) {
	tmp := t.TempDir()
	before := takeSnapshot()

	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := os.Mkdir(filepath.Join(tmp, "sandloop-ws-planted"), 0o755); err != nil {
		t.Fatal(err)
	}
	var planted string
	if parents := cgroupParents(); len(parents) > 0 && os.Geteuid() == 0 {
		planted = filepath.Join(parents[0], "sandloop-planted-"+strings.ReplaceAll(t.Name(), "/", "-"))
		if err := os.Mkdir(planted, 0o755); err != nil {
			t.Logf("cannot plant a cgroup (%v): that check is skipped", err)
			planted = ""
		} else {
			t.Cleanup(func() { os.Remove(planted) })
		}
	}

	// A group no jail of ours was seen in is another program's.
	if planted != "" {
		if l := findLeaks(before, map[string]bool{}, tmp, 0); len(l.Cgroups) != 0 || l.CgroupsOthers == 0 {
			t.Errorf("a group never seen in use: cgroups %q, others %d; want it counted as another program's", l.Cgroups, l.CgroupsOthers)
		}
	}
	l := findLeaks(before, map[string]bool{filepath.Base(planted): true}, tmp, 0)
	if len(l.Processes) != 1 || !strings.Contains(l.Processes[0], "sleep") {
		t.Errorf("processes: %q, want the planted sleep", l.Processes)
	}
	if len(l.Workspaces) != 1 {
		t.Errorf("workspaces: %q, want the planted one", l.Workspaces)
	}
	if planted != "" && (len(l.Cgroups) != 1 || l.Cgroups[0] != planted) {
		t.Errorf("cgroups: %q, want %s", l.Cgroups, planted)
	}
	if len(l.problems()) < 2 {
		t.Errorf("problems: %v", l.problems())
	}
}
