package session

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkSequentialCreates creates sessions one after another, each
// running `1+1` and closed at once, at most one every 15 ms (ComputeSDK's
// sequential method, in process, at its pace here), with the pool refilled
// at once below half what the arrival rate needs (now) and, alternately
// in the same run, only RefillDelay after the last take
// (before: steady creates never leave that delay free, so the pool runs
// dry and creates wait for whole starts). It reports both distributions
// and how many creates waited for a kernel's start.
func BenchmarkSequentialCreates(b *testing.B) {
	ctx := context.Background()
	// The rate alone sizes the pool (no remembered burst): each round
	// starts from the same idle server.
	o := ManagerOptions{MaxSessions: 64, PoolSize: 2, PoolPeakHold: -1} // serve's pool
	m, _ := benchManager(b, o)
	b.Cleanup(func() { noLowWater.Store(false) })
	// One create every 15 ms at most: the pace of ComputeSDK's sequential
	// loop through E2B's SDK here (create + a command, ~13-16 ms each).
	const n, pace = 100, 15 * time.Millisecond
	const waited = 5 * time.Millisecond // a create longer than this waited for a start
	round := func(old bool) (d []time.Duration, empty int) {
		noLowWater.Store(old)
		// Each round starts from an idle server: the pool at its size.
		testutil.WaitFor(b, time.Minute, func() error {
			if st := m.Stats(); st.PoolTarget > o.PoolSize || st.PoolReady < st.PoolTarget || st.Sessions > 0 {
				return os.ErrDeadlineExceeded
			}
			return nil
		})
		next := time.Now()
		for range n {
			time.Sleep(time.Until(next))
			t0 := time.Now()
			next = t0.Add(pace)
			s, err := m.Create(ctx, CreateOptions{Owner: "b"})
			if err != nil {
				b.Fatal(err)
			}
			if time.Since(t0) > waited {
				empty++
			}
			r, err := s.Execute(ctx, kernel.Request{Code: "1+1"}, nil)
			if err != nil || r.Status != kernel.StatusOK {
				b.Fatalf("1+1: %v %+v", err, r)
			}
			d = append(d, time.Since(t0))
			if err := m.Delete("b", s.ID()); err != nil {
				b.Fatal(err)
			}
		}
		return d, empty
	}
	var before, now []time.Duration
	var emptyBefore, emptyNow int
	for i := 0; b.Loop(); i++ {
		for _, old := range []bool{i%2 != 0, i%2 == 0} {
			d, e := round(old)
			if old {
				before, emptyBefore = append(before, d...), emptyBefore+e
			} else {
				now, emptyNow = append(now, d...), emptyNow+e
			}
		}
	}
	b.StopTimer()
	load, _ := os.ReadFile("/proc/loadavg")
	q := func(d []time.Duration, p float64) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[min(len(d)-1, int(p*float64(len(d))))]
	}
	b.ReportMetric(float64(q(now, 0.5).Microseconds())/1e3, "p50-ms")
	b.ReportMetric(float64(q(now, 0.99).Microseconds())/1e3, "p99-ms")
	b.ReportMetric(float64(q(before, 0.99).Microseconds())/1e3, "before-p99-ms")
	b.Logf("load average: %s; %d sequential create + 1+1 (+ delete) per round: now (refilled at once below half what the arrival rate needs) p50 %v, p95 %v, p99 %v, %d of %d waited for a kernel's start (create > %v); before (refilled only after the delay) p50 %v, p95 %v, p99 %v, %d of %d waited; ratio p99 before/now %.2f",
		strings.TrimSpace(string(load)), n, q(now, 0.5), q(now, 0.95), q(now, 0.99), emptyNow, len(now), waited, q(before, 0.5), q(before, 0.95), q(before, 0.99), emptyBefore, len(before), float64(q(before, 0.99))/float64(q(now, 0.99)))
}
