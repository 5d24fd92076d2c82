package client_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkBurst100 is issue 26's measure: 100 clients at once each create
// a session and run 1+1 in it, through the HTTP API of a real host with
// the zygote (sandloop serve's pool of 2). It runs the pipeline before
// issue 26 (host.Config.OldPipeline: fixed refill delays, one spare, one
// pooled kernel started at a time) and the current one, in turn in the
// same process, and prints for each the successes, p50, p95 and the last
// answer, and sessions made per second over the burst. Each iteration
// starts both hosts afresh (pool full before the burst) and deletes the
// sessions afterwards; -benchtime 1x is one burst of each.
func BenchmarkBurst100(b *testing.B) {
	const burst = 100
	type result struct {
		ok             int
		p50, p95, last time.Duration
		perSecond      float64
		firstErr       error
	}
	run := func(old bool) result {
		url := newServer(b, &host.Config{PoolSize: 2, MaxSessions: burst + 28, Zygote: "on", OldPipeline: old})
		c := newClient(b, url, &client.Options{HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burst}}})
		ctx := context.Background()
		testutil.WaitFor(b, 60*time.Second, func() error {
			h, err := c.Health(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if h.PoolReady < 2 {
				return fmt.Errorf("the pool is not full: %+v", h)
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // the zygote's spare too
		var (
			mu   sync.Mutex
			lat  []time.Duration
			ids  []string
			ferr error
			wg   sync.WaitGroup
		)
		start := make(chan struct{})
		for range burst {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				s, err := c.CreateSession(ctx, nil)
				if err == nil {
					var r *client.Result
					r, err = c.Execute(ctx, s.ID, "1+1", nil)
					if err == nil && r.Text() != "2" {
						err = fmt.Errorf("1+1 gave %+v", r)
					}
				}
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if s != nil {
					ids = append(ids, s.ID)
				}
				if err != nil {
					ferr = firstErr(ferr, err)
					return
				}
				lat = append(lat, d)
			})
		}
		stopProfile := profileBurst(b, old)
		t0 := time.Now()
		close(start)
		wg.Wait()
		total := time.Since(t0)
		stopProfile()
		for _, id := range ids {
			if err := c.DeleteSession(ctx, id); err != nil {
				b.Errorf("delete %s: %v", id, err)
			}
		}
		slices.Sort(lat)
		r := result{ok: len(lat), firstErr: ferr, perSecond: float64(len(lat)) / total.Seconds()}
		if len(lat) > 0 {
			r.p50, r.p95, r.last = lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1]
		}
		return r
	}
	var old, cur []result
	for range b.N {
		old = append(old, run(true))
		cur = append(cur, run(false))
	}
	report := func(name string, rs []result) (p50, p95 float64) {
		for _, r := range rs {
			b.Logf("%s: %d/%d ok, p50 %v, p95 %v, last %v, %.1f sessions/s (first error: %v)",
				name, r.ok, burst, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.last.Round(time.Millisecond), r.perSecond, r.firstErr)
			if r.ok != burst {
				b.Errorf("%s: %d of %d succeeded: %v", name, r.ok, burst, r.firstErr)
			}
			p50 += r.p50.Seconds() * 1000 / float64(len(rs))
			p95 += r.p95.Seconds() * 1000 / float64(len(rs))
		}
		return p50, p95
	}
	op50, op95 := report("old pipeline", old)
	np50, np95 := report("new pipeline", cur)
	b.ReportMetric(op50, "old-p50-ms")
	b.ReportMetric(op95, "old-p95-ms")
	b.ReportMetric(np50, "p50-ms")
	b.ReportMetric(np95, "p95-ms")
	b.ReportMetric(op50/np50, "p50-speedup")
	b.ReportMetric(op95/np95, "p95-speedup")
	b.ReportMetric(0, "ns/op")
}

// firstErr returns a if it is set, else b.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// profileBurst, when BURST_PROFILE names a path prefix, records where the
// time goes during one burst: the whole machine with perf (PREFIX.old.perf
// or PREFIX.new.perf; needs perf) and this process, the host, with Go's
// CPU profiler (PREFIX.old.pprof, PREFIX.new.pprof). It returns what stops
// them.
func profileBurst(b *testing.B, old bool) (stop func()) {
	prefix := os.Getenv("BURST_PROFILE")
	if prefix == "" {
		return func() {}
	}
	name := prefix + ".new"
	if old {
		name = prefix + ".old"
	}
	f, err := os.Create(name + ".pprof")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	perf := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", name+".perf")
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
