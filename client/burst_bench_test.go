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
// the zygote (sandloop serve's pool of 2). Each iteration measures, in
// turn in the same process, three bursts of 100:
//
//   - "old pipeline": the pipeline before issue 26 (host.Config.OldPipeline:
//     fixed refill delays, one spare, one pooled kernel started at a time)
//     on a fresh host;
//   - "first burst": the current pipeline on a fresh host (a pool of 2:
//     the other 98 wait for kernels forked on demand);
//   - "repeated burst": a second burst of 100 on that same host, once its
//     sessions of the first are deleted and its pool has refilled to the
//     target it set itself after the first (the largest burst remembered:
//     session.ManagerOptions.PoolPeakHold); how long that refill took after
//     the first burst's last answer is printed too.
//
// It prints for each the successes, p50, p95 and the last answer, and the
// sessions made per second over the burst; -benchtime 1x is one of each.
// Each host is closed before the next starts.
func BenchmarkBurst100(b *testing.B) {
	const burst = 100
	ctx := context.Background()
	start := func(old bool) (*client.Client, func()) {
		h, err := startHost(&host.Config{PoolSize: 2, MaxSessions: burst + 28, Zygote: "on", OldPipeline: old})
		if err != nil {
			b.Fatal(err)
		}
		c := newClient(b, h.URL(), &client.Options{HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burst}}})
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
		return c, func() {
			if err := h.Close(); err != nil {
				b.Errorf("host close: %v", err)
			}
		}
	}
	var old, first, again []burstResult
	var refills []time.Duration
	for range b.N {
		c, stop := start(true)
		old = append(old, runBurst(b, c, burst, "old"))
		stop()

		c, stop = start(false)
		first = append(first, runBurst(b, c, burst, "first"))
		ended := first[len(first)-1].end
		// The pool refills to the burst it remembers; sent once it has,
		// or after two minutes whatever it holds.
		var h *client.Health
		var err error
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if h, err = c.Health(ctx); err != nil {
				b.Fatal(err)
			}
			if h.PoolReady >= h.PoolTarget && h.PoolTarget >= burst {
				break
			}
			if err = fmt.Errorf("the pool holds %d kernels of its target %d", h.PoolReady, h.PoolTarget); time.Now().After(deadline) {
				break
			}
			err = nil
		}
		refills = append(refills, time.Since(ended))
		wait := fmt.Sprintf("sent %v after the first's last answer (its deletes took %v), pool %d ready of target %d%s",
			time.Since(ended).Round(100*time.Millisecond), first[len(first)-1].deletes.Round(100*time.Millisecond),
			h.PoolReady, h.PoolTarget, map[bool]string{true: " (not full: " + fmt.Sprint(err) + ")"}[err != nil])
		again = append(again, runBurst(b, c, burst, "repeated"))
		stop()
		// Two lines an iteration: the testing package keeps only the first
		// ten lines of a benchmark's log.
		o, f, a := old[len(old)-1], first[len(first)-1], again[len(again)-1]
		b.Logf("old pipeline: %s | first burst (fresh host): %s", o, f)
		b.Logf("repeated burst (%s; %s): %s", wait, h.PoolReason, a)
		for _, r := range []struct {
			name string
			burstResult
		}{{"old pipeline", o}, {"first burst", f}, {"repeated burst", a}} {
			if r.ok != burst {
				b.Errorf("%s: %d of %d succeeded: %v", r.name, r.ok, burst, r.firstErr)
			}
		}
	}
	mean := func(rs []burstResult) (p50, p95 float64) {
		for _, r := range rs {
			p50 += r.p50.Seconds() * 1000 / float64(len(rs))
			p95 += r.p95.Seconds() * 1000 / float64(len(rs))
		}
		return p50, p95
	}
	op50, op95 := mean(old)
	fp50, fp95 := mean(first)
	rp50, rp95 := mean(again)
	var refill float64
	for _, d := range refills {
		refill += d.Seconds() / float64(len(refills))
	}
	b.ReportMetric(op50, "old-p50-ms")
	b.ReportMetric(op95, "old-p95-ms")
	b.ReportMetric(fp50, "first-p50-ms")
	b.ReportMetric(fp95, "first-p95-ms")
	b.ReportMetric(rp50, "repeat-p50-ms")
	b.ReportMetric(rp95, "repeat-p95-ms")
	b.ReportMetric(op50/fp50, "first-p50-speedup")
	b.ReportMetric(op50/rp50, "repeat-p50-speedup")
	b.ReportMetric(refill, "refill-s")
	b.ReportMetric(0, "ns/op")
}

// burstResult is one burst's figures.
type burstResult struct {
	n, ok          int
	pooled         int // sessions given a kernel started ahead (FromPool)
	p50, p95, last time.Duration
	perSecond      float64
	firstErr       error
	end            time.Time     // the last answer
	deletes        time.Duration // deleting the sessions after
}

func (r burstResult) String() string {
	s := fmt.Sprintf("%d/%d ok, p50 %v, p95 %v, last %v, %.1f sessions/s, %d from the pool", r.ok, r.n, r.p50.Round(time.Millisecond),
		r.p95.Round(time.Millisecond), r.last.Round(time.Millisecond), r.perSecond, r.pooled)
	if r.firstErr != nil {
		s += fmt.Sprintf(" (first error: %v)", r.firstErr)
	}
	return s
}

// runBurst sends n creates + 1+1 at once to c, then deletes the sessions;
// name labels its profile (profileBurst).
func runBurst(b *testing.B, c *client.Client, n int, name string) burstResult {
	ctx := context.Background()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		ids    []string
		pooled int
		ferr   error
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	for range n {
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
				if s.FromPool {
					pooled++
				}
			}
			if err != nil {
				ferr = firstErr(ferr, err)
				return
			}
			lat = append(lat, d)
		})
	}
	stopProfile := profileBurst(b, name)
	t0 := time.Now()
	close(start)
	wg.Wait()
	end := time.Now()
	total := end.Sub(t0)
	stopProfile()
	for _, id := range ids {
		if err := c.DeleteSession(ctx, id); err != nil {
			b.Errorf("delete %s: %v", id, err)
		}
	}
	slices.Sort(lat)
	r := burstResult{n: n, ok: len(lat), pooled: pooled, firstErr: ferr, perSecond: float64(len(lat)) / total.Seconds(),
		end: end, deletes: time.Since(end)}
	if len(lat) > 0 {
		r.p50, r.p95, r.last = lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1]
	}
	return r
}

// firstErr returns a if it is set, else b.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// profileBurst, when BURST_PROFILE names a path prefix, records where the
// time goes during one burst: the whole machine with perf (PREFIX.NAME.perf;
// needs perf) and this process, the host, with Go's CPU profiler
// (PREFIX.NAME.pprof), NAME being old, first or repeated. It returns what
// stops them.
func profileBurst(b *testing.B, name string) (stop func()) {
	prefix := os.Getenv("BURST_PROFILE")
	if prefix == "" {
		return func() {}
	}
	name = prefix + "." + name
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
