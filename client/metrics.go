package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Metrics are what a session uses, a sample of its cgroup every Interval
// over the last Window (GET /v1/sessions/{id}/metrics).
type Metrics struct {
	IntervalS        float64  `json:"interval_s"`
	WindowS          float64  `json:"window_s"`
	CPUs             float64  `json:"cpus"`
	MemoryLimitBytes int64    `json:"memory_limit_bytes"`
	DiskLimitBytes   int64    `json:"disk_limit_bytes"`
	Samples          []Sample `json:"samples"`
}

// Sample is one measurement of a session.
type Sample struct {
	Time time.Time `json:"time"`
	// CPUPercent is the CPU time since the sample before, in percent of
	// the session's CPUs.
	CPUPercent float64 `json:"cpu_percent"`
	// MemoryBytes is what its processes hold, page cache left out
	// (CacheBytes).
	MemoryBytes int64 `json:"memory_bytes"`
	CacheBytes  int64 `json:"cache_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
}

// Metrics returns the samples of session id taken after since (all that
// are kept, if since is zero). The server samples a session while someone
// asks: the first call returns one sample, and asking again every few
// seconds keeps it sampling. Where no cgroup measures sessions the error
// is an *APIError with Code "metrics_unavailable".
func (c *Client) Metrics(ctx context.Context, id string, since time.Time) (*Metrics, error) {
	var q url.Values
	if !since.IsZero() {
		q = url.Values{"since": {strconv.FormatFloat(float64(since.UnixMilli())/1000, 'f', 3, 64)}}
	}
	var m Metrics
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, "/metrics"), q, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}
