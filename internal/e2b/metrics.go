package e2b

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// metricJSON is one sample of E2B's getMetrics: what the sandbox's jail
// uses (its kernel, its commands and everything they started).
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"` // RFC 3339: the SDK does new Date(timestamp)
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`   // as getInfo's cpuCount
	CPUUsedPct    float64   `json:"cpuUsedPct"` // of CPUCount cores, since the sample before
	MemUsed       int64     `json:"memUsed"`    // bytes, page cache left out
	MemTotal      int64     `json:"memTotal"`   // the memory limit, as getInfo's memoryMB
	MemCache      int64     `json:"memCache"`   // page cache (the workspace's files included)
	DiskUsed      int64     `json:"diskUsed"`   // the workspace's bytes
	DiskTotal     int64     `json:"diskTotal"`  // as getInfo's diskSizeMB
}

// metrics answers GET /sandboxes/{id}/metrics?start=&end= (Unix seconds):
// the samples in that window of the sandbox's session sampler, the one the
// native GET /v1/sessions/{id}/metrics reads (a sample a second over the
// last session.UsageWindow; sandboxes keep theirs running, see sampleAll).
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, owner string) {
	sb := h.owned(w, owner, r.PathValue("id"))
	if sb == nil {
		return
	}
	var bounds [2]int64
	for i, name := range []string{"start", "end"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeControlError(w, http.StatusBadRequest, name+" must be a time in Unix seconds")
			return
		}
		bounds[i] = n
	}
	if bounds[1] != 0 && bounds[1] < bounds[0] {
		writeControlError(w, http.StatusBadRequest, "end is before start")
		return
	}
	sp := h.opts.Manager.Sampler(sb.ms)
	samples, err := sp.Since(time.Time{})
	if len(samples) == 0 && errors.Is(err, jail.ErrNoGroup) {
		writeControlError(w, http.StatusNotImplemented, "metrics need cgroups on this host: sandloop measures a sandbox by its cgroup, and here limits are rlimits (`sandloop doctor` says why)")
		return
	}
	info := h.infoOf(sb)
	// The SDK rounds the bounds to the nearest second, and a sample is up
	// to a second old (two, if a loaded host skipped a tick): two seconds
	// of slack before start keep the last sample in a window asked for
	// from "now", one after end a sample taken at 12.4 s in one up to 12.
	from, to := time.Unix(bounds[0], 0).Add(-2*time.Second), time.Unix(bounds[1], 0).Add(time.Second)
	out := make([]metricJSON, 0, len(samples))
	for _, u := range samples {
		if !u.Time.After(from) || (bounds[1] != 0 && !u.Time.Before(to)) {
			continue
		}
		// The sampler's CPU share is of the session's quota, E2B's of cpuCount cores.
		pct := math.Min(100, u.CPUPercent*sp.CPUs()/float64(info.CPUCount))
		out = append(out, metricJSON{
			Timestamp: u.Time, TimestampUnix: u.Time.Unix(),
			CPUCount: info.CPUCount, CPUUsedPct: math.Round(pct*100) / 100,
			MemUsed: u.MemoryBytes, MemTotal: info.MemoryMB << 20, MemCache: u.CacheBytes,
			DiskUsed: u.DiskBytes, DiskTotal: info.DiskSizeMB << 20,
		})
	}
	writeJSON(w, http.StatusOK, out)
}
