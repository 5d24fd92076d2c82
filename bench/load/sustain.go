package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/host"
)

// SustainConfig sizes a sustained-creation run (issue 26): sessions are
// asked for at Rate per second for Duration, each by a goroutine of its
// own that creates a session, runs 1+1 in it and deletes it.
type SustainConfig struct {
	// Rate is the offered creates per second. If zero, 100.
	Rate int
	// Duration of the new pipeline's run. If zero, 30 s.
	Duration time.Duration
	// OldDuration of the old pipeline's run (host.Config.OldPipeline),
	// before the new one, at the same rate; shorter since it falls behind.
	// If zero, 10 s; negative: no old run.
	OldDuration time.Duration
	// MaxSessions is the server's cap. If zero, 2000.
	MaxSessions int
	// InFlight caps the cycles under way at once: when it is reached the
	// next arrival waits (and the achieved rate shows it). If zero, 400.
	InFlight int
	// PoolSize is the warm pool. If zero, 2 (sandloop serve's default).
	PoolSize int
	// Log receives progress lines. If nil, none.
	Log io.Writer
	// CPUProfile, if set, is where the CPU profile (pprof) of the new
	// pipeline's run is written: this whole process, host and client.
	CPUProfile string
	// Trace, if set, is where the execution trace of the new pipeline's
	// run is written (runtime/trace).
	Trace string
}

// SustainResult is one pipeline's run.
type SustainResult struct {
	Name                   string
	Offered, Done          int // cycles asked for and completed
	Elapsed                time.Duration
	P50, P95, P99, Max     time.Duration // create + 1+1
	DelP50, DelP95         time.Duration // the delete
	Failures               []string
	Leaks                  Leaks
	Problems               []string // from the shutdown
	MaxInFlight, Throttled int      // arrivals that waited for the in-flight cap
	// CPU is this process's CPU time over the run (the host, in this
	// process, and the client), user and system (kernel work our Go code
	// caused: mounts, cgroups, pipes, sockets).
	User, Sys time.Duration
	// Sampler is the part of User+Sys the leak checks' sampler took
	// (listing the sandbox cgroups every 20 ms): not the host's.
	Sampler time.Duration
	// Load is the load average (1 min) at the start and at the end.
	LoadStart, LoadEnd float64
}

// Rate is the completed cycles per second over the run (its drain included).
func (r *SustainResult) Rate() float64 { return float64(r.Done) / r.Elapsed.Seconds() }

func (r *SustainResult) print(w io.Writer) {
	fmt.Fprintf(w, "%-13s offered %d, done %d in %v: %.1f sessions/s; create+1+1 p50 %.0f ms, p95 %.0f ms, p99 %.0f ms, max %.0f ms; failures %d; waited for the in-flight cap %d, most in flight %d\n",
		r.Name, r.Offered, r.Done, r.Elapsed.Round(time.Millisecond), r.Rate(), ms(r.P50), ms(r.P95), ms(r.P99), ms(r.Max),
		len(r.Failures), r.Throttled, r.MaxInFlight)
	if n := float64(r.Done); n > 0 {
		fmt.Fprintf(w, "  host CPU per session (this process: server and client, the leak sampler's %.2f ms left out) %.2f ms (user %.2f, system %.2f, the sampler in them); delete p50 %.1f ms, p95 %.1f ms; load %.1f -> %.1f\n",
			ms(r.Sampler)/n, ms(r.User+r.Sys-r.Sampler)/n, ms(r.User)/n, ms(r.Sys)/n, ms(r.DelP50), ms(r.DelP95), r.LoadStart, r.LoadEnd)
	}
	for i, f := range r.Failures {
		if i == 10 {
			fmt.Fprintf(w, "  ... and %d more\n", len(r.Failures)-10)
			break
		}
		fmt.Fprintf(w, "  FAIL %s\n", f)
	}
	r.Leaks.print(w)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  PROBLEM %s\n", p)
	}
}

// problems lists what failed in the run.
func (r *SustainResult) problems() []string {
	out := slices.Clone(r.Problems)
	// The old pipeline falls behind 100/s and its creates time out: a
	// baseline's failures are figures, not a failed run.
	if n := len(r.Failures); n > 0 && r.Name != "old pipeline" {
		out = append(out, fmt.Sprintf("%s: %d failed cycles", r.Name, n))
	}
	return append(out, r.Leaks.problems()...)
}

// Sustain runs the old pipeline (unless cfg.OldDuration < 0) then the new
// one, each on a fresh host, and prints both; it returns the problems
// found (failures, leaks).
func Sustain(ctx context.Context, cfg SustainConfig, w io.Writer) ([]string, error) {
	if cfg.Rate == 0 {
		cfg.Rate = 100
	}
	if cfg.Duration == 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.OldDuration == 0 {
		cfg.OldDuration = 10 * time.Second
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 2000
	}
	if cfg.InFlight == 0 {
		cfg.InFlight = 400
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 2
	}
	var results []*SustainResult
	if cfg.OldDuration > 0 {
		r, err := sustainOnce(ctx, cfg, true, cfg.OldDuration)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	r, err := sustainOnce(ctx, cfg, false, cfg.Duration)
	if err != nil {
		return nil, err
	}
	results = append(results, r)
	fmt.Fprintf(w, "sustained creation: %d/s offered, --max-sessions %d, pool %d, at most %d cycles in flight (create, 1+1, delete; over HTTP, real jails, zygote on)\n",
		cfg.Rate, cfg.MaxSessions, cfg.PoolSize, cfg.InFlight)
	var problems []string
	for _, r := range results {
		r.print(w)
		problems = append(problems, r.problems()...)
	}
	if len(results) == 2 && results[0].Rate() > 0 {
		fmt.Fprintf(w, "new/old: %.1fx the sessions per second, p50 %.1fx lower\n",
			results[1].Rate()/results[0].Rate(), float64(results[0].P50)/float64(max(results[1].P50, 1)))
	}
	return problems, nil
}

func sustainOnce(ctx context.Context, cfg SustainConfig, old bool, d time.Duration) (*SustainResult, error) {
	name := "new pipeline"
	if old {
		name = "old pipeline"
	}
	x, err := startHarness(ctx, &host.Config{PoolSize: cfg.PoolSize, MaxSessions: cfg.MaxSessions, Zygote: "on", OldPipeline: old}, cfg.InFlight+8, cfg.Log)
	if err != nil {
		return nil, err
	}
	if err := x.waitPool(ctx, cfg.PoolSize); err != nil {
		x.finish(ctx)
		return nil, err
	}
	time.Sleep(time.Second) // the zygote's spares too
	x.logf("sustain: %s: %d/s for %v", name, cfg.Rate, d)
	res := &SustainResult{Name: name}
	var (
		mu       sync.Mutex
		lat      []time.Duration
		dels     []time.Duration
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	slots := make(chan struct{}, cfg.InFlight)
	fail := func(format string, args ...any) {
		mu.Lock()
		res.Failures = append(res.Failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	if !old && cfg.CPUProfile != "" {
		stop, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			x.finish(ctx)
			return nil, err
		}
		defer stop()
	}
	if !old && cfg.Trace != "" {
		stop, err := startTrace(cfg.Trace)
		if err != nil {
			x.finish(ctx)
			return nil, err
		}
		defer stop()
	}
	res.LoadStart = loadAverage()
	user0, sys0 := cpuTimes()
	sampler0 := x.sampler.CPU()
	start := time.Now()
	tick := time.Second / time.Duration(cfg.Rate)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * tick)
		if at.Sub(start) >= d || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Until(at))
		select {
		case slots <- struct{}{}:
		default:
			res.Throttled++
			slots <- struct{}{}
		}
		res.Offered++
		n := inFlight.Add(1)
		res.MaxInFlight = max(res.MaxInFlight, int(n))
		wg.Go(func() {
			defer func() { <-slots; inFlight.Add(-1) }()
			rctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
			defer cancel()
			t0 := time.Now()
			s, err := x.c.CreateSession(rctx, nil)
			if err != nil {
				fail("cycle %d: create: %v", i, err)
				return
			}
			r, err := x.c.Execute(rctx, s.ID, "1+1", nil)
			lt := time.Since(t0)
			if err == nil {
				err = want(r.Text() == "2", r)
			}
			if err != nil {
				fail("cycle %d: 1+1: %v", i, err)
			} else {
				mu.Lock()
				lat = append(lat, lt)
				mu.Unlock()
			}
			t1 := time.Now()
			if err := x.c.DeleteSession(rctx, s.ID); err != nil {
				fail("cycle %d: delete %s: %v", i, s.ID, err)
			} else {
				mu.Lock()
				dels = append(dels, time.Since(t1))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	user1, sys1 := cpuTimes()
	res.User, res.Sys, res.Sampler = user1-user0, sys1-sys0, x.sampler.CPU()-sampler0
	res.LoadEnd = loadAverage()
	res.Done = len(lat)
	if len(lat) > 0 {
		res.P50, res.P95, res.P99, res.Max = percentile(lat, 50), percentile(lat, 95), percentile(lat, 99), slices.Max(lat)
	}
	if len(dels) > 0 {
		res.DelP50, res.DelP95 = percentile(dels, 50), percentile(dels, 95)
	}
	res.Leaks, res.Problems = x.finish(ctx)
	return res, nil
}
