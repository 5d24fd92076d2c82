package zygote

import (
	"context"
	"os"
	"os/exec"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// BenchmarkSparesPerSecond forks a burst of 40 sessions at once from the
// default (pandas) template, with the pipeline before issue 26
// (Options.Fixed: one spare, replaced RefillDelay after each take) and the
// current one (spares asked at once for the forks that wait, up to
// Options.Parallel in the making), in turn in the same run, and reports
// the sessions forked per second over each burst and their ratio.
func BenchmarkSparesPerSecond(b *testing.B) {
	const burst = 40
	if err := Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
	}
	run := func(fixed bool) float64 {
		z, err := New(context.Background(), &Options{Env: session.KernelEnv(), Fixed: fixed})
		if err != nil {
			b.Fatal(err)
		}
		defer z.Close()
		time.Sleep(time.Second) // the first spare is armed
		var wg sync.WaitGroup
		errs := make(chan error, burst)
		sessions := make(chan *session.Session, burst)
		stop := profileSpares(b, fixed)
		start := time.Now()
		for range burst {
			wg.Go(func() {
				s, err := session.New(context.Background(), &session.Options{Workspace: b.TempDir(), Zygote: z})
				if err != nil {
					errs <- err
					return
				}
				sessions <- s
			})
		}
		wg.Wait()
		took := time.Since(start)
		stop()
		close(sessions)
		for s := range sessions {
			s.Close()
		}
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return burst / took.Seconds()
	}
	var old, cur float64
	for range b.N {
		old += run(true) / float64(b.N)
		cur += run(false) / float64(b.N)
	}
	b.ReportMetric(old, "old-sessions/s")
	b.ReportMetric(cur, "sessions/s")
	b.ReportMetric(cur/old, "ratio")
	b.ReportMetric(0, "ns/op")
	b.Logf("a burst of %d forks: %.1f sessions/s before, %.1f now (%.1fx)", burst, old, cur, cur/old)
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
	f, err := os.Create(name + ".pprof")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	perf := exec.Command("perf", "record", "-a", "-g", "-F", "999", "-o", name+".perf")
	if err := perf.Start(); err != nil {
		b.Logf("no system-wide profile: %v", err)
		perf = nil
	}
	time.Sleep(300 * time.Millisecond) // perf is recording
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if perf != nil {
			_ = perf.Process.Signal(syscall.SIGINT)
			_ = perf.Wait()
		}
	}
}
