package zygote

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkSessionLife runs N sessions one after another from a ready
// spare (create, a cell, close: $SANDLOOP_BENCH_SESSIONS, default 40; the
// cell is `1+1` or $SANDLOOP_BENCH_CODE) from a template with its
// anonymous memory collapsed into huge pages (the default) and from
// one without, and with the template's loop in Python rather than in C
// (the trampoline's sandloop_serve), and with every after-fork hook run
// in its kernels, in turn in the same run, and reports the python3 CPU and
// minor faults per session over the sessions' whole lives, their exits
// included: the template's own CPU (schedstat) and each session's
// (its cgroup's cpuacct.usage just before the host removes it; the spare
// left at the end is not counted, the one taken first is), so no
// profiler; faults from stat (the template's, the children it reaped,
// and its live descendants': a kernel reaped automatically, when its
// reaper ended first, is not counted). The Go host's work is left out.
func BenchmarkSessionLife(b *testing.B) {
	n := 40
	if v, err := strconv.Atoi(os.Getenv("SANDLOOP_BENCH_SESSIONS")); err == nil && v > 0 {
		n = v
	}
	code := cmpOr(os.Getenv("SANDLOOP_BENCH_CODE"), "1+1")
	kinds := []struct {
		name string
		opts Options
	}{{"small-pages", Options{noHugePages: true}}, {"huge-heap", Options{noArenas: true}}, {"huge-pages", Options{}},
		{"python-loop", Options{pythonLoop: true}}, {"all-fork-hooks", Options{allForkHooks: true}}}
	type cost struct{ cpu, faults []float64 }
	costs := make([]cost, len(kinds))
	measure := func(k int) {
		// One spare, replaced at once: the same spares at both ends.
		opts := kinds[k].opts
		opts.Env, opts.Fixed, opts.Spares, opts.RefillDelay = session.KernelEnv(), true, 1, -1
		z := newZygoteWith(b, &opts)
		defer z.Close()
		z.armedSparePids(b)
		z.mu.Lock()
		huge := z.cur.huge
		z.mu.Unlock()
		if huge != "" {
			b.Logf("%s: %s; the template's AnonHugePages %s", kinds[k].name, huge, statusField(readFile(fmt.Sprintf("/proc/%d/smaps_rollup", z.Pid())), "AnonHugePages"))
		}
		one := func() {
			s, err := session.New(context.Background(), &session.Options{Zygote: z})
			if err != nil {
				b.Fatal(err)
			}
			res, err := s.Execute(context.Background(), kernel.Request{Code: code}, nil)
			if err != nil || res.Status != "ok" {
				b.Fatalf("%s: %v %+v", code, err, res)
			}
			s.Close()
		}
		one() // the pool's start
		settle(b, z)
		pids := z.armedSparePids(b)
		kpte := statusKB(pids[1], "VmPTE:")
		// Each session's CPU, its processes' exits included, from its
		// cgroup just before the host removes it (a kernel's CPU is lost
		// to its reaper's cutime when the reaper, PID 1 of their
		// namespace, ends first: the kernel is then reaped automatically).
		var mu sync.Mutex
		var sessions float64
		endedHook = func(p *Process) {
			cpu, _, _ := p.group.Stats()
			mu.Lock()
			sessions += float64(cpu) / 1e6
			mu.Unlock()
		}
		defer func() { endedHook = nil }()
		usage := func() float64 {
			mu.Lock()
			defer mu.Unlock()
			c, _ := procCost(z.Pid())
			return c + sessions
		}
		cpu0, flt0 := usage(), lifeFaults(z.Pid())
		for range n {
			one()
		}
		settle(b, z)
		cpu1, flt1 := usage(), lifeFaults(z.Pid())
		costs[k].cpu = append(costs[k].cpu, (cpu1-cpu0)/float64(n))
		costs[k].faults = append(costs[k].faults, (flt1-flt0)/float64(n))
		rollup := readFile(fmt.Sprintf("/proc/%d/smaps_rollup", z.Pid()))
		b.Logf("%s: %.2f ms CPU, %.0f minor faults per session; the template: Anonymous %s, AnonHugePages %s, VmPTE %d kB, %d mappings; a spare's kernel: VmPTE %d kB",
			kinds[k].name, (cpu1-cpu0)/float64(n), (flt1-flt0)/float64(n), statusField(rollup, "Anonymous"),
			statusField(rollup, "AnonHugePages"), statusKB(z.Pid(), "VmPTE:"),
			strings.Count(readFile(fmt.Sprintf("/proc/%d/maps", z.Pid())), "\n"), kpte)
	}
	for i := 0; i < b.N; i++ {
		for j := range kinds { // each goes first in turn
			measure((i + j) % len(kinds))
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for k, kind := range kinds {
		b.ReportMetric(med(costs[k].cpu), kind.name+"-CPU-ms")
		b.ReportMetric(med(costs[k].faults), kind.name+"-faults")
	}
	b.ReportMetric(med(costs[2].cpu)/med(costs[0].cpu), "huge/small-CPU")
	b.ReportMetric(med(costs[2].cpu)/med(costs[3].cpu), "C/python-loop-CPU")
	b.ReportMetric(med(costs[2].cpu)/med(costs[4].cpu), "trimmed/all-fork-hooks-CPU")
	b.ReportMetric(0, "ns/op")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("per session (medians of %d runs of %d, `%s`): small pages %.2f ms, %.0f faults; the heap in huge pages %.2f ms, %.0f faults; the heap and the arenas %.2f ms, %.0f faults; the same with the template's loop in Python %.2f ms, %.0f faults; every after-fork hook run %.2f ms, %.0f faults; load %s",
		b.N, n, code, med(costs[0].cpu), med(costs[0].faults), med(costs[1].cpu), med(costs[1].faults),
		med(costs[2].cpu), med(costs[2].faults), med(costs[3].cpu), med(costs[3].faults), med(costs[4].cpu), med(costs[4].faults), strings.TrimSpace(string(load)))
}

// settle waits until the template's spares are armed and it has reaped
// every session that ended (its children are then its spares' reapers).
func settle(b *testing.B, z *Zygote) {
	testutil.WaitFor(b, time.Minute, func() error {
		spares := len(z.armedSparePids(b)) / 2
		kids := 0
		for _, c := range strings.Fields(readFile(fmt.Sprintf("/proc/%d/task/%d/children", z.Pid(), z.Pid()))) {
			if _, err := strconv.Atoi(c); err == nil {
				kids++
			}
		}
		if kids != spares {
			return fmt.Errorf("%d children, %d armed spares", kids, spares)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
}

// lifeFaults returns the minor faults of a process, of the children it
// reaped, and of its descendants alive (a kernel reaped automatically
// when its reaper ended first is not counted).
func lifeFaults(pid int) float64 {
	_, faults := procCost(pid)
	stat := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := strings.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(stat[i+2:]); len(f) > 8 {
			cmin, _ := strconv.ParseFloat(f[8], 64) // cminflt, field 11
			faults += cmin
		}
	}
	for _, d := range descendants(pid) {
		_, f := procCost(d)
		faults += f
	}
	return faults
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
