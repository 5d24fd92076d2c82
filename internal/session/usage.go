package session

import (
	"math"
	"sync"
	"time"
)

// A session's resources over time: a sample of its cgroup every
// UsageInterval, kept for the last UsageWindow. Both faces read the same
// sampler (Manager.Sampler): the native GET /v1/sessions/{id}/metrics and
// the notebook's gauges, and E2B's getMetrics. Sampling starts at the first
// ask for a session and stops UsageIdle after the last one (or when the
// session ends), so a server does not read the cgroups of sessions nobody
// watches.
const (
	UsageInterval = time.Second
	UsageWindow   = 5 * time.Minute
	UsageIdle     = 2 * time.Minute
	// usageDiskEvery: the workspace's bytes are counted every 5th sample
	// (without a quota that is a walk of its files); the others repeat it.
	usageDiskEvery = 5
)

// UsageSample is one measurement of a session.
type UsageSample struct {
	Time time.Time `json:"time"`
	// CPUPercent is the CPU time used since the sample before, in percent
	// of the session's CPU quota (Limits.CPUs, or one CPU: 100 means all of it).
	CPUPercent float64 `json:"cpu_percent"`
	// MemoryBytes is what the session's processes hold, page cache left
	// out; CacheBytes the page cache charged to it (its files' pages).
	MemoryBytes int64 `json:"memory_bytes"`
	CacheBytes  int64 `json:"cache_bytes"`
	// DiskBytes is what the workspace holds.
	DiskBytes int64 `json:"disk_bytes"`
}

// samplers are a manager's sessions being sampled, by id.
type samplers struct {
	mu sync.Mutex
	m  map[string]*Sampler
}

// Sampler samples one session every UsageInterval from a goroutine of
// its own, which ends UsageIdle after the last ask or when the session ends.
type Sampler struct {
	ms *Managed

	mu      sync.Mutex
	samples []UsageSample
	asked   time.Time
	lastCPU time.Duration
	lastAt  time.Time
	disk    int64
	n       int
	err     error // why the session cannot be measured (closed, paused, no cgroup)
	stopped bool
	// stoppedAt is when it stopped: a sampler that cannot measure its
	// session is tried again at most once per UsageInterval.
	stoppedAt time.Time
}

// Sampler returns ms's sampler, marked asked: started (with a first sample
// taken) if none was running, or if the one that ran has stopped (the
// session was paused and resumed, say) at least UsageInterval ago.
func (m *Manager) Sampler(ms *Managed) *Sampler {
	ss := &m.usage
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[string]*Sampler{}
	}
	sp := ss.m[ms.ID()]
	if sp != nil && sp.ms == ms {
		sp.mu.Lock()
		sp.asked = time.Now()
		retry := sp.stopped && time.Since(sp.stoppedAt) >= UsageInterval
		sp.mu.Unlock()
		if !retry {
			return sp
		}
	}
	sp = &Sampler{ms: ms, asked: time.Now()}
	sp.take(time.Now())
	ss.m[ms.ID()] = sp
	if sp.err == nil {
		go ss.run(sp)
	}
	return sp
}

func (ss *samplers) run(sp *Sampler) {
	t := time.NewTicker(UsageInterval)
	defer t.Stop()
	defer func() {
		ss.mu.Lock()
		if ss.m[sp.ms.ID()] == sp {
			delete(ss.m, sp.ms.ID())
		}
		ss.mu.Unlock()
	}()
	for now := range t.C {
		sp.mu.Lock()
		idle := now.Sub(sp.asked) > UsageIdle
		if idle {
			sp.stopped, sp.stoppedAt = true, now
		}
		sp.mu.Unlock()
		if idle || !sp.take(now) {
			return
		}
	}
}

// take adds a sample of now; false once the session cannot be measured
// (closed, or no cgroup).
func (sp *Sampler) take(now time.Time) bool {
	u, err := sp.ms.Resources()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err != nil {
		sp.err, sp.stopped, sp.stoppedAt = err, true, now
		return false
	}
	if sp.n%usageDiskEvery == 0 {
		if d, err := sp.ms.Usage(); err == nil {
			sp.disk = d.Bytes
		}
	}
	sp.n++
	pct := 0.0
	if !sp.lastAt.IsZero() {
		if wall := now.Sub(sp.lastAt); wall > 0 && u.CPU >= sp.lastCPU {
			pct = 100 * float64(u.CPU-sp.lastCPU) / float64(wall) / sp.CPUs()
		}
	}
	sp.lastCPU, sp.lastAt = u.CPU, now
	sp.samples = append(sp.samples, UsageSample{Time: now.UTC().Truncate(time.Millisecond), CPUPercent: math.Round(pct*10) / 10,
		MemoryBytes: max(u.Memory-u.Cache, 0), CacheBytes: u.Cache, DiskBytes: sp.disk})
	if keep := int(UsageWindow / UsageInterval); len(sp.samples) > keep {
		sp.samples = append(sp.samples[:0:0], sp.samples[len(sp.samples)-keep:]...)
	}
	return true
}

// CPUs is what CPUPercent is a percent of: the session's CPU quota, or
// one CPU without one.
func (sp *Sampler) CPUs() float64 {
	if c := sp.ms.Limits.CPUs; c > 0 {
		return c
	}
	return 1
}

// Since returns the samples kept that were taken after since (all of them
// for the zero time), oldest first, and why sampling stopped, if it has
// (jail.ErrNoGroup where no cgroup measures the session).
func (sp *Sampler) Since(since time.Time) ([]UsageSample, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	out := []UsageSample{}
	for _, m := range sp.samples {
		if m.Time.After(since) {
			out = append(out, m)
		}
	}
	return out, sp.err
}
