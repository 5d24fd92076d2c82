package server

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
)

// A session's resources over time (GET /v1/sessions/{id}/metrics, the
// notebook's gauges): the manager's sampler of the session, which E2B's
// getMetrics reads too (session/usage.go).
const (
	UsageInterval = session.UsageInterval
	UsageWindow   = session.UsageWindow
	UsageIdle     = session.UsageIdle
)

// usageSample is one measurement of a session.
type usageSample = session.UsageSample

// usageJSON is the answer of GET /v1/sessions/{id}/metrics.
type usageJSON struct {
	IntervalS        float64       `json:"interval_s"`
	WindowS          float64       `json:"window_s"`
	CPUs             float64       `json:"cpus"`
	MemoryLimitBytes int64         `json:"memory_limit_bytes"`
	DiskLimitBytes   int64         `json:"disk_limit_bytes"`
	Samples          []usageSample `json:"samples"`
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
	samples, err := s.opts.Manager.Sampler(ms).Since(since)
	out := usageJSON{IntervalS: UsageInterval.Seconds(), WindowS: UsageWindow.Seconds(), CPUs: ms.Limits.CPUs,
		MemoryLimitBytes: ms.Limits.Memory, DiskLimitBytes: ms.Quota().Disk, Samples: samples}
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
