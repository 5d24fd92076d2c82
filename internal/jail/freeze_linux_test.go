package jail

import (
	"bufio"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// spinner runs in a jail: a thread and a child process spin; each line
// on stdin is answered with the thread's count.
const spinner = `import os, sys, threading
n = [0]
def spin():
    while True: n[0] += 1
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:
    while True: pass
print("ready", flush=True)
for line in sys.stdin:
    print(n[0], flush=True)
`

type spinJail struct {
	p   *Process
	in  *os.File
	out *bufio.Reader
}

func startSpinner(t *testing.T) *spinJail {
	t.Helper()
	var errb strings.Builder
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", spinner},
		Workspace: testWorkspace(t), Stdin: inR, Stdout: outW, Stderr: &errb, Limits: Limits{CPUs: 2, Timeout: 2 * time.Minute}})
	inR.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		p.Thaw()
		p.Wait()
		inW.Close()
		outW.Close()
		outR.Close()
	})
	j := &spinJail{p: p, in: inW, out: bufio.NewReader(outR)}
	if line, err := j.out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the spinner said %q, %v; stderr: %s", line, err, errb.String())
	}
	return j
}

// count asks the spinning thread's count.
func (j *spinJail) count(t *testing.T) int {
	t.Helper()
	if _, err := j.in.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	line, err := j.out.ReadString('\n')
	n, err2 := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || err2 != nil {
		t.Fatalf("count: %q %v %v", line, err, err2)
	}
	return n
}

// TestFreezeJail: a frozen jail (a spinning thread and a spinning child)
// uses no CPU, by its cgroup's count, and goes on where it was when
// thawed; a frozen jail is killed and leaves no process and no group. By
// the host's freezer, and by SIGSTOP as where there is none.
func TestFreezeJail(t *testing.T) {
	if detectCgroups().mode == "" {
		t.Skip("no cgroup to measure CPU with: " + detectCgroups().reason)
	}
	for _, tc := range []struct {
		name         string
		freeze, thaw func(p *Process) error
	}{
		{FreezeMethod(), (*Process).Freeze, (*Process).Thaw},
		{"SIGSTOP", func(p *Process) error { return stopPids(func() []int { return treePids(p.Pid()) }) },
			func(p *Process) error { contPids(func() []int { return treePids(p.Pid()) }); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := startSpinner(t)
			before := j.count(t)
			if err := tc.freeze(j.p); err != nil {
				t.Fatal(err)
			}
			u1, _ := j.p.Usage()
			time.Sleep(500 * time.Millisecond)
			u2, _ := j.p.Usage()
			if u1.CPU != u2.CPU {
				t.Errorf("frozen, the jail used %v of CPU in 500 ms", u2.CPU-u1.CPU)
			}
			if err := tc.thaw(j.p); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the thread's turn at the GIL
			if after := j.count(t); after <= before {
				t.Errorf("thawed, the thread's count went from %d to %d", before, after)
			}
			time.Sleep(100 * time.Millisecond)
			if u3, _ := j.p.Usage(); u3.CPU <= u2.CPU {
				t.Errorf("thawed, the jail used no CPU")
			}
			// Killed while frozen.
			pids := j.p.cg.pids()
			if len(pids) < 3 {
				t.Fatalf("the jail's group holds %v: want the init, python and its child", pids)
			}
			if err := tc.freeze(j.p); err != nil {
				t.Fatal(err)
			}
			j.p.Kill()
			waited := make(chan struct{})
			go func() { j.p.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(20 * time.Second):
				t.Fatal("a frozen jail did not end when killed")
			}
			for _, pid := range pids {
				if st := procState(pid); st != 0 && st != 'Z' {
					t.Errorf("process %d of the killed jail is still there", pid)
				}
			}
			for _, d := range j.p.cg.dirs {
				if exists(d) {
					t.Errorf("group %s is left", d)
				}
			}
		})
	}
}

// TestFreezeV2: the cgroup v2 freezer, on a group of the unified
// hierarchy where the host has one we may write (a hybrid v1 host).
func TestFreezeV2(t *testing.T) {
	root := "/sys/fs/cgroup"
	if detectCgroups().mode != "cgroup v2" {
		root = "/sys/fs/cgroup/unified"
	}
	dir := filepath.Join(root, "sandloop-freezetest-"+rand.Text())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("no cgroup v2 group to test with: %v", err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Skipf("cannot move a process into %s: %v", dir, err)
	}
	usage := func() int64 { return keyedValue(readFileString(filepath.Join(dir, "cpu.stat")), "usage_usec") }
	if err := freezeV2(dir); err != nil {
		t.Fatal(err)
	}
	u1 := usage()
	time.Sleep(300 * time.Millisecond)
	if u2 := usage(); u1 != u2 || u1 == 0 {
		t.Errorf("frozen, the group's CPU went from %d to %d µs", u1, u2)
	}
	cg := &cgroup{mode: "cgroup v2", dirs: []string{dir}, byC: map[string]string{}}
	cg.kill()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a frozen v2 group's process did not die when killed")
	}
}

// TestSweepThawsDyingFrozenGroups: a frozen group another sandloop left
// when it died (its processes wait on a SIGKILL) is thawed, so they end
// and the group goes; a frozen group whose processes were not killed (a
// paused session of a live sandloop) is left frozen.
func TestSweepThawsDyingFrozenGroups(t *testing.T) {
	h := detectCgroups()
	if h.mode == "" || (h.mode == "cgroup v1" && h.freezer == "") {
		t.Skip("no cgroup freezer")
	}
	mk := func() (*cgroup, *exec.Cmd) {
		t.Helper()
		cg, err := newCgroup(h, "sandloop-sweeptest-"+rand.Text(), Limits{}.WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range cg.dirs {
			liveGroups.Delete(d) // as if another process had made it
		}
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		t.Cleanup(func() { cg.remove() })
		if err := cg.add(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if err := cg.freeze(); err != nil {
			t.Fatal(err)
		}
		return cg, cmd
	}
	dying, killed := mk()
	paused, alive := mk()
	killed.Process.Signal(os.Kill)
	time.Sleep(50 * time.Millisecond)
	if procState(killed.Process.Pid) == 0 {
		t.Fatal("a frozen process died of SIGKILL before being thawed: the premise is wrong")
	}
	var parents []string
	for _, d := range dying.dirs {
		parents = append(parents, filepath.Dir(d))
	}
	if n := thawDyingGroups(parents, 0); n != 1 {
		t.Errorf("thawed %d groups, want 1", n)
	}
	if st := procState(killed.Process.Pid); st != 0 && st != 'Z' {
		t.Errorf("the killed frozen process is still there after the sweep (state %c)", st)
	}
	if st := procState(alive.Process.Pid); st == 0 {
		t.Errorf("the paused group's process is gone")
	}
	if readFileString(filepath.Join(paused.byC["freezer"], "freezer.state")) != "FROZEN" && h.mode == "cgroup v1" {
		t.Errorf("the paused group was thawed")
	}
}

// treeCPU sums the CPU time (clock ticks) of root and its descendants
// from /proc, which needs no cgroup.
func treeCPU(root int) int64 {
	var sum int64
	for _, pid := range treePids(root) {
		stat := readFileString("/proc/" + strconv.Itoa(pid) + "/stat")
		if i := strings.LastIndexByte(stat, ')'); i >= 0 {
			f := strings.Fields(stat[i+1:])
			if len(f) > 13 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				s, _ := strconv.ParseInt(f[12], 10, 64)
				sum += u + s
			}
		}
	}
	return sum
}

// TestFreezeAnyHost: Freeze stops a jail however this host pauses (with
// or without cgroups: the rootless run of TestRootless has none), by the
// CPU time /proc counts for its processes; Thaw lets it go on; a frozen
// jail is killed.
func TestFreezeAnyHost(t *testing.T) {
	j := startSpinner(t)
	before := j.count(t)
	if err := j.p.Freeze(); err != nil {
		t.Fatal(err)
	}
	c1 := treeCPU(j.p.Pid())
	time.Sleep(500 * time.Millisecond)
	if c2 := treeCPU(j.p.Pid()); c1 != c2 {
		t.Errorf("frozen (%s), the jail used %d ticks of CPU in 500 ms", FreezeMethod(), c2-c1)
	}
	if err := j.p.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the thread's turn at the GIL
	if after := j.count(t); after <= before {
		t.Errorf("thawed, the thread's count went from %d to %d", before, after)
	}
	if err := j.p.Freeze(); err != nil {
		t.Fatal(err)
	}
	j.p.Kill()
	waited := make(chan struct{})
	go func() { j.p.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		t.Fatal("a frozen jail did not end when killed")
	}
	t.Logf("pause method: %s, enforcement: %s", FreezeMethod(), j.p.enforce)
}
