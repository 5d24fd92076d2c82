package zygote

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkCreateImportPandas times creating a session and running
// `import pandas` in it, forked from the default template against a cold
// session, alternating in the same run (run with -benchtime=10x). It
// reports both medians and their ratio (cold/zygote).
func BenchmarkCreateImportPandas(b *testing.B) {
	z := newZygote(b, nil)
	one := func(zy session.Zygote) time.Duration {
		start := time.Now()
		s, err := session.New(context.Background(), &session.Options{Zygote: zy})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		res, err := s.Execute(context.Background(), kernel.Request{Code: "import pandas"}, nil)
		if err != nil || res.Status != "ok" {
			b.Fatalf("import pandas: %v %+v", err, res)
		}
		return time.Since(start)
	}
	one(z) // warm the page cache for both
	one(nil)
	var zt, ct []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		zt = append(zt, one(z))
		ct = append(ct, one(nil))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	zm, cm := median(zt), median(ct)
	b.ReportMetric(ms(zm), "zygote-ms")
	b.ReportMetric(ms(cm), "cold-ms")
	b.ReportMetric(float64(cm)/float64(zm), "cold/zygote")
	b.Logf("create + import pandas, median of %d: zygote %.1f ms, cold %.1f ms: %.1fx faster", b.N, ms(zm), ms(cm), float64(cm)/float64(zm))
}

// BenchmarkIdleMemory holds N idle sessions with numpy and pandas imported
// (N = $SANDLOOP_BENCH_SESSIONS, default 50), forked (with the small
// reaper, then with the reaper's Python loop: the pipeline before it, from
// a second template) and then cold, and reports the private memory (USS:
// Private_Clean + Private_Dirty), PSS and page tables per session from
// /proc/PID/smaps_rollup and status, summed over every process of the
// session (a forked session's reaper and kernel; a cold one's init and
// kernel). The templates' own memory is left out (shared by all).
func BenchmarkIdleMemory(b *testing.B) {
	n := 50
	if v, err := strconv.Atoi(os.Getenv("SANDLOOP_BENCH_SESSIONS")); err == nil && v > 0 {
		n = v
	}
	if bin, why := reaperProgram(); bin == nil {
		b.Fatalf("no small reaper in this test binary: %s (make gen)", why)
	}
	z := newZygote(b, nil)
	old := newZygoteWith(b, &Options{Env: session.KernelEnv(), pythonReaper: true})
	if memoryCgroup(z.Pid()) == "" {
		b.Skip("no v1 memory cgroup to tell sessions from the template's spare child")
	}
	type figures struct{ uss, pss, pte float64 }
	measure := func(zy *Zygote) figures {
		var ss []*session.Session
		defer func() {
			for _, s := range ss {
				s.Close()
			}
		}()
		var launch session.Zygote
		if zy != nil {
			launch = zy
		}
		availBefore, slabBefore := memAvailable(b), meminfo(b, "SUnreclaim:")
		for i := 0; i < n; i++ {
			s, err := session.New(context.Background(), &session.Options{Zygote: launch})
			if err != nil {
				b.Fatal(err)
			}
			ss = append(ss, s)
			res, err := s.Execute(context.Background(), kernel.Request{Code: "import numpy, pandas"}, nil)
			if err != nil || res.Status != "ok" {
				b.Fatalf("import: %v %+v", err, res)
			}
		}
		if zy == z {
			// Each reaper executes the small one defaultReaperDelay after
			// its take.
			testutil.WaitFor(b, defaultReaperDelay+z.patience(time.Minute), func() error {
				small := 0
				for _, pid := range descendants(os.Getpid()) {
					if strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pid))) == "reaper" {
						small++
					}
				}
				if small < n {
					return fmt.Errorf("%d of %d reapers are the small one", small, n)
				}
				return nil
			})
		}
		lost, slab := availBefore-memAvailable(b), meminfo(b, "SUnreclaim:")-slabBefore
		var u, p, pte int64
		// Not the sessions': the other template's jail and everything in
		// it; this one's template, its init and its spare children.
		skip := map[int]bool{}
		var zcg string
		for _, t := range []*Zygote{z, old} {
			t.mu.Lock()
			init := t.cur.proc.Pid()
			t.mu.Unlock()
			skip[init], skip[t.Pid()] = true, true
			if t == zy {
				zcg = memoryCgroup(t.Pid())
				for _, pid := range t.armedSparePids(b) {
					skip[pid] = true
				}
				continue
			}
			for _, pid := range descendants(init) {
				skip[pid] = true
			}
		}
		var reapers int64
		for _, pid := range descendants(os.Getpid()) {
			if skip[pid] || (zcg != "" && memoryCgroup(pid) == zcg) {
				continue
			}
			pu, pp := smaps(pid)
			u += pu
			p += pp
			pte += statusKB(pid, "VmPTE:") << 10
			if zy != nil && nsPid(pid) == 1 {
				reapers += pu
			}
		}
		mib := func(v int64) float64 { return float64(v) / float64(n) / (1 << 20) }
		how := "cold"
		switch {
		case zy == old:
			how = "forked (Python reaper)"
		case zy != nil:
			how = "forked (small reaper)"
		}
		b.Logf("%d %s sessions: MemAvailable fell %.1f MiB per session (the whole host: other work counts too); USS %.2f MiB (the reaper's %.2f), page tables %.2f MiB, unreclaimable slab %.2f MiB (the whole host) per session",
			n, how, mib(lost), mib(u), mib(reapers), mib(pte), mib(slab))
		return figures{mib(u), mib(p), mib(pte)}
	}
	for i := 0; i < b.N; i++ {
		zf := measure(z)
		of := measure(old)
		cf := measure(nil)
		tu, tp := smaps(z.Pid())
		b.ReportMetric(zf.uss, "zygote-USS-MiB")
		b.ReportMetric(zf.pss, "zygote-PSS-MiB")
		b.ReportMetric(zf.pte, "zygote-PTE-MiB")
		b.ReportMetric(of.uss, "python-reaper-USS-MiB")
		b.ReportMetric(of.pte, "python-reaper-PTE-MiB")
		b.ReportMetric(cf.uss, "cold-USS-MiB")
		b.ReportMetric(cf.pss, "cold-PSS-MiB")
		b.ReportMetric(cf.uss/zf.uss, "cold/zygote-USS")
		b.ReportMetric((of.uss+of.pte)/(zf.uss+zf.pte), "python/small-reaper")
		b.Logf("%d idle sessions with numpy+pandas, per session: zygote USS %.2f MiB + page tables %.2f MiB (PSS %.1f MiB); with the Python reaper USS %.2f MiB + page tables %.2f MiB; cold USS %.1f MiB PSS %.1f MiB; the template: USS %.1f MiB, PSS %.1f MiB (shared by all)",
			n, zf.uss, zf.pte, zf.pss, of.uss, of.pte, cf.uss, cf.pss, float64(tu)/(1<<20), float64(tp)/(1<<20))
	}
}

// nsPid returns a process's PID in its own PID namespace (the last of
// NSpid in /proc/PID/status), 0 if unknown.
func nsPid(pid int) int {
	f := strings.Fields(statusField(readFile(fmt.Sprintf("/proc/%d/status", pid)), "NSpid"))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable(b *testing.B) int64 { return meminfo(b, "MemAvailable:") }

// meminfo returns a field of /proc/meminfo in bytes.
func meminfo(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/meminfo", field)
	return 0
}

// statusKB returns a field of /proc/PID/status in kB (0 if absent).
func statusKB(pid int, field string) int64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// descendants returns every process below pid.
func descendants(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
				out = append(out, descendants(c)...)
			}
		}
	}
	return out
}

// memoryCgroup returns the memory cgroup of a process.
func memoryCgroup(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && (parts[1] == "memory" || parts[1] == "") {
			return parts[2]
		}
	}
	return ""
}

// smaps returns a process's USS and PSS in bytes.
func smaps(pid int) (uss, pss int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Private_Clean:", "Private_Dirty:":
			uss += kb << 10
		case "Pss:":
			pss += kb << 10
		}
	}
	return uss, pss
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkReaperFirstCommand times creating a forked session and running
// `1+1` in it from four templates in turn in the same run (run with
// -benchtime=40x): the default (the trampoline: the small reaper from the
// start), and without the trampoline the small reaper executed
// defaultReaperDelay after the take, the small reaper executed at once
// after the take (its execve and the release of the reaper's copy of the
// template then compete with the session's start), and the Python reaper;
// each session from a ready spare.
// It reports the medians and their ratios to the Python reaper's.
func BenchmarkReaperFirstCommand(b *testing.B) {
	if bin, why := reaperProgram(); bin == nil {
		b.Fatalf("no small reaper in this test binary: %s (make gen)", why)
	}
	kinds := []struct {
		name string
		z    *Zygote
	}{
		{"trampoline", newZygote(b, nil)},
		{"small reaper", newZygoteWith(b, &Options{Env: session.KernelEnv(), noTrampoline: true})},
		{"small reaper at once", newZygoteWith(b, &Options{Env: session.KernelEnv(), reaperDelay: time.Millisecond, noTrampoline: true})},
		{"Python reaper", newZygoteWith(b, &Options{Env: session.KernelEnv(), pythonReaper: true})},
	}
	created := make([][]time.Duration, len(kinds))
	total := make([][]time.Duration, len(kinds))
	one := func(k int) {
		// From a ready spare, so that what is measured is the session's
		// start, not the making of a spare.
		b.StopTimer()
		kinds[k].z.armedSparePids(b)
		b.StartTimer()
		start := time.Now()
		s, err := session.New(context.Background(), &session.Options{Zygote: kinds[k].z})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		created[k] = append(created[k], time.Since(start))
		res, err := s.Execute(context.Background(), kernel.Request{Code: "1+1"}, nil)
		if err != nil || res.Status != "ok" {
			b.Fatalf("1+1: %v %+v", err, res)
		}
		total[k] = append(total[k], time.Since(start))
		// (A command or two more, as an agent would, while the at-once
		// reaper executes.)
		if _, err := s.Execute(context.Background(), kernel.Request{Code: "2+2"}, nil); err != nil {
			b.Fatal(err)
		}
	}
	for k := range kinds {
		one(k)
		created[k], total[k] = nil, nil
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range kinds { // each goes first in turn
			one((i + j) % len(kinds))
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	py := median(total[len(kinds)-1])
	for k, kind := range kinds {
		m := median(total[k])
		unit := strings.ReplaceAll(kind.name, " ", "-")
		b.ReportMetric(ms(m), unit+"-ms")
		if k < len(kinds)-1 {
			b.ReportMetric(float64(py)/float64(m), "python/"+unit)
		}
		b.Logf("create + 1+1, median of %d: %s %.1f ms (create %.1f)", b.N, kind.name, ms(m), ms(median(created[k])))
	}
}

// BenchmarkSpareReaper reports what a spare costs until it is armed, with
// the pandas template, made three ways from three templates in the same
// run (SANDLOOP_BENCH_SPARES spares each, default 10, made one after
// another): through the trampoline (the default: one copy of the
// template's page tables), and without it (a plain `go build`): the reaper
// a copy of the template running Python until the take, or executing the
// small reaper right after forking the kernel (earlyReaper). CPU time from
// /proc/PID/schedstat and minor faults from /proc/PID/stat: the template's
// (what it spent while making them, per spare), each reaper's and each
// kernel's (whole lives: they idle once armed).
func BenchmarkSpareReaper(b *testing.B) {
	if bin, why := reaperProgram(); bin == nil {
		b.Fatalf("no small reaper in this test binary: %s (make gen)", why)
	}
	if so, why := trampolineProgram(); so == nil {
		b.Fatalf("no trampoline in this test binary: %s (make gen)", why)
	}
	n := 10
	if v, err := strconv.Atoi(os.Getenv("SANDLOOP_BENCH_SPARES")); err == nil && v > 0 {
		n = v
	}
	kinds := []struct {
		name string
		opts Options
	}{
		{"trampoline", Options{}},
		{"python-reaper", Options{noTrampoline: true}},
		{"early-exec", Options{noTrampoline: true, earlyReaper: true}},
	}
	// Per spare: CPU ms and minor faults of the template, a reaper, a kernel.
	type cost struct{ cpu, faults [3][]float64 }
	costs := make([]cost, len(kinds))
	measure := func(k int) {
		opts := kinds[k].opts
		// Fixed, with no refill: the spares are made when asked, below.
		opts.Env, opts.Spares, opts.Fixed, opts.RefillDelay = session.KernelEnv(), n, true, time.Hour
		z := newZygoteWith(b, &opts)
		defer z.Close()
		z.armedSparePids(b) // the first ones, made at the start
		z.mu.Lock()
		inst := z.cur
		z.mu.Unlock()
		for len(inst.spares) > 0 {
			if r := <-inst.spares; r.sp != nil {
				r.sp.destroy()
			}
		}
		time.Sleep(300 * time.Millisecond) // the template reaps them
		cpu0, flt0 := procCost(z.Pid())
		for range n {
			inst.moreLater(-1)
		}
		pids := z.armedSparePids(b) // reaper, kernel, reaper, kernel...
		cpu1, flt1 := procCost(z.Pid())
		c := &costs[k]
		c.cpu[0] = append(c.cpu[0], (cpu1-cpu0)/float64(len(pids)/2))
		c.faults[0] = append(c.faults[0], (flt1-flt0)/float64(len(pids)/2))
		for i, pid := range pids {
			cpu, flt := procCost(pid)
			c.cpu[1+i%2] = append(c.cpu[1+i%2], cpu)
			c.faults[1+i%2] = append(c.faults[1+i%2], flt)
		}
	}
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for i := 0; i < b.N; i++ {
		for j := range kinds { // each goes first in turn
			measure((i + j) % len(kinds))
		}
	}
	total := make([]float64, len(kinds))
	for k, kind := range kinds {
		c := costs[k]
		t, r, kn := med(c.cpu[0]), med(c.cpu[1]), med(c.cpu[2])
		ft, fr, fk := med(c.faults[0]), med(c.faults[1]), med(c.faults[2])
		total[k] = t + r + kn
		b.ReportMetric(total[k], kind.name+"-CPU-ms")
		b.ReportMetric(ft+fr+fk, kind.name+"-faults")
		b.Logf("%s, per spare until armed (medians of %d): CPU template %.2f + reaper %.2f + kernel %.2f = %.2f ms; minor faults %.0f + %.0f + %.0f = %.0f",
			kind.name, len(c.cpu[1]), t, r, kn, total[k], ft, fr, fk, ft+fr+fk)
	}
	b.ReportMetric(total[1]/total[0], "python-reaper/trampoline")
	b.ReportMetric(total[2]/total[0], "early-exec/trampoline")
}

// procCost returns a process's CPU time in ms (/proc/PID/schedstat) and
// its minor faults (/proc/PID/stat), 0 if it is gone.
func procCost(pid int) (cpu, faults float64) {
	if f := strings.Fields(readFile(fmt.Sprintf("/proc/%d/schedstat", pid))); len(f) > 0 {
		ns, _ := strconv.ParseFloat(f[0], 64)
		cpu = ns / 1e6
	}
	stat := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := strings.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(stat[i+2:]); len(f) > 7 {
			faults, _ = strconv.ParseFloat(f[7], 64) // field 10 of stat
		}
	}
	return cpu, faults
}
