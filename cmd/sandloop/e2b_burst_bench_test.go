package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkE2BBurst100 is BenchmarkBurst100 (client) through E2B's own
// code-interpreter SDK (npm, unchanged): 100 × (Sandbox.create() +
// runCode('1+1')) at once against `sandloop serve --zygote --max-sessions
// 128`. Each iteration measures, in turn in the same run, the pipeline
// before issue 26 (--old-pipeline) on a fresh server ("old pipeline"), the
// current one on a fresh server ("first burst": a pool of 2, the rest
// forked on demand), and a second burst on that server once the first's
// sandboxes are killed and its warm pool holds the target the first set it
// ("repeated burst": the largest burst remembered); each server is stopped
// before the next starts. It prints p50, p95, the last answer and
// sandboxes/s of each.
//
//	go test ./cmd/sandloop -run '^$' -bench E2BBurst100 -benchtime 1x
func BenchmarkE2BBurst100(b *testing.B) {
	e2btest.SDK(b)
	if !jail.Probe().Cgroups.OK {
		b.Skip("the zygote needs cgroups")
	}
	const burst = 100
	type stat struct {
		Name       string   `json:"name"`
		N          int      `json:"n"`
		Failures   int      `json:"failures"`
		FirstError string   `json:"first_error"`
		P50        *float64 `json:"p50_ms"`
		P95        *float64 `json:"p95_ms"`
		Last       *float64 `json:"last_ms"`
		PerSecond  float64  `json:"per_second"`
		AfterMs    float64  `json:"after_ms"`
		PoolTarget int      `json:"pool_target"`
	}
	run := func(old bool) []stat {
		args := []string{"--token", e2bTestToken, "--zygote", "--max-sessions", fmt.Sprint(burst + 28)}
		if old {
			args = append(args, "--old-pipeline")
		}
		cmd, env, _ := startServeCmd(b, args...)
		testutil.WaitFor(b, time.Minute, func() error {
			var h struct {
				PoolReady int `json:"pool_ready"`
			}
			r, err := http.Get(env.URL + "/healthz")
			if err != nil {
				return err
			}
			defer r.Body.Close()
			if err := json.NewDecoder(r.Body).Decode(&h); err != nil || h.PoolReady < 2 {
				return fmt.Errorf("the pool is not full: %+v %v", h, err)
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // the zygote's spare too
		args = []string{"burst", fmt.Sprint(burst)}
		if old {
			args = append(args, "once") // its repeat would be the same pipeline again
		}
		out, err := e2btest.Run(b, env, 10*time.Minute, args...)
		var stats []stat
		if err != nil || json.Unmarshal(bytes.SplitN(out, []byte("\n"), 2)[0], &stats) != nil || len(stats) != map[bool]int{true: 1, false: 2}[old] {
			b.Fatalf("node e2e.mjs burst: %v\n%s", err, out)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		return stats
	}
	f := func(p *float64) float64 {
		if p == nil {
			return -1
		}
		return *p
	}
	var oldP50, firstP50, againP50, againP95 float64
	for b.Loop() {
		old := run(true)[0]
		cur := run(false)
		for _, s := range []struct {
			name string
			stat
		}{{"old pipeline", old}, {"first burst (fresh server)", cur[0]}, {"repeated burst (pool sized by the first)", cur[1]}} {
			var after string
			if s.Name == "repeated" {
				after = fmt.Sprintf(", sent %.1f s after the first's last answer (its pool at its target %d)", s.AfterMs/1000, s.PoolTarget)
			}
			b.Logf("%s: %d/%d ok, p50 %.0f ms, p95 %.0f ms, last %.0f ms, %.1f sandboxes/s%s%s", s.name, s.N, burst,
				f(s.P50), f(s.P95), f(s.Last), s.PerSecond, after, map[bool]string{true: " (first error: " + s.FirstError + ")"}[s.Failures > 0])
			if s.N != burst {
				b.Errorf("%s: %d of %d succeeded: %s", s.name, s.N, burst, s.FirstError)
			}
		}
		oldP50, firstP50, againP50, againP95 = f(old.P50), f(cur[0].P50), f(cur[1].P50), f(cur[1].P95)
	}
	b.ReportMetric(oldP50, "old-p50-ms")
	b.ReportMetric(firstP50, "first-p50-ms")
	b.ReportMetric(againP50, "repeat-p50-ms")
	b.ReportMetric(againP95, "repeat-p95-ms")
	b.ReportMetric(oldP50/againP50, "repeat-p50-speedup")
}
