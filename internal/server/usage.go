package server

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
)

// A session's resources over time (GET /v1/sessions/{id}/metrics, the
// notebook's gauges): a sample of its cgroup every second, kept for the
// last UsageWindow. Sampling starts at a session's first request for it
// and stops UsageIdle after its last (or when the session ends), so a
// server does not read the cgroups of sessions nobody watches.
const (
	UsageInterval = time.Second
	UsageWindow   = 5 * time.Minute
	UsageIdle     = 2 * time.Minute
	// usageDiskEvery: the workspace's bytes are counted every 5th sample
	// (without a quota that is a walk of its files); the others repeat it.
	usageDiskEvery = 5
)

// usageSample is one measurement of a session.
type usageSample struct {
	Time time.Time `json:"time"`
	// CPUPercent is the CPU time used since the sample before, in percent
	// of the session's CPU quota (cpus: 100 means all of it).
	CPUPercent float64 `json:"cpu_percent"`
	// MemoryBytes is what the session's processes hold, page cache left
	// out; CacheBytes the page cache charged to it (its files' pages).
	MemoryBytes int64 `json:"memory_bytes"`
	CacheBytes  int64 `json:"cache_bytes"`
	// DiskBytes is what the workspace holds.
	DiskBytes int64 `json:"disk_bytes"`
}

// usageJSON is the answer of GET /v1/sessions/{id}/metrics.
type usageJSON struct {
	IntervalS        float64       `json:"interval_s"`
	WindowS          float64       `json:"window_s"`
	CPUs             float64       `json:"cpus"`
	MemoryLimitBytes int64         `json:"memory_limit_bytes"`
	DiskLimitBytes   int64         `json:"disk_limit_bytes"`
	Samples          []usageSample `json:"samples"`
}

// samplers are the sessions being sampled, by id.
type samplers struct {
	mu sync.Mutex
	m  map[string]*sampler
}

// sampler samples one session every UsageInterval from a goroutine of
// its own, which ends UsageIdle after the last ask or when the session ends.
type sampler struct {
	ms *session.Managed

	mu      sync.Mutex
	samples []usageSample
	asked   time.Time
	lastCPU time.Duration
	lastAt  time.Time
	disk    int64
	n       int
	err     error // why the session cannot be measured (no cgroup)
	stopped bool
}

// get returns ms's sampler, started if it was not running, marked asked.
func (ss *samplers) get(ms *session.Managed) *sampler {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[string]*sampler{}
	}
	sp := ss.m[ms.ID()]
	if sp == nil || sp.ms != ms {
		sp = &sampler{ms: ms}
		sp.asked = time.Now()
		sp.take(time.Now())
		ss.m[ms.ID()] = sp
		if sp.err == nil {
			go ss.run(sp)
		}
		return sp
	}
	sp.mu.Lock()
	sp.asked = time.Now()
	sp.mu.Unlock()
	return sp
}

func (ss *samplers) run(sp *sampler) {
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
		sp.mu.Unlock()
		if idle || !sp.take(now) {
			return
		}
	}
}

// take adds a sample of now; false once the session cannot be measured
// (closed, or no cgroup).
func (sp *sampler) take(now time.Time) bool {
	u, err := sp.ms.Resources()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err != nil {
		sp.err, sp.stopped = err, true
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
		cpus := sp.ms.Limits.CPUs
		if cpus <= 0 {
			cpus = 1
		}
		if wall := now.Sub(sp.lastAt); wall > 0 && u.CPU >= sp.lastCPU {
			pct = 100 * float64(u.CPU-sp.lastCPU) / float64(wall) / cpus
		}
	}
	sp.lastCPU, sp.lastAt = u.CPU, now
	sp.samples = append(sp.samples, usageSample{Time: now.UTC().Truncate(time.Millisecond), CPUPercent: math.Round(pct*10) / 10,
		MemoryBytes: max(u.Memory-u.Cache, 0), CacheBytes: u.Cache, DiskBytes: sp.disk})
	if keep := int(UsageWindow / UsageInterval); len(sp.samples) > keep {
		sp.samples = append(sp.samples[:0:0], sp.samples[len(sp.samples)-keep:]...)
	}
	return true
}

// sessionMetrics answers GET /v1/sessions/{id}/metrics[?since=UNIX_SECONDS]:
// the samples of the window (those after since), sampling started if it
// was not.
func (s *Server) sessionMetrics(w http.ResponseWriter, r *http.Request) {
	// Not lookup: watching a session's gauges is not using it (its idle
	// time runs on, so a tab left open does not keep it forever).
	ms, err := s.opts.Manager.Get(owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			writeError(w, badRequest("since %q: a time in Unix seconds (e.g. the last sample's)", v))
			return
		}
		since = time.UnixMilli(int64(math.Round(f * 1000))) // samples are kept to the millisecond
	}
	sp := s.usage.get(ms)
	sp.mu.Lock()
	err = sp.err
	out := usageJSON{IntervalS: UsageInterval.Seconds(), WindowS: UsageWindow.Seconds(), CPUs: ms.Limits.CPUs,
		MemoryLimitBytes: ms.Limits.Memory, DiskLimitBytes: ms.Quota().Disk, Samples: []usageSample{}}
	for _, m := range sp.samples {
		if m.Time.After(since) {
			out.Samples = append(out.Samples, m)
		}
	}
	sp.mu.Unlock()
	if len(out.Samples) == 0 && err != nil {
		if errors.Is(err, jail.ErrNoGroup) {
			writeError(w, &apiError{http.StatusNotImplemented, "metrics_unavailable", "this server measures a session by its cgroup, and here limits are rlimits: no metrics (`sandloop doctor` says why)", 0})
			return
		}
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, out)
}
