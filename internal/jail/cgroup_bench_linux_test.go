package jail

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkGroupLife makes a group as a zygote's spare gets one (made
// with the spare's limits, two processes moved in), reads what a close
// reads (whether the OOM killer fired) and removes it once the
// processes have left, by the parents' descriptors (now) and by absolute
// paths (before, groupsByPath), alternately in the same run. It reports
// this thread's CPU time (CLOCK_THREAD_CPUTIME_ID, the kernel's work in
// the calls included) per group for each; moving the processes back out
// is not counted:
//
//	go test ./internal/jail -run '^$' -bench GroupLife -benchtime 200x
func BenchmarkGroupLife(b *testing.B) {
	if err := GroupsSupported(); err != nil {
		b.Skip(err)
	}
	h := detectCgroups()
	var pids []int
	for range 2 {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids = append(pids, cmd.Process.Pid)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer func() { groupsByPath = false }()
	cpu := func() time.Duration {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano())
	}
	var before, now []time.Duration
	for i := 0; b.Loop(); i++ {
		for _, old := range []bool{i%2 == 1, i%2 == 0} {
			groupsByPath = old
			t0 := cpu()
			g, err := NewGroup(spareLimitsForBench)
			if err != nil {
				b.Fatal(err)
			}
			for _, pid := range pids {
				if err := g.Add(pid); err != nil {
					b.Fatal(err)
				}
			}
			if g.OOMKilled() {
				b.Fatal("OOM killer fired in an idle group")
			}
			spent := cpu() - t0
			// Back out (not counted): each hierarchy's parent group.
			for _, d := range g.cg.dirs {
				parent := filepath.Dir(d)
				for _, pid := range pids {
					if err := writeFileString(filepath.Join(parent, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
						b.Fatal(err)
					}
				}
			}
			t1 := cpu()
			if err := g.Remove(); err != nil {
				b.Fatal(err)
			}
			spent += cpu() - t1
			for _, d := range g.cg.dirs {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					b.Fatalf("%s still there: %v", d, err)
				}
			}
			if old {
				before = append(before, spent)
			} else {
				now = append(now, spent)
			}
		}
	}
	med := func(d []time.Duration) time.Duration { d = slices.Clone(d); slices.Sort(d); return d[len(d)/2] }
	b.ReportMetric(float64(med(now).Nanoseconds())/1e3, "now-us")
	b.ReportMetric(float64(med(before).Nanoseconds())/1e3, "before-us")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("%s, %d directories per group: CPU per group (make, limits, 2 moves, OOM check, remove), medians of %d: by the parents' descriptors %v, by absolute paths %v (%.2fx); load %s",
		h.mode, len(detectGroupDirs(h)), len(now), med(now), med(before), float64(med(before))/float64(med(now)), strings.TrimSpace(string(load)))
}

var spareLimitsForBench = Limits{}.WithDefaults()

func detectGroupDirs(h cgroupHost) []string {
	var d []string
	for _, c := range v1Controllers {
		if !slices.Contains(d, h.v1[c]) {
			d = append(d, h.v1[c])
		}
	}
	if h.freezer != "" {
		d = append(d, h.freezer)
	}
	if h.mode == "cgroup v2" {
		d = []string{h.v2}
	}
	return d
}
