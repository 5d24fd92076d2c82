// Package burst measures issue 26's bursts for the benchmarks of every
// face (HTTP, MCP, a cell's gateway): n clients at once each create a
// session and run their first code, in three rows printed side by side
// in one run: the pipeline before issue 26 on a fresh host, the current
// one on a fresh host (a first burst), and a repeated burst on that host
// once its pool has refilled to the burst it remembers
// (session.ManagerOptions.PoolPeakHold); and, where the face has it, a
// fourth: the first burst on a fresh host configured for it (--pool n).
package burst

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// One is one client: it creates a session and runs its first code in it.
// It returns whether the session got a kernel started ahead (1), did not
// (0), or the face does not tell (-1), and what deletes the session (nil
// if none was made); Run deletes them once every client has answered.
type One func(ctx context.Context) (pooled int, remove func() error, err error)

// Result is one burst's figures.
type Result struct {
	N, OK int
	// Pooled are the sessions given a kernel started ahead; -1 if the
	// face does not tell.
	Pooled         int
	P50, P95, Last time.Duration
	PerSecond      float64 // sessions answered per second over the burst
	FirstErr       error
	End            time.Time     // the last answer
	Deletes        time.Duration // deleting the sessions after
	Note           string        // Face.Note's
}

func (r Result) String() string {
	s := fmt.Sprintf("%d/%d ok, p50 %v, p95 %v, last %v, %.1f sessions/s", r.OK, r.N, r.P50.Round(time.Millisecond),
		r.P95.Round(time.Millisecond), r.Last.Round(time.Millisecond), r.PerSecond)
	if r.Pooled >= 0 {
		s += fmt.Sprintf(", %d from the pool", r.Pooled)
	}
	if r.Note != "" {
		s += ", " + r.Note
	}
	if r.FirstErr != nil {
		s += fmt.Sprintf(" (first error: %v)", r.FirstErr)
	}
	return s
}

// Run starts n clients at once and returns once all have answered and
// the sessions they made are deleted (a failed delete fails tb). profile,
// if not nil, is started just before the clients go and stopped when the
// last has answered.
func Run(tb testing.TB, n int, one One, profile func() (stop func())) Result {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		removes []func() error
		pooled  int
		ferr    error
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			t0 := time.Now()
			p, remove, err := one(ctx)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if remove != nil {
				removes = append(removes, remove)
			}
			if p < 0 || pooled < 0 {
				pooled = -1
			} else {
				pooled += p
			}
			if err != nil {
				if ferr == nil {
					ferr = err
				}
				return
			}
			lat = append(lat, d)
		})
	}
	stop := func() {}
	if profile != nil {
		stop = profile()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	end := time.Now()
	stop()
	for _, remove := range removes {
		if err := remove(); err != nil {
			tb.Errorf("delete a session of the burst: %v", err)
		}
	}
	slices.Sort(lat)
	r := Result{N: n, OK: len(lat), Pooled: pooled, FirstErr: ferr, PerSecond: float64(len(lat)) / end.Sub(t0).Seconds(),
		End: end, Deletes: time.Since(end)}
	if len(lat) > 0 {
		r.P50, r.P95, r.Last = lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1]
	}
	return r
}

// Pool is a host's warm pool as its /healthz tells it; for a cell, the
// sum over its hosts, with Ready counting at most each host's Target (so
// Ready >= Target only once every host's pool is at its target).
type Pool struct {
	Ready, Target int
	Sessions      int // held, and creates under way
	Reason        string
}

// Face is one way into sandloop, measured by Three.
type Face struct {
	// N is the burst's size.
	N int
	// Remembered is the pool target (Pool.Target) the repeated burst
	// waits for, with every pool at its target: the first burst
	// remembered. If zero, N. (Behind a gateway, each host remembers the
	// creates of its share that came within the pool's window, which may
	// be less than its share.)
	Remembered int
	// Start starts a fresh host (or cell) with the pipeline before issue
	// 26 (old) or the current one and waits until its first pool is
	// ready. It returns one client's work, how to read the pool and what
	// stops the host.
	Start func(old bool) (one One, pool func() (Pool, error), stop func())
	// Profile, if set, records the burst named old, first or repeated
	// (ProfileFromEnv: BURST_PROFILE); it returns what stops it.
	Profile func(name string) (stop func())
	// Note, if set, is called after each burst (old, first, repeated or
	// sized) and says what the face saw of it (for a cell: the sessions
	// per host).
	Note func(name string) string
	// StartSized, if set, starts a fresh host (or cell) configured for
	// bursts of N (`serve --pool N`: that many kernels kept ready from
	// its start) and waits until its pool holds them: a fourth burst,
	// "sized", measures what a deployment that expects such bursts gets
	// from its very first one. It returns as Start does.
	StartSized func() (one One, pool func() (Pool, error), stop func())
}

// Rows are the bursts of one run (Sized only with Face.StartSized).
type Rows struct {
	Old, First, Again, Sized Result
	// Refill is how long after the first burst's last answer the
	// repeated one was sent; Waited says so, with the pool it found.
	Refill time.Duration
	Waited string
}

// Three runs the three bursts of f in turn, and the sized one if f has
// StartSized (each host stopped before the next starts), logs them in two
// or three lines (the testing package keeps only a benchmark's first ten)
// and fails b unless every client of each succeeded.
func Three(b *testing.B, f Face) Rows {
	b.Helper()
	profile := func(name string) func() (stop func()) {
		if f.Profile == nil {
			return nil
		}
		return func() func() { return f.Profile(name) }
	}
	run := func(one One, name string) Result {
		r := Run(b, f.N, one, profile(name))
		if f.Note != nil {
			r.Note = f.Note(name)
		}
		return r
	}
	var r Rows
	one, _, stop := f.Start(true)
	r.Old = run(one, "old")
	stop()

	one, pool, stop := f.Start(false)
	defer func() { stop() }() // the sized host's, once it replaces this one
	r.First = run(one, "first")
	// The pool refills to the burst it remembers: sent once it has (and
	// the first burst's sessions are gone), or after two minutes whatever
	// it holds.
	var (
		p   Pool
		err error
	)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if p, err = pool(); err != nil {
			b.Fatal(err)
		}
		if p.Ready >= p.Target && p.Target >= cmp.Or(f.Remembered, f.N) && p.Sessions == 0 {
			break
		}
		if err = fmt.Errorf("the pool holds %d kernels of its target %d, %d sessions left", p.Ready, p.Target, p.Sessions); time.Now().After(deadline) {
			break
		}
		err = nil
	}
	r.Refill = time.Since(r.First.End)
	r.Waited = fmt.Sprintf("sent %v after the first's last answer (its deletes took %v), pool %d ready of target %d",
		r.Refill.Round(100*time.Millisecond), r.First.Deletes.Round(100*time.Millisecond), p.Ready, p.Target)
	if err != nil {
		r.Waited += fmt.Sprintf(" (not full: %v)", err)
	}
	if p.Reason != "" {
		r.Waited += "; " + p.Reason
	}
	r.Again = run(one, "repeated")
	b.Logf("old pipeline (fresh host): %s | first burst (fresh host): %s", r.Old, r.First)
	b.Logf("repeated burst (%s): %s", r.Waited, r.Again)
	rows := []struct {
		name string
		Result
	}{{"old pipeline", r.Old}, {"first burst", r.First}, {"repeated burst", r.Again}}
	if f.StartSized != nil {
		stop()
		stop = func() {} // closed: not again if StartSized fails
		one, _, stop = f.StartSized()
		r.Sized = run(one, "sized")
		b.Logf("sized pool (a fresh host with --pool %d, its first burst): %s", f.N, r.Sized)
		rows = append(rows, struct {
			name string
			Result
		}{"sized pool", r.Sized})
	}
	for _, x := range rows {
		if x.OK != f.N {
			b.Errorf("%s: %d of %d succeeded: %v", x.name, x.OK, f.N, x.FirstErr)
		}
	}
	return r
}

// Report reports the means of rs (one per iteration) as b's metrics:
// p50 and p95 of each row in ms, the repeated and first bursts' p50
// speed-ups over the old pipeline's, and the refill's seconds.
func Report(b *testing.B, rs []Rows) {
	if len(rs) == 0 {
		return
	}
	mean := func(f func(Rows) time.Duration) float64 {
		var sum float64
		for _, r := range rs {
			sum += f(r).Seconds() * 1000
		}
		return sum / float64(len(rs))
	}
	op50, op95 := mean(func(r Rows) time.Duration { return r.Old.P50 }), mean(func(r Rows) time.Duration { return r.Old.P95 })
	fp50, fp95 := mean(func(r Rows) time.Duration { return r.First.P50 }), mean(func(r Rows) time.Duration { return r.First.P95 })
	rp50, rp95 := mean(func(r Rows) time.Duration { return r.Again.P50 }), mean(func(r Rows) time.Duration { return r.Again.P95 })
	b.ReportMetric(op50, "old-p50-ms")
	b.ReportMetric(op95, "old-p95-ms")
	b.ReportMetric(fp50, "first-p50-ms")
	b.ReportMetric(fp95, "first-p95-ms")
	b.ReportMetric(rp50, "repeat-p50-ms")
	b.ReportMetric(rp95, "repeat-p95-ms")
	if fp50 > 0 && rp50 > 0 {
		b.ReportMetric(op50/fp50, "first-p50-speedup")
		b.ReportMetric(op50/rp50, "repeat-p50-speedup")
	}
	b.ReportMetric(mean(func(r Rows) time.Duration { return r.Refill })/1000, "refill-s")
	if rs[0].Sized.N > 0 {
		b.ReportMetric(mean(func(r Rows) time.Duration { return r.Sized.P50 }), "sized-p50-ms")
		b.ReportMetric(mean(func(r Rows) time.Duration { return r.Sized.P95 }), "sized-p95-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// Bench measures face's three rows (Three) b.N times and reports them.
func Bench(b *testing.B, face Face) {
	var rows []Rows
	for range b.N {
		rows = append(rows, Three(b, face))
	}
	Report(b, rows)
}

// ProfileFromEnv is a Face.Profile: when BURST_PROFILE names a path
// prefix, it records where the time goes during one burst: the whole
// machine with perf (PREFIX.NAME.perf; needs perf) and this process (the
// host, or a cell) with Go's CPU profiler (PREFIX.NAME.pprof), NAME being
// old, first or repeated. Its function starts them and returns what stops
// them; nil without BURST_PROFILE.
func ProfileFromEnv(b *testing.B) func(name string) (stop func()) {
	prefix := os.Getenv("BURST_PROFILE")
	if prefix == "" {
		return nil
	}
	return func(name string) func() { return Profile(b, prefix+"."+name, 499) }
}

// Profile records where the time goes until the function it returns is
// called: the whole machine with perf at hz samples a second (name.perf;
// without perf, only a line in the log) and this process with Go's CPU
// profiler (name.pprof).
func Profile(b *testing.B, name string, hz int) (stop func()) {
	f, err := os.Create(name + ".pprof")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	perf := exec.Command("perf", "record", "-a", "-g", "-F", strconv.Itoa(hz), "-o", name+".perf")
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
