package jail

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkJoinStages times one joined `true` (and `bash -l -c true`, as
// E2B's SDK runs a command) in a running jail, stage by stage, beside a
// plain fork/exec of `true` on the host (the baseline) and the host's
// python3 -I -S start-up (what the script pays before it enters), and
// the same commands in a join made ahead (PrepareJoin), each by the join
// program (joinexe/join.c) and by the join script and runJoin (the path
// without it), alternately in two passes. The stages are the time since
// the one before: "started" the joining process forked, "cgroup" it is in
// the jail's cgroup (a goroutine, while it starts), "pid" it entered and
// forked, "ready" the child is about to execute the program, "exited"
// Wait returned. It prints the CPU each join costs (its processes', from
// getrusage(RUSAGE_CHILDREN); the host's Go side, RUSAGE_SELF) and what
// a join made ahead holds while it waits (smaps_rollup):
//
//	go test ./internal/jail -run '^$' -bench JoinStages -benchtime 30x
func BenchmarkJoinStages(b *testing.B) {
	ws, err := os.MkdirTemp("", "sandloop-test-ws-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(ws)
	in, stdinW := io.Pipe()
	defer stdinW.Close()
	p, err := Start(context.Background(), &Config{
		Path: DefaultPython, Args: []string{"python3", "-c", "import sys; sys.stdin.read()"},
		Workspace: ws, Stdin: in,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { p.Kill(); p.Wait() }()
	target, err := p.JoinTarget()
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	hasProgram := joinProgPath() != ""
	defer joinScriptOnly.Store(joinScriptOnly.Load())

	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	host := func(args ...string) time.Duration {
		var ds []time.Duration
		for range b.N {
			t0 := time.Now()
			if err := exec.Command(args[0], args[1:]...).Run(); err != nil {
				b.Fatalf("%v: %v", args, err)
			}
			ds = append(ds, time.Since(t0))
		}
		return median(ds)
	}
	// cpu is the CPU time of this process (self) and of its reaped
	// children (the joins' processes and their programs).
	cpu := func() (self, children time.Duration) {
		var s, c syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &s)
		syscall.Getrusage(syscall.RUSAGE_CHILDREN, &c)
		tv := func(r *syscall.Rusage) time.Duration {
			return time.Duration(r.Utime.Nano() + r.Stime.Nano())
		}
		return tv(&s), tv(&c)
	}
	type result struct {
		stages                     map[string][]time.Duration
		join, bash, warm, warmBash []time.Duration
		// CPU per join (children: its processes; self: the Go side),
		// and of a join made ahead (PrepareJoin + Start).
		cpuJoin, cpuJoinSelf, cpuWarm, cpuWarmSelf time.Duration
		waiting                                    string
	}
	results := map[bool]*result{}
	joined := func(r *result, path string, args ...string) []time.Duration {
		var total []time.Duration
		for range b.N {
			t0 := time.Now()
			last := t0
			joinTrace = func(stage string) {
				now := time.Now()
				r.stages[stage] = append(r.stages[stage], now.Sub(last))
				last = now
			}
			res, err := Run(context.Background(), &Config{Path: path, Args: args, Join: target, Limits: Limits{Timeout: 30 * time.Second}})
			joinTrace = nil
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("joined %v: %v %+v", args, err, res)
			}
			r.stages["exited"] = append(r.stages["exited"], time.Since(last))
			total = append(total, time.Since(t0))
		}
		return total
	}
	// The same in a join made ahead (PrepareJoin, untimed: a session makes
	// it before its command comes): the command's cost is what is left.
	prepared := func(r *result, path string, args ...string) []time.Duration {
		var total []time.Duration
		for range b.N {
			w, err := PrepareJoin(context.Background(), target)
			if err != nil {
				b.Fatal(err)
			}
			if r.waiting == "" {
				for _, pid := range []int{w.ScriptPid(), w.Pid()} {
					var mem []string
					for _, l := range strings.Split(readFileString(fmt.Sprintf("/proc/%d/smaps_rollup", pid)), "\n") {
						if f := strings.Fields(l); len(f) == 3 && (f[0] == "Rss:" || f[0] == "Pss:" || f[0] == "Private_Dirty:" || f[0] == "Anonymous:") {
							mem = append(mem, strings.TrimSuffix(f[0], ":")+" "+f[1])
						}
					}
					r.waiting += fmt.Sprintf(" [%s kB, %s tasks]", strings.Join(mem, ", "), procField(pid, "Threads"))
				}
			}
			t0 := time.Now()
			p, err := w.Start(context.Background(), &Config{Path: path, Args: args, Limits: Limits{Timeout: 30 * time.Second}})
			if err != nil {
				b.Fatal(err)
			}
			if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
				b.Fatalf("prepared %v: %v %+v", args, err, res)
			}
			total = append(total, time.Since(t0))
		}
		return total
	}
	pass := func(script bool) {
		joinScriptOnly.Store(script)
		r := results[script]
		if r == nil {
			r = &result{stages: map[string][]time.Duration{}}
			results[script] = r
		}
		s0, c0 := cpu()
		r.join = append(r.join, joined(r, "/bin/true", "true")...)
		s1, c1 := cpu()
		r.cpuJoin += c1 - c0
		r.cpuJoinSelf += s1 - s0
		r.bash = append(r.bash, joined(&result{stages: map[string][]time.Duration{}}, "/bin/bash", "/bin/bash", "-l", "-c", "true")...)
		s0, c0 = cpu()
		r.warm = append(r.warm, prepared(r, "/bin/true", "true")...)
		s1, c1 = cpu()
		r.cpuWarm += c1 - c0
		r.cpuWarmSelf += s1 - s0
		r.warmBash = append(r.warmBash, prepared(r, "/bin/bash", "/bin/bash", "-l", "-c", "true")...)
	}
	// Warm the page cache, the init and the program.
	joinScriptOnly.Store(true)
	joined(&result{stages: map[string][]time.Duration{}}, "/bin/true", "true")
	joinScriptOnly.Store(false)
	joined(&result{stages: map[string][]time.Duration{}}, "/bin/true", "true")
	load0, _ := os.ReadFile("/proc/loadavg")
	b.ResetTimer()
	base := host("/bin/true")
	py := host(DefaultPython, "-I", "-S", "-c", "pass")
	pyImp := host(DefaultPython, "-I", "-S", "-c", "import ctypes, os, sys")
	modes := []bool{true}
	if hasProgram {
		modes = []bool{true, false}
	}
	for range 2 {
		for _, script := range modes {
			pass(script)
		}
	}
	b.StopTimer()
	load1, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load %s -> %s\n", strings.TrimSpace(string(load0)), strings.TrimSpace(string(load1)))
	fmt.Printf("host fork/exec true: %v; host python3 -I -S: pass %v, the script's imports %v\n", base, py, pyImp)
	n := time.Duration(2 * b.N)
	for _, script := range modes {
		r := results[script]
		name := "the join program"
		if script {
			name = "the join script + init (old)"
		}
		tot, warm := median(r.join), median(r.warm)
		fmt.Printf("%s: joined true %v (%.1fx the host's); stages (median of each):", name, tot, float64(tot)/float64(base))
		for _, s := range []string{"started", "cgroup", "pid", "ready", "exited"} {
			fmt.Printf(" %s %v", s, median(r.stages[s]))
		}
		fmt.Printf("\n  joined bash -l -c true %v; in a join made ahead: true %v, bash -l -c true %v\n", median(r.bash), warm, median(r.warmBash))
		fmt.Printf("  CPU per joined true: %v of its processes + %v of the host's Go side; per join made ahead + its true: %v + %v\n",
			(r.cpuJoin / n).Round(10*time.Microsecond), (r.cpuJoinSelf / n).Round(10*time.Microsecond),
			(r.cpuWarm / n).Round(10*time.Microsecond), (r.cpuWarmSelf / n).Round(10*time.Microsecond))
		fmt.Printf("  a join made ahead, waiting (host side, then the child):%s\n", r.waiting)
	}
	if hasProgram {
		o, nw := results[true], results[false]
		fmt.Printf("program vs script: joined true %.1fx faster, bash %.1fx, made ahead true %.1fx; CPU per join %.1fx less (its processes), %.1fx (made ahead)\n",
			float64(median(o.join))/float64(median(nw.join)), float64(median(o.bash))/float64(median(nw.bash)),
			float64(median(o.warm))/float64(median(nw.warm)),
			float64(o.cpuJoin)/float64(nw.cpuJoin), float64(o.cpuWarm)/float64(nw.cpuWarm))
	}
	r := results[!hasProgram]
	b.ReportMetric(float64(median(r.warm).Microseconds())/1000, "prepared-ms")
	b.ReportMetric(float64(median(r.join).Microseconds())/1000, "join-ms")
	b.ReportMetric(float64((r.cpuJoin/n).Microseconds())/1000, "join-cpu-ms")
	b.ReportMetric(float64(base.Microseconds())/1000, "host-ms")
}
