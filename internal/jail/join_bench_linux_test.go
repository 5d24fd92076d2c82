package jail

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"
)

// BenchmarkJoinStages times one joined `true` (and `bash -l -c true`, as
// E2B's SDK runs a command) in a running jail, stage by stage, beside a
// plain fork/exec of `true` on the host (the baseline) and the host's
// python3 -I -S start-up (what the joiner pays before it enters), and
// the same commands in a join made ahead (PrepareJoin). The
// stages are the time since the one before: "started" the script forked,
// "cgroup" it is in the jail's cgroup (a goroutine, while it starts),
// "pid" it entered and forked, "ready" runJoin is about to execute the
// program, "exited" Wait returned:
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
	joined := func(path string, args ...string) (map[string]time.Duration, time.Duration) {
		stages := map[string][]time.Duration{}
		var total []time.Duration
		for range b.N {
			t0 := time.Now()
			last := t0
			joinTrace = func(stage string) {
				now := time.Now()
				stages[stage] = append(stages[stage], now.Sub(last))
				last = now
			}
			r, err := Run(context.Background(), &Config{Path: path, Args: args, Join: target, Limits: Limits{Timeout: 30 * time.Second}})
			joinTrace = nil
			if err != nil || r.ExitCode != 0 {
				b.Fatalf("joined %v: %v %+v", args, err, r)
			}
			stages["exited"] = append(stages["exited"], time.Since(last))
			total = append(total, time.Since(t0))
		}
		m := map[string]time.Duration{}
		for k, v := range stages {
			m[k] = median(v)
		}
		return m, median(total)
	}
	// Warm the page cache and the init binary.
	joined("/bin/true", "true")
	b.ResetTimer()
	base := host("/bin/true")
	py := host(DefaultPython, "-I", "-S", "-c", "pass")
	pyImp := host(DefaultPython, "-I", "-S", "-c", "import ctypes, os, sys")
	pyJSON := host(DefaultPython, "-I", "-S", "-c", "import ctypes, json, os, sys")
	st, tot := joined("/bin/true", "true")
	_, bash := joined("/bin/bash", "/bin/bash", "-l", "-c", "true")
	// The same in a join made ahead (PrepareJoin, untimed: a session makes
	// it before its command comes): the command's cost is what is left.
	prepared := func(path string, args ...string) time.Duration {
		var total []time.Duration
		for range b.N {
			w, err := PrepareJoin(context.Background(), target)
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			p, err := w.Start(context.Background(), &Config{Path: path, Args: args, Limits: Limits{Timeout: 30 * time.Second}})
			if err != nil {
				b.Fatal(err)
			}
			if r, err := p.Wait(); err != nil || r.ExitCode != 0 {
				b.Fatalf("prepared %v: %v %+v", args, err, r)
			}
			total = append(total, time.Since(t0))
		}
		return median(total)
	}
	warm := prepared("/bin/true", "true")
	warmBash := prepared("/bin/bash", "/bin/bash", "-l", "-c", "true")
	b.StopTimer()
	fmt.Printf("host fork/exec true: %v; host python3 -I -S: pass %v, the joiner's imports %v (with json, as before: %v)\n", base, py, pyImp, pyJSON)
	fmt.Printf("joined true: %v (%.1fx the host's)  stages (median of each):", tot, float64(tot)/float64(base))
	for _, s := range []string{"started", "cgroup", "pid", "ready", "exited"} {
		fmt.Printf(" %s %v", s, st[s])
	}
	fmt.Printf("\njoined bash -l -c true: %v\n", bash)
	fmt.Printf("in a join made ahead: true %v (%.1fx the host's, %.1fx less than joining), bash -l -c true %v (%.1fx less)\n",
		warm, float64(warm)/float64(base), float64(tot)/float64(warm), warmBash, float64(bash)/float64(warmBash))
	b.ReportMetric(float64(warm.Microseconds())/1000, "prepared-ms")
	b.ReportMetric(float64(tot.Microseconds())/1000, "join-ms")
	b.ReportMetric(float64(base.Microseconds())/1000, "host-ms")
}
