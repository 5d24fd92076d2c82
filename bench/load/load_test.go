package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/testutil"
	"golang.org/x/sys/unix"
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

// TestSustainShort is -mode sustain run short: sessions created, used once
// and deleted at 20/s for 3 s on a real host with the zygote, then the
// leak checks (no process, cgroup, workspace or mount left). Its rates
// and CPU figures are logged, not asserted.
func TestSustainShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a real host under load")
	}
	var log, out strings.Builder
	problems, err := Sustain(context.Background(), SustainConfig{Rate: 20, Duration: 3 * time.Second, OldDuration: -1, Log: &log}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s%s", log.String(), out.String())
	if len(problems) > 0 {
		t.Errorf("sustain failed: %v", problems)
	}
	if !strings.Contains(out.String(), "done 60 ") {
		t.Errorf("not every one of the 60 cycles was done:\n%s", out.String())
	}
	// The cgroup check proves something only if the sampler saw the
	// sessions' groups: most of them, each holding a spare or a session.
	if m := regexp.MustCompile(`of (\d+) seen in use`).FindStringSubmatch(out.String()); m == nil {
		t.Errorf("no cgroup count in the report")
	} else if n, _ := strconv.Atoi(m[1]); n < 30 {
		t.Errorf("the sampler saw %d sessions' groups of 60, so the cgroup check proved little", n)
	}
}

// TestSamplerTellsOursFromOthers: the sampler counts as ours a sandbox
// group whose process descends from this one, and not a group holding
// another process (another program's sandbox on a shared machine).
func TestSamplerTellsOursFromOthers(t *testing.T) {
	parents := cgroupParents()
	if len(parents) == 0 || os.Geteuid() != 0 {
		t.Skip("needs root and a cgroup hierarchy")
	}
	// Ours: a child of this process. Not ours: a process whose parent
	// exited, so it was given to an ancestor of ours (or init): not to
	// this process, which other runs here made a subreaper.
	var was int
	if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&was)), 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, uintptr(was), 0, 0, 0) })
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	b, err := exec.Command("sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(testutil.Pin(t, orphan).Kill) // by a pidfd: its number may be another's by then
	name := func(kind string) string { return "sandloop-sampler-" + kind + "-" + strconv.Itoa(os.Getpid()) }
	plant := func(kind string, pid int) {
		d := filepath.Join(parents[0], name(kind))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Back to the parent group, so the group can go.
			os.WriteFile(filepath.Join(parents[0], "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			os.Remove(d)
		})
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	plant("ours", child.Process.Pid)
	plant("theirs", orphan)
	s := startSampler()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if !s.names()[name("ours")] {
			return fmt.Errorf("the sampler has not seen our group %s", name("ours"))
		}
		return nil
	})
	s.stop()
	if s.names()[name("theirs")] {
		t.Errorf("the sampler counted %s, whose process is not ours, as ours", name("theirs"))
	}
}
