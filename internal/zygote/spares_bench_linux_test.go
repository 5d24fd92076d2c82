package zygote

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil/burst"
)

// BenchmarkSparesPerSecond forks a burst of 40 sessions at once from the
// default (pandas) template, with the pipeline before issue 26
// (Options.Fixed: one spare, replaced RefillDelay after each take), the
// current one without the trampoline (spares asked at once for the forks
// that wait, up to Options.Parallel in the making; each spare's reaper a
// copy of the template) and the current one with it (the default), in
// turn in the same run, and reports the sessions forked per second over
// each burst and their ratio, and, for the current pipeline, the python3
// CPU and minor faults per session: the template's during the burst (the
// spares it made ahead after it counted too) and each session's reaper
// and kernel (schedstat and stat of each process, so no profiler).
func BenchmarkSparesPerSecond(b *testing.B) {
	const burst = 40
	if err := Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
	}
	type result struct{ rate, cpu, faults float64 }
	run := func(fixed, noTrampoline bool) result {
		z, err := New(context.Background(), &Options{Env: session.KernelEnv(), Fixed: fixed, noTrampoline: noTrampoline})
		if err != nil {
			b.Fatal(err)
		}
		defer z.Close()
		time.Sleep(time.Second) // the first spare is armed
		var wg sync.WaitGroup
		errs := make(chan error, burst)
		sessions := make(chan *session.Session, burst)
		procs := make(chan *Process, burst)
		stop := profileSpares(b, fixed)
		cpu0, flt0 := procCost(z.Pid())
		start := time.Now()
		for range burst {
			wg.Go(func() {
				ws := b.TempDir()
				s, err := session.New(context.Background(), &session.Options{Workspace: ws,
					Launcher: func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
						p, err := z.Fork(ctx, ws, jail.Limits{}, session.KernelEnv(), 0, f)
						if err == nil {
							procs <- p
						}
						return p, err
					}})
				if err != nil {
					errs <- err
					return
				}
				sessions <- s
			})
		}
		wg.Wait()
		took := time.Since(start)
		cpu1, flt1 := procCost(z.Pid())
		stop()
		close(procs)
		cpu, faults := cpu1-cpu0, flt1-flt0
		for p := range procs {
			for _, pid := range p.HostPids() {
				c, f := procCost(pid)
				cpu, faults = cpu+c, faults+f
			}
		}
		close(sessions)
		for s := range sessions {
			s.Close()
		}
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return result{burst / took.Seconds(), cpu / burst, faults / burst}
	}
	var old, plain, cur result
	add := func(sum *result, r result) {
		sum.rate += r.rate / float64(b.N)
		sum.cpu += r.cpu / float64(b.N)
		sum.faults += r.faults / float64(b.N)
	}
	for range b.N {
		add(&old, run(true, false))
		add(&plain, run(false, true))
		add(&cur, run(false, false))
	}
	b.ReportMetric(old.rate, "old-sessions/s")
	b.ReportMetric(plain.rate, "no-trampoline-sessions/s")
	b.ReportMetric(cur.rate, "sessions/s")
	b.ReportMetric(cur.rate/old.rate, "ratio")
	b.ReportMetric(plain.cpu, "no-trampoline-CPU-ms")
	b.ReportMetric(cur.cpu, "CPU-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("a burst of %d forks: %.1f sessions/s before issue 26, %.1f now without the trampoline, %.1f with it (%.1fx the first)", burst, old.rate, plain.rate, cur.rate, cur.rate/old.rate)
	b.Logf("python3 per session (template + reaper + kernel): without the trampoline %.2f ms CPU, %.0f minor faults; with it %.2f ms, %.0f faults", plain.cpu, plain.faults, cur.cpu, cur.faults)
}

// profileSpares, when SPARES_PROFILE names a path prefix, records where the
// time goes during one burst: the whole machine with perf
// (PREFIX.old.perf, PREFIX.new.perf) and this process with Go's CPU
// profiler (PREFIX.old.pprof, PREFIX.new.pprof). It returns what stops
// them.
func profileSpares(b *testing.B, fixed bool) (stop func()) {
	prefix := os.Getenv("SPARES_PROFILE")
	if prefix == "" {
		return func() {}
	}
	name := prefix + ".new"
	if fixed {
		name = prefix + ".old"
	}
	return burst.Profile(b, name, 999)
}
