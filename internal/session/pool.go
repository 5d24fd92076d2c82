package session

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// The pool (ManagerOptions.FixedPool off) sizes itself and serves a burst
// in arrival order:
//   - a create that finds the pool empty joins a queue of waiters (one per
//     reserved session slot, so at most MaxSessions) and gets the next
//     pooled kernel, first come first served; its ctx ends its wait;
//   - while anyone waits, poolLoop starts up to PoolParallel kernels at
//     once, with no delay; when nobody waits it refills RefillDelay after
//     the last take, up to half of PoolParallel at once, or at once if
//     fewer than half of what the arrival rate needs are ready or starting
//     (refillNow: steady creates, one after another faster than
//     RefillDelay, would else empty the pool, and the next create would
//     wait for a whole start);
//   - the pool's target is the larger of two demands: the arrival rate
//     (takes in the last poolRateWindow: twice the arrivals during one
//     kernel's start) and the largest burst seen (the most takes within
//     one poolRateWindow) in the last PoolPeakHold, so that workloads that
//     send bursts of the same size again and again (RL rollouts, evaluation
//     runs) find the second and later ones ready. It is bounded by MaxPool,
//     by the free session slots (MaxSessions less the sessions held), by
//     PoolMemory (at ForkedKernelMemory a kernel, ColdKernelMemory without
//     a zygote), and not above PoolSize
//     while the host has less than poolMinAvailable of memory; it is never
//     below PoolSize. After PoolIdleShrink without a take the kernels above
//     the target are closed (the remembered burst keeps its kernels until
//     PoolPeakHold after it, unless a burst as large comes again).
//
// What a session costs the machine when they are made and closed without
// pause (issue 26's sustained run, perf over the whole machine: the table
// is in docs/benchmarks.md, "Where a session's CPU goes"): ~27 ms of CPU
// since spares are made by the zygote's trampoline (~37 before it), ~20 of
// them in the zygote's python3 processes (the kernel's fork, its page
// faults and the teardown of its copy of the template), ~5 in this host
// (and the load's client), ~2 in kernel threads (network namespaces'
// teardown, memory cgroups' offline, RCU callbacks). The pool's own part
// is the target below, now ~0.07 ms a session (it read /proc/meminfo each
// time: recentMemAvailable).

const (
	poolRateWindow   = 2 * time.Second
	poolMinAvailable = 1 << 30 // bytes of MemAvailable below which the pool does not grow past PoolSize
)

// What one ready kernel holds, for ManagerOptions.PoolMemory: a forked one
// (what MemAvailable lost per idle pandas session in the 2,000-session load
// test: 7.3-7.7 MiB, docs/sandbox.md), a cold one (~43 MiB once pandas is
// imported, BenchmarkIdleMemory). Stated, not measured at run time.
const (
	ForkedKernelMemory = 8 << 20
	ColdKernelMemory   = 48 << 20
)

// DefaultPoolMemory is ManagerOptions.PoolMemory's default: an eighth of
// the host's MemAvailable now.
func DefaultPoolMemory() int64 {
	if a := memAvailable(); a < 1<<62 {
		return a / 8
	}
	return 1 << 30
}

// poolWaiter is a create waiting for a pooled kernel: it receives one, or
// nil when the pool could not start one (it then starts its own).
type poolWaiter struct {
	ch chan *Session // buffered: the pool never blocks on a waiter
	at time.Time     // when it was served, under m.mu: handouts are in order
}

// fairPool is the manager's pool state beyond m.pool; m.mu guards it.
type fairPool struct {
	waiters   []*poolWaiter
	arrivals  int // creates that asked the pool, ever
	takes     []time.Time
	lastTake  time.Time
	startTime time.Duration // moving average of one pooled kernel's start
	// peaks are the largest bursts seen in the last PoolPeakHold, oldest
	// first, each larger than every later one: the first is the largest
	// (a sliding-window maximum). A burst is how many takes arrived within
	// poolRateWindow.
	peaks []poolPeak
}

type poolPeak struct {
	n  int
	at time.Time
}

// enqueueLocked adds a waiter at the end of the line; m.mu is held.
func (m *Manager) enqueueLocked() *poolWaiter {
	w := &poolWaiter{ch: make(chan *Session, 1)}
	m.fair.waiters = append(m.fair.waiters, w)
	return w
}

// awaitPooled waits for w's kernel. If ctx ends first, w leaves the line
// (a kernel handed to it meanwhile goes back to the pool).
func (m *Manager) awaitPooled(ctx context.Context, w *poolWaiter) (*Session, time.Time, error) {
	m.kick()
	select {
	case s := <-w.ch:
		return s, w.at, nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	for i, o := range m.fair.waiters {
		if o == w {
			m.fair.waiters = append(m.fair.waiters[:i:i], m.fair.waiters[i+1:]...)
			break
		}
	}
	m.mu.Unlock()
	select {
	case s := <-w.ch: // served while it left
		if s != nil {
			m.giveBack(s)
		}
	default:
	}
	return nil, time.Time{}, ctx.Err()
}

// giveBack returns an unused pooled kernel: to the first waiter, else to
// the pool.
func (m *Manager) giveBack(s *Session) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		s.Close() // (Close may be waiting already: not in the background)
		return
	}
	m.deliverLocked(s)
	m.mu.Unlock()
}

// deliverLocked hands s to the first waiter or puts it in the pool; m.mu
// is held.
func (m *Manager) deliverLocked(s *Session) {
	if len(m.fair.waiters) > 0 {
		w := m.fair.waiters[0]
		m.fair.waiters = m.fair.waiters[1:]
		w.at = time.Now()
		w.ch <- s
		return
	}
	m.pool = append(m.pool, s)
}

// tookLocked records a take from the pool (ready or waited for); m.mu is
// held.
func (m *Manager) tookLocked(now time.Time) {
	f := &m.fair
	f.arrivals++
	f.lastTake = now
	f.takes = append(f.takes, now)
	for len(f.takes) > 0 && now.Sub(f.takes[0]) > poolRateWindow {
		f.takes = f.takes[1:]
	}
	if m.opts.PoolPeakHold < 0 {
		return
	}
	// A burst as large as an earlier one renews its memory: the earlier
	// ones no larger are forgotten.
	n := len(f.takes)
	for len(f.peaks) > 0 && f.peaks[len(f.peaks)-1].n <= n {
		f.peaks = f.peaks[:len(f.peaks)-1]
	}
	f.peaks = append(f.peaks, poolPeak{n, now})
	m.peaksChangedLocked()
}

// peakLocked is the largest burst seen in the last PoolPeakHold (n 0 if
// none); m.mu is held.
func (m *Manager) peakLocked(now time.Time) poolPeak {
	f := &m.fair
	for len(f.peaks) > 0 && now.Sub(f.peaks[0].at) >= m.opts.PoolPeakHold {
		f.peaks = f.peaks[1:]
	}
	if len(f.peaks) == 0 {
		return poolPeak{}
	}
	return f.peaks[0]
}

// PoolTarget is how many kernels the pool keeps ready, and why.
type PoolTarget struct {
	N      int
	Reason string
}

// poolTargetLocked is how many kernels the pool should hold ready now;
// m.mu is held.
func (m *Manager) poolTargetLocked(now time.Time) PoolTarget { return m.poolTargetWhy(now, true) }

// poolTargetN is poolTargetLocked's N alone, without the reason's text:
// the pool's loop asks for it after every start and take, and formatting
// the reasons it never shows (four or five fmt.Sprintf and two
// time.Format) was ~1.5% of the host's CPU per session in issue 26's
// profile; m.mu is held.
func (m *Manager) poolTargetN(now time.Time) int { return m.poolTargetWhy(now, false).N }

// poolTargetWhy is poolTargetLocked; without why, Reason is left empty.
func (m *Manager) poolTargetWhy(now time.Time, why bool) PoolTarget {
	say := func(format string, args ...any) string {
		if !why {
			return ""
		}
		return fmt.Sprintf(format, args...)
	}
	switch {
	case m.opts.PoolSize == 0:
		return PoolTarget{0, say("no pool (--pool 0): every session starts on its own")}
	case m.opts.FixedPool:
		return PoolTarget{m.opts.PoolSize, say("the pool size (fixed pool)")}
	}
	n, want := m.rateWantLocked(now)
	reason := say("the arrival rate (%d creates in the last %v)", n, poolRateWindow)
	if p := m.peakLocked(now); p.n > 0 && p.n >= want {
		want = p.n
		if why {
			reason = fmt.Sprintf("the largest burst seen (%d creates within %v at %s, remembered until %s)",
				p.n, poolRateWindow, p.at.UTC().Format("15:04:05"), p.at.Add(m.opts.PoolPeakHold).UTC().Format("15:04:05"))
		}
	}
	if want <= m.opts.PoolSize {
		return PoolTarget{m.opts.PoolSize, say("the pool size (--pool)")}
	}
	if avail := recentMemAvailable(); avail < poolMinAvailable {
		return PoolTarget{m.opts.PoolSize, say("the pool size: the host has %d MiB of memory available, less than %d MiB", avail>>20, poolMinAvailable>>20)}
	}
	free := m.opts.MaxSessions - len(m.sessions)
	budget := m.poolMemoryKernels()
	caps := []poolCap{
		{m.opts.MaxPool, say("the pool's maximum (%d)", m.opts.MaxPool)},
		{free, say("the free session slots (%d of %d)", max(free, 0), m.opts.MaxSessions)},
		{budget, say("the memory budget (%d kernels of %d MiB in %d MiB)", budget, m.kernelMemory()>>20, m.opts.PoolMemory>>20)},
	}
	if c := slices.MinFunc(caps, func(a, b poolCap) int { return cmp.Compare(a.n, b.n) }); c.n < want {
		want = c.n
		if why {
			reason += ", capped by " + c.why
		}
	}
	if want < m.opts.PoolSize {
		return PoolTarget{m.opts.PoolSize, say("the pool size (--pool): %s", reason)}
	}
	return PoolTarget{want, reason}
}

// rateWantLocked is the arrival rate's demand on the pool: n takes in the
// last poolRateWindow, and twice the arrivals during one kernel's start
// (plus one); m.mu is held.
func (m *Manager) rateWantLocked(now time.Time) (n, want int) {
	for _, t := range m.fair.takes {
		if now.Sub(t) <= poolRateWindow {
			n++
		}
	}
	st := m.fair.startTime
	if st == 0 {
		st = 100 * time.Millisecond
	}
	return n, int(float64(n)/poolRateWindow.Seconds()*st.Seconds()*2) + 1
}

// poolCap is a bound on the pool's target.
type poolCap struct {
	n   int
	why string
}

// kernelMemory is what one ready kernel of this pool holds (stated).
func (m *Manager) kernelMemory() int64 {
	if m.opts.Zygote != nil {
		return ForkedKernelMemory
	}
	return ColdKernelMemory
}

// poolMemoryKernels is how many ready kernels PoolMemory holds.
func (m *Manager) poolMemoryKernels() int {
	if m.opts.PoolMemory < 0 {
		return math.MaxInt
	}
	return int(min(m.opts.PoolMemory/m.kernelMemory(), math.MaxInt32))
}

// PoolTarget reports how many kernels the pool keeps ready now, and why.
func (m *Manager) PoolTarget() PoolTarget {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poolTargetLocked(time.Now())
}

// memAvailableMaxAge is how old a MemAvailable reading poolTargetLocked
// uses may be. The pool's loop asks for its target after every start and
// take, under the manager's lock: at ~50 sessions a second, reading
// /proc/meminfo each time (the kernel formats some fifty counters for it)
// cost ~0.2 ms of CPU per session (issue 26's profile), and the guard it
// feeds (poolMinAvailable, a gigabyte) does not need a fresher figure.
const memAvailableMaxAge = 250 * time.Millisecond

// memReading is the last MemAvailable read for recentMemAvailable.
var memReading struct {
	sync.Mutex
	at    time.Time
	bytes int64
	reads int // how many times /proc/meminfo was read for it
}

// recentMemAvailable is memAvailable, read again only when the last
// reading is older than memAvailableMaxAge.
func recentMemAvailable() int64 {
	memReading.Lock()
	defer memReading.Unlock()
	if now := time.Now(); memReading.reads == 0 || now.Sub(memReading.at) >= memAvailableMaxAge {
		memReading.bytes, memReading.at = memAvailable(), now
		memReading.reads++
	}
	return memReading.bytes
}

// memAvailable is the host's MemAvailable in bytes, or a large number
// where it cannot be read.
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 1 << 62
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 1 << 62
}

// refillNow says whether the pool, below its target with nobody waiting,
// starts kernels now rather than RefillDelay after the last take: when the
// delay has passed (idle), or when fewer than half of low are ready or
// starting. low is the arrival rate's demand (twice the arrivals during one
// kernel's start: rateWantLocked), at least PoolSize and at most the
// target, so below half of it the pool would be empty before a kernel
// started now is ready; waiting for a pause in steady creates (one every
// few milliseconds never leaves RefillDelay free) would let it run dry and
// each create then wait for a whole start. It is not the target itself: a
// burst served from kernels kept for it (a remembered burst's) leaves the
// refill until after it, as before, and does not compete with it.
func refillNow(ready, running, low int, sinceTake, delay time.Duration) bool {
	return sinceTake >= delay || (!noLowWater.Load() && 2*(ready+running) < low)
}

// noLowWater, if set (by benchmarks: the baseline), refills a pool nobody
// waits for only RefillDelay after the last take, however low it is.
var noLowWater atomic.Bool

// poolLoopFair keeps the pool at its target: at once and in parallel
// while creates wait, one at a time RefillDelay after a take otherwise.
func (m *Manager) poolLoopFair() {
	defer m.wg.Done()
	type started struct {
		s   *Session
		err error
		d   time.Duration
	}
	done := make(chan started)
	running := 0
	backoff := time.Duration(0)
	var idle *time.Timer // the delayed refill, shrink or backoff: the earliest due
	var idleAt time.Time
	idleC := func() <-chan time.Time {
		if idle == nil {
			return nil
		}
		return idle.C
	}
	// arm makes the timer fire in d, unless it fires sooner already (a
	// shrink due in minutes must not hold up a refill due in 250 ms).
	arm := func(d time.Duration) {
		at := time.Now().Add(d)
		if idle != nil {
			if !idleAt.After(at) {
				return
			}
			idle.Stop()
		}
		idle, idleAt = time.NewTimer(d), at
	}
	idlePar := max(1, m.opts.PoolParallel/2) // kernels started at once while nobody waits
	for {
		delayedDue := false
		select {
		case <-m.stop:
			for ; running > 0; running-- {
				if r := <-done; r.s != nil {
					r.s.Close()
				}
			}
			return
		case <-m.refill:
		case <-idleC():
			idle = nil
			delayedDue = true
		case r := <-done:
			running--
			m.mu.Lock()
			if r.err != nil {
				m.log.Error("pool: start kernel", "err", r.err)
				backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
				// The waiters start their own rather than wait for the
				// backoff.
				for _, w := range m.fair.waiters {
					w.at = time.Now()
					w.ch <- nil
				}
				m.fair.waiters = nil
			} else {
				backoff = 0
				m.fair.startTime = (m.fair.startTime*3 + r.d) / 4
				if m.closed {
					m.closing.Add(1)
					go func() { defer m.closing.Done(); r.s.Close() }()
				} else {
					m.deliverLocked(r.s)
				}
			}
			m.mu.Unlock()
			if r.err != nil {
				arm(backoff)
			}
		}
		m.mu.Lock()
		now := time.Now()
		waiting := len(m.fair.waiters)
		target := m.poolTargetN(now)
		_, rate := m.rateWantLocked(now)
		low := min(max(rate, m.opts.PoolSize), target) // refillNow's mark
		missing := waiting + target - len(m.pool) - running
		var shrink []*Session
		if waiting == 0 && len(m.pool) > target && now.Sub(m.fair.lastTake) >= m.opts.PoolIdleShrink {
			shrink = append(shrink, m.pool[target:]...)
			m.pool = m.pool[:target]
			m.closing.Add(len(shrink)) // under mu, as closeSession's callers
			missing = 0
		}
		closed := m.closed
		ready := len(m.pool)
		sinceTake := now.Sub(m.fair.lastTake)
		recheck := m.shrinkRecheckLocked(now)
		m.mu.Unlock()
		for _, s := range shrink {
			go func() { defer m.closing.Done(); s.Close() }()
		}
		if closed {
			continue
		}
		var n int
		switch {
		case backoff > 0 && !delayedDue:
			// Failing: the waiters start their own; the pool waits for
			// the backoff timer.
			m.mu.Lock()
			for _, w := range m.fair.waiters {
				w.at = time.Now()
				w.ch <- nil
			}
			m.fair.waiters = nil
			m.mu.Unlock()
		case waiting > 0:
			n = min(missing, m.opts.PoolParallel-running)
		case missing > 0 && refillNow(ready, running, low, sinceTake, m.opts.RefillDelay):
			n = min(missing, idlePar-running) // nobody waits: fewer at once
		case missing > 0 && running == 0:
			arm(m.opts.RefillDelay - sinceTake)
		case missing <= 0 && running == 0 && recheck > 0:
			arm(recheck) // (after a shrink too: what it kept may go later)
		}
		for range max(n, 0) {
			running++
			go func() {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				o := m.sessionOptions(m.defaults, nil, jail.NetworkNone, nil, m.opts.ExecTimeout)
				o.EgressStandby = true // for a session in allow mode or in none mode
				deaths := m.keeperDeathsNow()
				s, err := New(ctx, o)
				cancel()
				if err == nil {
					s.deathsBefore = deaths
				}
				d := time.Since(t0)
				if err == nil && m.opts.PrepareCommands {
					m.prepareCommandPooled(s)
				}
				done <- started{s, err, d}
			}()
		}
	}
}

// prepareCommandPooled makes a join ahead for the first command of s, a
// pooled session (PrepareCommands), and waits until it is made, so that
// the session is pooled with it (handed out at once, its first command
// would still wait for it): not while creates wait, nor once one does
// (the join would take the CPU their kernels need, and delay them; the
// session goes to them, its join still being made).
func (m *Manager) prepareCommandPooled(s *Session) {
	if !m.CommandsRecent() {
		return
	}
	waiting := func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.fair.waiters) > 0
	}
	if waiting() {
		return
	}
	ready := s.prepareCommand()
	if ready == nil {
		return
	}
	give := time.NewTimer(time.Second)
	defer give.Stop()
	look := time.NewTicker(5 * time.Millisecond)
	defer look.Stop()
	for {
		select {
		case <-ready:
			return
		case <-give.C:
			return
		case <-look.C:
			if waiting() {
				return
			}
		}
	}
}

// CommandsRun tells the manager a session has started a command: pooled
// sessions make a join ahead (PrepareCommands) for PoolPeakHold after it.
func (m *Manager) CommandsRun() { m.commandsAt.Store(time.Now().UnixNano()) }

// CommandsRecent tells whether a session started a command within
// PoolPeakHold (CommandsRun).
func (m *Manager) CommandsRecent() bool {
	at := m.commandsAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < m.opts.PoolPeakHold
}

// shrinkRecheckLocked is when the pool should look again at kernels
// above its target that it keeps for now (0: none kept): when
// PoolIdleShrink has passed since the last take, when the arrival rate's
// window has, or when the remembered burst is forgotten. m.mu is held.
func (m *Manager) shrinkRecheckLocked(now time.Time) time.Duration {
	if len(m.pool) <= m.opts.PoolSize {
		return 0
	}
	since := now.Sub(m.fair.lastTake)
	var next time.Duration
	consider := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	consider(m.opts.PoolIdleShrink - since)
	consider(poolRateWindow - since + time.Millisecond)
	if p := m.peakLocked(now); p.n > 0 {
		consider(p.at.Add(m.opts.PoolPeakHold).Sub(now) + time.Millisecond)
	}
	return next
}

// defaultPoolParallel is PoolParallel's default: twice the CPUs, between 2
// and 8.
func defaultPoolParallel() int { return min(max(2*runtime.NumCPU(), 2), 8) }
