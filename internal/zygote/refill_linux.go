package zygote

import (
	"sync"
	"time"
)

// refill decides when the template is asked for spares (Options.Fixed
// off). While forks wait it asks at once for as many as wait, with at most
// Options.Parallel spares in the making; the rest of the target follows
// RefillDelay later (the delay applies only to what nobody waits for). The target (how many spares
// are kept ready) follows the recent arrival rate: enough to cover the
// arrivals during one spare's making, between Options.Spares and
// Options.MaxSpares; it falls back to Options.Spares after IdleShrink
// without a take, and the spares above it are then destroyed.
type refill struct {
	inst *instance
	opts *Options

	mu       sync.Mutex
	making   int         // asked of the template, not yet offered
	asked    []time.Time // when each of those was asked, oldest first
	waiters  int         // forks waiting for a spare
	takes    []time.Time // recent takes (the last rateWindow)
	makeTime time.Duration
	lastTake time.Time
	timer    *time.Timer // the idle refill or shrink, if one is due
}

// rateWindow is how far back takes count for the arrival rate.
const rateWindow = 2 * time.Second

// IdleShrink is how long without a take before the spares shrink back to
// Options.Spares.
const IdleShrink = 10 * time.Second

func newRefill(inst *instance, opts *Options) *refill {
	// The template makes Options.Spares at start without being asked.
	now := time.Now()
	r := &refill{inst: inst, opts: opts, making: opts.Spares, makeTime: 100 * time.Millisecond}
	for range opts.Spares {
		r.asked = append(r.asked, now)
	}
	return r
}

// target is how many spares to keep ready now; r.mu is held.
func (r *refill) targetLocked(now time.Time) int {
	n := 0
	for _, t := range r.takes {
		if now.Sub(t) <= rateWindow {
			n++
		}
	}
	rate := float64(n) / rateWindow.Seconds()
	want := int(rate*r.makeTime.Seconds()*2) + 1 // twice the arrivals during one making
	return min(max(want, r.opts.Spares), r.opts.MaxSpares)
}

// took records a take (the spare was ready, or a waiter got it).
func (r *refill) took() {
	r.mu.Lock()
	now := time.Now()
	r.lastTake = now
	r.takes = append(r.takes, now)
	for len(r.takes) > 0 && now.Sub(r.takes[0]) > rateWindow {
		r.takes = r.takes[1:]
	}
	r.mu.Unlock()
	r.kick()
}

// wait and unwait count a fork that found no spare ready.
func (r *refill) wait() {
	r.mu.Lock()
	r.waiters++
	r.mu.Unlock()
	r.kick()
}

func (r *refill) unwait() { r.mu.Lock(); r.waiters--; r.mu.Unlock() }

// offered records a spare (or an error) the template delivered, to a
// waiter or to the ready queue.
func (r *refill) offered() {
	r.mu.Lock()
	now := time.Now()
	if r.making > 0 {
		r.making--
	}
	if len(r.asked) > 0 {
		d := now.Sub(r.asked[0])
		r.asked = r.asked[1:]
		r.makeTime = (r.makeTime*3 + d) / 4
	}
	r.mu.Unlock()
	r.kick()
}

// kick asks the template for what is missing: at once while forks wait,
// after RefillDelay otherwise.
func (r *refill) kick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	target := r.targetLocked(now)
	missing := r.waiters + target - len(r.inst.spares) - r.making
	// For the forks that wait, at once; for the target, once idle.
	urgent := r.waiters - len(r.inst.spares) - r.making
	if r.opts.RefillDelay < 0 {
		urgent = missing
	}
	if n := min(urgent, r.opts.Parallel-r.making); n > 0 {
		r.askLocked(n, now)
		return
	}
	if r.timer != nil {
		return
	}
	switch {
	case missing > 0:
		r.timer = time.AfterFunc(r.opts.RefillDelay, r.idle)
	case len(r.inst.spares) > r.opts.Spares:
		// Shrink later if nothing is taken meanwhile.
		r.timer = time.AfterFunc(IdleShrink, r.idle)
	}
}

// idle runs when the idle delay has passed: it refills to the target, or
// shrinks the ready spares to Options.Spares after IdleShrink without a
// take.
func (r *refill) idle() {
	r.mu.Lock()
	r.timer = nil
	now := time.Now()
	target := r.targetLocked(now)
	if n := min(r.waiters+target-len(r.inst.spares)-r.making, r.opts.Parallel-r.making); n > 0 {
		r.askLocked(n, now)
		r.mu.Unlock()
		return
	}
	var extra int
	if now.Sub(r.lastTake) >= IdleShrink && r.waiters == 0 {
		extra = len(r.inst.spares) - r.opts.Spares
	}
	r.mu.Unlock()
	for range max(extra, 0) {
		select {
		case s := <-r.inst.spares:
			if s.sp != nil {
				s.sp.destroy()
			}
		default:
		}
	}
	r.kick()
}

// askLocked asks the template for n spares; r.mu is held.
func (r *refill) askLocked(n int, now time.Time) {
	r.inst.moreMu.Lock()
	defer r.inst.moreMu.Unlock()
	for range n {
		if _, err := r.inst.ctl.Write([]byte("more")); err != nil {
			return // the template died: current starts another
		}
		r.making++
		r.asked = append(r.asked, now)
	}
}

// stop cancels a due timer.
func (r *refill) stop() {
	r.mu.Lock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.mu.Unlock()
}
