//go:build linux

package kernel

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkExecuteHost measures the protocol without the jail: 1+1 in a
// kernel run by the host's Python. The jailed figure is in internal/session.
func BenchmarkExecuteHost(b *testing.B) {
	k := startHost(b, nil, nil)
	ctx := context.Background()
	var d []time.Duration
	var kd []float64
	for b.Loop() {
		t0 := time.Now()
		r, err := k.Execute(ctx, Request{Code: "1+1"}, nil)
		if err != nil || r.Status != StatusOK {
			b.Fatal(err, r)
		}
		d = append(d, time.Since(t0))
		kd = append(kd, r.DurationMS)
	}
	slices.Sort(d)
	slices.Sort(kd)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1e3, "median-µs")
	b.ReportMetric(kd[len(kd)/2]*1e3, "kernel-median-µs")
}
