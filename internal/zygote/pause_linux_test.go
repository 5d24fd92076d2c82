package zygote

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/session/sessiontest"
)

// TestPauseForked: a forked session (its cgroup made by the host) paused
// uses no CPU, resumes with its state and, closed while paused, leaves
// nothing (sessiontest.CheckPause).
func TestPauseForked(t *testing.T) {
	z := newZygote(t, light)
	s := newSession(t, z, session.Options{})
	sessiontest.CheckPause(t, s.Session)
}

// pausedSessions is how many sessions BenchmarkPausedSessions holds
// ($SANDLOOP_BENCH_SESSIONS, default 100).
func pausedSessions() int {
	if v, err := strconv.Atoi(os.Getenv("SANDLOOP_BENCH_SESSIONS")); err == nil && v > 0 {
		return v
	}
	return 100
}

// BenchmarkPausedSessions holds N forked sessions (default 100), each
// with a thread spinning in its kernel, pauses them all and sums the CPU
// time their cgroups count over 2 s: it must be zero (an error
// otherwise). Beside it, the same sessions' CPU over 2 s while running.
func BenchmarkPausedSessions(b *testing.B) {
	n := pausedSessions()
	z := newZygote(b, light)
	ss := make([]*session.Session, 0, n)
	b.Cleanup(func() {
		for _, s := range ss {
			s.Close()
		}
	})
	for i := 0; i < n; i++ {
		s := newSession(b, z, session.Options{})
		ss = append(ss, s.Session)
		// A thread that wakes 100 times a second: a live session's idle
		// work, small enough for 100 of them on a shared machine.
		res, err := s.Execute(context.Background(), kernel.Request{Code: "import threading, time\ndef _tick():\n    while True: time.sleep(0.01)\nthreading.Thread(target=_tick, daemon=True).start()"}, nil)
		if err != nil || res.Status != "ok" {
			b.Fatalf("start the ticker: %v %+v", err, res)
		}
	}
	total := func() time.Duration {
		var sum time.Duration
		for _, s := range ss {
			u, err := s.Resources()
			if err != nil {
				b.Fatal(err)
			}
			sum += u.CPU
		}
		return sum
	}
	for i := 0; i < b.N; i++ {
		t0 := total()
		time.Sleep(2 * time.Second)
		running := total() - t0
		var pause []time.Duration
		for _, s := range ss {
			start := time.Now()
			if err := s.Pause(); err != nil {
				b.Fatal(err)
			}
			pause = append(pause, time.Since(start))
		}
		p0 := total()
		time.Sleep(2 * time.Second)
		paused := total() - p0
		if paused != 0 {
			b.Errorf("%d paused sessions used %v of CPU in 2 s, want none", n, paused)
		}
		for _, s := range ss {
			if err := s.Resume(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(running)/float64(time.Millisecond), "running-cpu-ms/2s")
		b.ReportMetric(float64(paused)/float64(time.Millisecond), "paused-cpu-ms/2s")
		b.Logf("%d sessions, CPU over 2 s: running %v, paused %v; pause median %v", n, running.Round(time.Microsecond), paused, median(pause).Round(time.Microsecond))
	}
}

// BenchmarkPauseResume times pausing and resuming a forked and a cold
// session, beside an Execute of `1` on the same session, alternating in
// one run: medians and the ratios to the execute.
func BenchmarkPauseResume(b *testing.B) {
	z := newZygote(b, light)
	forkedS := newSession(b, z, session.Options{}).Session
	cold, err := session.New(context.Background(), &session.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cold.Close() })
	for _, c := range []struct {
		name string
		s    *session.Session
	}{{"forked", forkedS}, {"cold", cold}} {
		var pause, resume, exec []time.Duration
		for i := 0; i < b.N+3; i++ {
			start := time.Now()
			res, err := c.s.Execute(context.Background(), kernel.Request{Code: "1"}, nil)
			if err != nil || res.Status != "ok" {
				b.Fatal(err, res)
			}
			e := time.Since(start)
			start = time.Now()
			if err := c.s.Pause(); err != nil {
				b.Fatal(err)
			}
			p := time.Since(start)
			start = time.Now()
			if err := c.s.Resume(); err != nil {
				b.Fatal(err)
			}
			r := time.Since(start)
			if i >= 3 { // warm-up
				exec, pause, resume = append(exec, e), append(pause, p), append(resume, r)
			}
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		pm, rm, em := median(pause), median(resume), median(exec)
		b.ReportMetric(ms(pm), c.name+"-pause-ms")
		b.ReportMetric(ms(rm), c.name+"-resume-ms")
		b.ReportMetric(ms(em), c.name+"-execute1-ms")
		b.Logf("%s session (%s), median of %d: pause %.3f ms, resume %.3f ms, beside Execute(`1`) %.3f ms (pause/execute %.2f, resume/execute %.2f)",
			c.name, jail.FreezeMethod(), len(pause), ms(pm), ms(rm), ms(em), float64(pm)/float64(em), float64(rm)/float64(em))
	}
}
