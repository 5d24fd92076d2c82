package session

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// The pool (ManagerOptions.FixedPool off) sizes itself and serves a burst
// in arrival order:
//   - a create that finds the pool empty joins a queue of waiters (one per
//     reserved session slot, so at most MaxSessions) and gets the next
//     pooled kernel, first come first served; its ctx ends its wait;
//   - while anyone waits, poolLoop starts up to PoolParallel kernels at
//     once, with no delay; when nobody waits it starts one at a time,
//     RefillDelay after a take;
//   - the pool's target follows the arrival rate (takes in the last
//     poolRateWindow): twice the arrivals during one kernel's start,
//     between PoolSize and MaxPool, and no more while the host has less
//     than poolMinAvailable of memory; after poolIdleShrink without a
//     take the kernels above PoolSize are closed.

const (
	poolRateWindow   = 2 * time.Second
	poolIdleShrink   = 30 * time.Second
	poolMinAvailable = 1 << 30 // bytes of MemAvailable below which the pool does not grow past PoolSize
)

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
	m.fair.arrivals++
	m.fair.lastTake = now
	m.fair.takes = append(m.fair.takes, now)
	for len(m.fair.takes) > 0 && now.Sub(m.fair.takes[0]) > poolRateWindow {
		m.fair.takes = m.fair.takes[1:]
	}
}

// poolTargetLocked is how many kernels the pool should hold ready now;
// m.mu is held.
func (m *Manager) poolTargetLocked(now time.Time) int {
	n := 0
	for _, t := range m.fair.takes {
		if now.Sub(t) <= poolRateWindow {
			n++
		}
	}
	st := m.fair.startTime
	if st == 0 {
		st = 100 * time.Millisecond
	}
	want := int(float64(n)/poolRateWindow.Seconds()*st.Seconds()*2) + 1
	if want > m.opts.PoolSize && memAvailable() < poolMinAvailable {
		want = m.opts.PoolSize
	}
	free := m.opts.MaxSessions - len(m.sessions)
	return max(min(want, m.opts.MaxPool, free), m.opts.PoolSize)
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
	var idle *time.Timer // the delayed refill or shrink
	idleC := func() <-chan time.Time {
		if idle == nil {
			return nil
		}
		return idle.C
	}
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
			if r.err != nil && idle == nil {
				idle = time.NewTimer(backoff)
			}
		}
		m.mu.Lock()
		now := time.Now()
		waiting := len(m.fair.waiters)
		target := m.poolTargetLocked(now)
		missing := waiting + target - len(m.pool) - running
		var shrink []*Session
		if waiting == 0 && len(m.pool) > m.opts.PoolSize && now.Sub(m.fair.lastTake) >= poolIdleShrink {
			shrink = append(shrink, m.pool[m.opts.PoolSize:]...)
			m.pool = m.pool[:m.opts.PoolSize]
			m.closing.Add(len(shrink)) // under mu, as closeSession's callers
			missing = 0
		}
		closed := m.closed
		sinceTake := now.Sub(m.fair.lastTake)
		pooled := len(m.pool)
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
		case missing > 0 && running == 0 && (delayedDue || sinceTake >= m.opts.RefillDelay):
			n = 1 // idle: one at a time
		case missing > 0 && running == 0 && idle == nil:
			idle = time.NewTimer(m.opts.RefillDelay - sinceTake)
		case missing <= 0 && running == 0 && idle == nil && pooled > m.opts.PoolSize:
			idle = time.NewTimer(poolIdleShrink)
		}
		for range max(n, 0) {
			running++
			go func() {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				o := m.sessionOptions(m.defaults, nil, jail.NetworkNone, nil, m.opts.ExecTimeout)
				o.EgressStandby = true // for a session in allow mode or in none mode
				s, err := New(ctx, o)
				cancel()
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

// defaultPoolParallel is PoolParallel's default: twice the CPUs, between 2
// and 8.
func defaultPoolParallel() int { return min(max(2*runtime.NumCPU(), 2), 8) }
