package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/host"
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
// sandboxes/s of each, and where the time went: the create's and the
// runCode's p50, the connections the SDK opened, and the CPU per sandbox
// of the client (the node process), of the server and of the processes
// under it (the zygote, the spares it forks to refill the pool, the
// kernels), with the machine's busy share over the burst.
//
// Then the client's floor, in the same run: the same node script, SDK and
// bursts against a Go server that answers the same bytes at once
// (e2bEcho: the server's side made free), twice, its repeated burst sent
// 5 s after the first (an agent framework's next round): with the
// Keep-Alive header sandloop's server sends (host.IdleKeep) and without
// it, when Node's HTTP client closes its idle connections after 4 s.
//
//	go test ./cmd/sandloop -run '^$' -bench E2BBurst100 -benchtime 1x
func BenchmarkE2BBurst100(b *testing.B) {
	e2btest.SDK(b)
	if !jail.Probe().Cgroups.OK {
		b.Skip("the zygote needs cgroups")
	}
	const burst = 100
	run := func(old bool) []burstStat {
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
		env.Vars = []string{fmt.Sprintf("SERVER_PID=%d", cmd.Process.Pid)}
		stats := runBurst(b, env, map[bool]int{true: 1, false: 2}[old], args...)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		return stats
	}
	floor := func(keepAlive bool) []burstStat {
		srv := e2bEcho(keepAlive)
		defer srv.Close()
		return runBurst(b, e2btest.Env{URL: srv.URL, Key: "e2b_00"}, 2, "burst", fmt.Sprint(burst), "repeat", "5000")
	}
	var oldP50, firstP50, againP50, againP95, floorP50 float64
	for b.Loop() {
		uptime := func() string {
			out, _ := exec.Command("uptime").Output()
			if _, load, ok := strings.Cut(strings.TrimSpace(string(out)), "load average: "); ok {
				return load
			}
			return "?"
		}
		b.Logf("load average before: %s", uptime())
		old := run(true)[0]
		cur := run(false)
		withKA := floor(true)
		withoutKA := floor(false)
		b.Logf("load average after: %s", uptime())
		for _, s := range []struct {
			name string
			burstStat
		}{
			{"old pipeline", old}, {"first burst (fresh server)", cur[0]}, {"repeated burst (pool sized by the first)", cur[1]},
			{"client floor, canned answers: first", withKA[0]}, {"client floor: repeated 5 s later, with Keep-Alive", withKA[1]},
			{"client floor: repeated 5 s later, without Keep-Alive", withoutKA[1]},
		} {
			b.Logf("%s: %s", s.name, s.String())
			if s.N != burst {
				b.Errorf("%s: %d of %d succeeded: %s", s.name, s.N, burst, s.FirstError)
			}
		}
		oldP50, firstP50, againP50, againP95, floorP50 = old.p50(), cur[0].p50(), cur[1].p50(), orNone(cur[1].P95), withKA[1].p50()
	}
	b.ReportMetric(oldP50, "old-p50-ms")
	b.ReportMetric(firstP50, "first-p50-ms")
	b.ReportMetric(againP50, "repeat-p50-ms")
	b.ReportMetric(againP95, "repeat-p95-ms")
	b.ReportMetric(oldP50/againP50, "repeat-p50-speedup")
	b.ReportMetric(floorP50, "client-floor-p50-ms")
}

// burstStat is one round of `node e2e.mjs burst`.
type burstStat struct {
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
	CreateP50  *float64 `json:"create_p50_ms"`
	RunP50     *float64 `json:"run_p50_ms"`
	Conns      int      `json:"connections"`
	ClientCPU  float64  `json:"client_cpu_ms"`
	ServerCPU  *float64 `json:"server_cpu_ms"`
	UnderCPU   *float64 `json:"sandboxes_cpu_ms"`
	Busy       *float64 `json:"machine_busy_pct"`
}

// orNone is *p, or -1 for a figure the script could not give.
func orNone(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func (s burstStat) p50() float64 { return orNone(s.P50) }

func (s burstStat) String() string {
	var w strings.Builder
	fmt.Fprintf(&w, "%d ok, p50 %.0f ms, p95 %.0f ms, last %.0f ms, %.1f sandboxes/s", s.N, orNone(s.P50), orNone(s.P95), orNone(s.Last), s.PerSecond)
	if s.Name == "repeated" {
		fmt.Fprintf(&w, ", sent %.1f s after the first's last answer", s.AfterMs/1000)
		if s.PoolTarget > 0 {
			fmt.Fprintf(&w, " (its pool at its target %d)", s.PoolTarget)
		}
	}
	fmt.Fprintf(&w, "; create p50 %.0f ms, runCode p50 %.0f ms; %d connections opened; CPU per sandbox: client %.1f ms", orNone(s.CreateP50), orNone(s.RunP50), s.Conns, s.ClientCPU/float64(max(s.N, 1)))
	if s.ServerCPU != nil && s.UnderCPU != nil {
		fmt.Fprintf(&w, ", server %.1f ms, its zygote/spares/kernels %.1f ms", *s.ServerCPU/float64(max(s.N, 1)), *s.UnderCPU/float64(max(s.N, 1)))
	}
	if s.Busy != nil {
		fmt.Fprintf(&w, "; machine busy %.0f%%", *s.Busy)
	}
	if s.Failures > 0 {
		fmt.Fprintf(&w, " (first error: %s)", s.FirstError)
	}
	return w.String()
}

// runBurst runs `node e2e.mjs args...` against env and returns its rounds.
func runBurst(b *testing.B, env e2btest.Env, rounds int, args ...string) []burstStat {
	out, err := e2btest.Run(b, env, 10*time.Minute, args...)
	var stats []burstStat
	if err != nil || json.Unmarshal(bytes.SplitN(out, []byte("\n"), 2)[0], &stats) != nil || len(stats) != rounds {
		b.Fatalf("node e2e.mjs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return stats
}

// e2bEcho is the E2B wire that `node e2e.mjs burst` uses, answered at once
// with the bytes sandloop's server sends (a created sandbox; the code
// interpreter's NDJSON lines for 1+1, the headers sent first and each line
// flushed, as e2b's execute does; 204 for a kill; a full pool), with
// sandloop's Keep-Alive header if keepAlive: the client's floor, the
// server's side made free. It runs no code: for the benchmark's baseline
// only.
func e2bEcho(keepAlive bool) *httptest.Server {
	id := func(n int) string {
		b := make([]byte, n)
		rand.Read(b)
		return hex.EncodeToString(b)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"templateID":"code-interpreter-v1","sandboxID":"%s","clientID":"sandloop","envdVersion":"0.5.7","envdAccessToken":"%s","trafficAccessToken":"%s","domain":"%s"}`,
			id(8), id(16), id(16), r.Host)
	})
	mux.HandleFunc("POST /execute", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		fl.Flush()
		for _, l := range []string{`{"is_main_result":true,"text":"2","type":"result"}`, `{"execution_count":1,"type":"number_of_executions"}`, `{"type":"end_of_execution"}`} {
			io.WriteString(w, l+"\n")
			fl.Flush()
		}
	})
	mux.HandleFunc("DELETE /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"pool_ready":2,"pool_target":2}`) })
	var h http.Handler = mux
	if keepAlive {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Keep-Alive", fmt.Sprintf("timeout=%d", int(host.IdleKeep/time.Second)))
			mux.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.IdleTimeout = host.IdleKeep
	srv.Start()
	return srv
}
