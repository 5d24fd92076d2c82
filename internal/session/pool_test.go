package session

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The pool's target remembers the largest burst of creates for
// PoolPeakHold (a burst as large renews it, a smaller later one takes over
// when it is forgotten), and is bounded by PoolMemory, the free session
// slots and MaxPool, never below PoolSize. Takes are recorded at made-up
// times: no kernel is started.
func TestPoolTargetRemembersBursts(t *testing.T) {
	if a := memAvailable(); a < poolMinAvailable {
		t.Skipf("the host has %d MiB available: the pool does not grow past PoolSize below %d MiB", a>>20, poolMinAvailable>>20)
	}
	const hold = time.Minute
	newM := func(o ManagerOptions) *Manager {
		o.PoolPeakHold = hold
		if o.PoolMemory == 0 {
			o.PoolMemory = -1
		}
		if o.MaxPool == 0 {
			o.MaxPool = o.MaxSessions
		}
		return &Manager{opts: o, sessions: map[string]*Managed{}}
	}
	burst := func(m *Manager, at time.Time, n int) {
		for i := range n {
			m.tookLocked(at.Add(time.Duration(i) * time.Millisecond))
		}
	}
	t0 := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	target := func(m *Manager, at time.Time) PoolTarget {
		m.mu.Lock()
		defer m.mu.Unlock()
		got := m.poolTargetLocked(at)
		// The pool's loop asks without the reason: the same number.
		if n := m.poolTargetN(at); n != got.N {
			t.Errorf("at %v: poolTargetN %d, poolTargetLocked %+v", at, n, got)
		}
		return got
	}

	m := newM(ManagerOptions{PoolSize: 2, MaxSessions: 200})
	if got := target(m, t0); got.N != 2 || !strings.Contains(got.Reason, "pool size") {
		t.Errorf("before any create: %+v, want the pool size 2", got)
	}
	burst(m, t0, 100)
	for _, after := range []time.Duration{time.Second, 10 * time.Second, hold - time.Second} {
		if got := target(m, t0.Add(after)); got.N != 100 || !strings.Contains(got.Reason, "largest burst") {
			t.Errorf("%v after a burst of 100: %+v, want 100 (the burst remembered)", after, got)
		}
	}
	// A smaller burst later does not lower the target while the larger one
	// is remembered; it takes over when that is forgotten.
	burst(m, t0.Add(30*time.Second), 40)
	if got := target(m, t0.Add(40*time.Second)); got.N != 100 {
		t.Errorf("after bursts of 100 then 40: %+v, want 100", got)
	}
	if got := target(m, t0.Add(hold+time.Second)); got.N != 40 {
		t.Errorf("once the burst of 100 is forgotten: %+v, want 40 (the later burst)", got)
	}
	if got := target(m, t0.Add(30*time.Second+hold+time.Second)); got.N != 2 {
		t.Errorf("once both are forgotten: %+v, want the pool size 2", got)
	}
	// A burst as large renews the memory.
	m = newM(ManagerOptions{PoolSize: 2, MaxSessions: 200})
	burst(m, t0, 100)
	burst(m, t0.Add(50*time.Second), 100)
	if got := target(m, t0.Add(hold+10*time.Second)); got.N != 100 {
		t.Errorf("a burst of 100 repeated 50 s later, %v after the first: %+v, want 100", hold+10*time.Second, got)
	}

	// Bounds.
	for _, c := range []struct {
		name string
		o    ManagerOptions
		held int // sessions held
		want int
		why  string
	}{
		{"memory budget", ManagerOptions{PoolSize: 2, MaxSessions: 200, PoolMemory: 10 * ColdKernelMemory}, 0, 10, "memory budget"},
		{"budget below the pool size", ManagerOptions{PoolSize: 4, MaxSessions: 200, PoolMemory: 1}, 0, 4, "pool size"},
		{"free slots", ManagerOptions{PoolSize: 2, MaxSessions: 120}, 90, 30, "free session slots"},
		{"no free slot", ManagerOptions{PoolSize: 2, MaxSessions: 100}, 100, 2, "pool size"},
		{"max pool", ManagerOptions{PoolSize: 2, MaxSessions: 200, MaxPool: 25}, 0, 25, "pool's maximum"},
	} {
		m := newM(c.o)
		for i := range c.held {
			m.sessions[string(rune('a'+i%26))+strings.Repeat("x", i/26)] = &Managed{}
		}
		burst(m, t0, 100)
		if got := target(m, t0.Add(time.Second)); got.N != c.want || !strings.Contains(got.Reason, c.why) {
			t.Errorf("%s: %+v, want %d (%s)", c.name, got, c.want, c.why)
		}
	}

	// No pool, no target: creates do not use it.
	if got := target(newM(ManagerOptions{MaxSessions: 200}), t0); got.N != 0 {
		t.Errorf("PoolSize 0: %+v, want 0", got)
	}

	// Without memory of bursts, the arrival rate alone: back to the pool
	// size once the rate's window has passed.
	m = newM(ManagerOptions{PoolSize: 2, MaxSessions: 200})
	m.opts.PoolPeakHold = -1
	burst(m, t0, 100)
	if got := target(m, t0.Add(time.Second)); got.N < 3 || !strings.Contains(got.Reason, "arrival rate") {
		t.Errorf("just after a burst, bursts not remembered: %+v, want the arrival rate's", got)
	}
	if got := target(m, t0.Add(10*time.Second)); got.N != 2 {
		t.Errorf("10 s after a burst, bursts not remembered: %+v, want the pool size", got)
	}
}

// The pool's target reads MemAvailable at most once per
// memAvailableMaxAge however often it is asked (the pool's loop asks after
// every start and take), and again once the reading is that old.
func TestRecentMemAvailableRereadsWhenOld(t *testing.T) {
	reads := func() int {
		memReading.Lock()
		defer memReading.Unlock()
		return memReading.reads
	}
	first := recentMemAvailable()
	if first <= 0 || first >= 1<<62 {
		t.Fatalf("MemAvailable %d: /proc/meminfo unreadable?", first)
	}
	n := reads()
	for range 100 {
		recentMemAvailable()
	}
	// A reading can age past memAvailableMaxAge during the loop on a
	// loaded machine: then one more read, never one per call.
	if got := reads() - n; got > 1 {
		t.Errorf("100 calls read /proc/meminfo %d times, want at most once", got)
	}
	time.Sleep(memAvailableMaxAge + 10*time.Millisecond)
	n = reads()
	a := recentMemAvailable()
	if reads() != n+1 {
		t.Errorf("a reading older than %v was not read again (%d reads before, %d after)", memAvailableMaxAge, n, reads())
	}
	if a <= 0 {
		t.Errorf("MemAvailable read again: %d", a)
	}
}

// Below its target with nobody waiting, the pool refills after the delay,
// or at once when fewer than half of what the arrival rate needs (low) are
// ready or starting.
func TestRefillNow(t *testing.T) {
	const delay = 250 * time.Millisecond
	for _, c := range []struct {
		ready, running, low int
		since               time.Duration
		want                bool
	}{
		{1, 0, 2, 10 * time.Millisecond, false}, // the default pool, one taken: after the delay
		{1, 0, 2, 300 * time.Millisecond, true}, // idle past the delay
		{0, 0, 2, 10 * time.Millisecond, true},  // empty: at once
		{0, 1, 2, 10 * time.Millisecond, false}, // one already starting
		{3, 0, 8, 5 * time.Millisecond, true},   // steady creates drained it below half
		{4, 0, 8, 5 * time.Millisecond, false},  // half left: the delay still applies
		{2, 2, 8, 5 * time.Millisecond, false},  // half ready or starting
		{0, 0, 1, 5 * time.Millisecond, true},   // a pool of one, taken
		{1, 0, 1, 5 * time.Millisecond, false},  // full
	} {
		if got := refillNow(c.ready, c.running, c.low, c.since, delay); got != c.want {
			t.Errorf("refillNow(ready %d, running %d, low %d, %v since the last take) = %v, want %v", c.ready, c.running, c.low, c.since, got, c.want)
		}
	}
}

// BenchmarkPoolTarget times the pool's target as its loop asks for it
// after every start and take: with the reason's text (before) and
// without (now, poolTargetN), alternately, on a manager that remembers a
// burst (the reasons then format two times of day):
//
//	go test ./internal/session -run '^$' -bench PoolTarget -benchtime 20000x
func BenchmarkPoolTarget(b *testing.B) {
	m := &Manager{opts: ManagerOptions{PoolSize: 2, MaxSessions: 200, MaxPool: 200, PoolMemory: -1, PoolPeakHold: time.Hour},
		sessions: map[string]*Managed{}}
	now := time.Now()
	for i := range 40 {
		m.tookLocked(now.Add(time.Duration(i) * time.Millisecond))
	}
	var before, after time.Duration
	var n1, n2 int
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		n1 = m.poolTargetLocked(now).N
		t1 := time.Now()
		n2 = m.poolTargetN(now)
		t2 := time.Now()
		before += t1.Sub(t0)
		after += t2.Sub(t1)
		if n1 != n2 {
			b.Fatalf("%d with the reason, %d without", n1, n2)
		}
	}
	b.ReportMetric(float64(before.Nanoseconds())/float64(b.N), "before-ns")
	b.ReportMetric(float64(after.Nanoseconds())/float64(b.N), "now-ns")
	b.Logf("target %d: %v per call with the reason, %v without (%.1fx)", n2,
		before/time.Duration(b.N), after/time.Duration(b.N), float64(before)/float64(max(after, 1)))
}

// The bursts the pool remembers are kept in PoolPeakFile for the next
// manager: it reads back those still remembered (in tookLocked's order,
// whatever the file's), none once PoolPeakHold has passed, and says what
// is wrong with a file it cannot read. Takes are made up, as above.
func TestPoolPeakFile(t *testing.T) {
	const hold = time.Minute
	file := filepath.Join(t.TempDir(), "data", "pool-peaks.json")
	newM := func() *Manager {
		return &Manager{opts: ManagerOptions{PoolPeakHold: hold, PoolPeakFile: file}, sessions: map[string]*Managed{}, log: slog.New(slog.DiscardHandler)}
	}
	t0 := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
	m := newM()
	for i := range 9 { // a burst of 9, then one of 4 ten seconds later
		m.tookLocked(t0.Add(time.Duration(i) * time.Millisecond))
	}
	for i := range 4 {
		m.tookLocked(t0.Add(10*time.Second + time.Duration(i)*time.Millisecond))
	}
	if m.peakSave == nil {
		t.Fatal("no write of the peaks is due after a burst")
	}
	m.savePeaks(false)
	if m.peakSave != nil {
		t.Error("the write is still due once done")
	}
	type peak struct {
		n  int
		at time.Time
	}
	read := func(now time.Time) []peak {
		t.Helper()
		peaks, err := newM().loadPeaks(now)
		if err != nil {
			t.Fatal(err)
		}
		var got []peak
		for _, p := range peaks {
			got = append(got, peak{p.n, p.at})
		}
		return got
	}
	want := []peak{{9, t0.Add(8 * time.Millisecond)}, {4, t0.Add(10*time.Second + 3*time.Millisecond)}}
	if got := read(t0.Add(30 * time.Second)); !slices.EqualFunc(got, want, func(a, b peak) bool { return a.n == b.n && a.at.Equal(b.at) }) {
		t.Errorf("peaks read back within the hold: %v, want %v", got, want)
	}
	if got := read(t0.Add(hold + 5*time.Second)); len(got) != 1 || got[0].n != 4 {
		t.Errorf("peaks read back once the largest is forgotten: %v, want only the burst of 4", got)
	}
	if got := read(t0.Add(hold + 11*time.Second)); len(got) != 0 {
		t.Errorf("peaks read back after the hold: %v, want none", got)
	}
	// A file in another order (written by hand, or by a later version)
	// is put back in order: a later burst as large replaces an earlier one.
	if err := os.WriteFile(file, []byte(`{"peaks":[{"creates":2,"at":"2026-12-07T07:00:07Z"},{"creates":3,"at":"2026-12-07T07:00:00Z"},{"creates":5,"at":"2026-12-07T07:00:05Z"},{"creates":0,"at":"2026-12-07T07:00:06Z"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	want = []peak{{5, t0.Add(5 * time.Second)}, {2, t0.Add(7 * time.Second)}}
	if got := read(t0.Add(10 * time.Second)); !slices.EqualFunc(got, want, func(a, b peak) bool { return a.n == b.n && a.at.Equal(b.at) }) {
		t.Errorf("peaks read back from a file out of order: %v, want %v", got, want)
	}
	if err := os.WriteFile(file, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if peaks, err := newM().loadPeaks(t0); err == nil || len(peaks) != 0 {
		t.Errorf("a broken file: %v, %v; want an error and no peaks", peaks, err)
	}
}
