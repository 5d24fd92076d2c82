package e2b

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// metricJSON is one sample of E2B's getMetrics: what the sandbox's kernel
// and everything it started use (commands run in jails of their own today,
// and are not counted).
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

// maxSamples is how many samples are kept per sandbox: 30 minutes at the
// default Options.SampleInterval.
const maxSamples = 360

// sample measures sb now and keeps the sample, unless the last one is
// younger than every (then that one stands). It returns false where nothing
// measures the sandbox (no cgroup: limits are rlimits there).
func (h *Handler) sample(sb *sandbox, now time.Time, every time.Duration) bool {
	info := h.infoOf(sb)
	sb.mu.Lock()
	if n := len(sb.samples); n > 0 && now.Sub(sb.samples[n-1].Timestamp) < every {
		sb.mu.Unlock()
		return true
	}
	sb.mu.Unlock()
	u, err := sb.ms.Resources()
	if err != nil {
		return false
	}
	disk, _ := sb.ms.Usage()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	since, cpuBefore := sb.started, time.Duration(0)
	if sb.lastCPUAt.After(since) {
		since, cpuBefore = sb.lastCPUAt, sb.lastCPU
	}
	pct := 0.0
	if wall := now.Sub(since); wall > 0 && u.CPU >= cpuBefore {
		pct = math.Min(100, 100*float64(u.CPU-cpuBefore)/float64(wall)/float64(info.CPUCount))
	}
	sb.lastCPU, sb.lastCPUAt = u.CPU, now
	m := metricJSON{
		Timestamp: now.UTC().Truncate(time.Millisecond), TimestampUnix: now.Unix(),
		CPUCount: info.CPUCount, CPUUsedPct: math.Round(pct*100) / 100,
		MemUsed: max(u.Memory-u.Cache, 0), MemTotal: info.MemoryMB << 20, MemCache: u.Cache,
		DiskUsed: disk.Bytes, DiskTotal: info.DiskSizeMB << 20,
	}
	sb.samples = append(sb.samples, m)
	if len(sb.samples) > maxSamples {
		sb.samples = sb.samples[len(sb.samples)-maxSamples:]
	}
	return true
}

// metrics answers GET /sandboxes/{id}/metrics?start=&end= (Unix seconds):
// the samples kept in that window, a fresh one taken first.
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
	// A sample of now, unless one was taken a moment ago.
	if !h.sample(sb, time.Now(), 100*time.Millisecond) {
		writeControlError(w, http.StatusNotImplemented, "metrics need cgroups on this host: sandloop measures a sandbox by its cgroup, and here limits are rlimits (`sandloop doctor` says why)")
		return
	}
	// The SDK rounds the bounds to whole seconds: a second of slack each way
	// keeps a sample taken at 12.6 s in a window asked for from "now".
	from, to := time.Unix(bounds[0], 0).Add(-time.Second), time.Unix(bounds[1], 0).Add(time.Second)
	sb.mu.Lock()
	out := make([]metricJSON, 0, len(sb.samples))
	for _, m := range sb.samples {
		if m.Timestamp.After(from) && (bounds[1] == 0 || m.Timestamp.Before(to)) {
			out = append(out, m)
		}
	}
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
