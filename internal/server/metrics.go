package server

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

type metrics struct {
	created    prometheus.Counter
	executions *prometheus.CounterVec
	latency    prometheus.Histogram
	ooms       prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, m *session.Manager) *metrics {
	x := &metrics{
		created: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandloop_sessions_created_total", Help: "Sessions created."}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandloop_executions_total", Help: "Executions by final status."},
			[]string{"status"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sandloop_execution_seconds", Help: "Wall-clock time of executions, as served.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		ooms: prometheus.NewCounter(prometheus.CounterOpts{Name: "sandloop_oom_kills_total", Help: "Executions ended by the out-of-memory killer."}),
	}
	reg.MustRegister(x.created, x.executions, x.latency, x.ooms,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_sessions", Help: "Sessions held."},
			func() float64 { return float64(m.Stats().Sessions) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_sessions_paused", Help: "Sessions held paused (no CPU, no slot)."},
			func() float64 { return float64(m.Stats().Paused) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_pool_ready", Help: "Kernels started ahead, waiting in the pool."},
			func() float64 { return float64(m.Stats().PoolReady) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_pool_target", Help: "Kernels the pool keeps ready now (the pool size, the arrival rate or the largest burst remembered; /healthz says which)."},
			func() float64 { return float64(m.Stats().PoolTarget) }),
		// The autoscaler's signal (deploy/helm: HPA on this per-pod metric).
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_session_slots_used_ratio", Help: "Running sessions (paused ones take no slot) over --max-sessions."},
			func() float64 { st := m.Stats(); return float64(st.Busy()) / float64(max(st.MaxSessions, 1)) }),
	)
	return x
}

func (x *metrics) observe(res *kernel.Result, d time.Duration) {
	x.executions.WithLabelValues(string(res.Status)).Inc()
	x.latency.Observe(d.Seconds())
	if res.Status == kernel.StatusKilled && res.Error != nil && containsOOM(res.Error.Value+res.Error.Traceback) {
		x.ooms.Inc()
	}
}

// containsOOM recognises the reason the session gives for an OOM kill.
func containsOOM(s string) bool { return strings.Contains(s, "out-of-memory") }
