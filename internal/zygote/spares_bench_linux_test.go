package zygote

import (
	"context"
	"sync"
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
