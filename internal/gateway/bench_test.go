package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkGatewayExecute: `execute 1+1` on one session, alternately
// straight to its host and through the gateway, in the same run; reports
// both medians and what the gateway adds.
func BenchmarkGatewayExecute(b *testing.B) {
	f := newFixture(b, 1)
	id, _ := f.create(tok1)
	pl, err := f.pg.GetPlacement(b.Context(), id)
	if err != nil {
		b.Fatal(err)
	}
	body := `{"code":"1+1"}`
	direct, _ := http.NewRequest("POST", f.hosts[0].ts.URL+"/v1/sessions/"+id+"/execute", nil)
	direct.Header.Set(server.HeaderGatewaySecret, secret)
	direct.Header.Set(server.HeaderOwner, pl.Owner)
	direct.Header.Set(server.HeaderEpoch, pl.Epoch)
	via, _ := http.NewRequest("POST", f.ts.URL+"/v1/sessions/"+id+"/execute", nil)
	via.Header.Set("Authorization", "Bearer "+tok1)
	run := func(req *http.Request) time.Duration {
		r := req.Clone(req.Context())
		r.Body, r.ContentLength = readCloser(body), int64(len(body))
		start := time.Now()
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != 200 || !strings.Contains(string(buf[:n]), `"2"`) {
			b.Fatalf("%s: %s", resp.Status, buf[:n])
		}
		return d
	}
	for range 20 { // warm both paths' connections
		run(direct)
		run(via)
	}
	var ds, vs []time.Duration
	b.ResetTimer()
	for b.Loop() {
		ds = append(ds, run(direct))
		vs = append(vs, run(via))
	}
	b.StopTimer()
	pd, pv := median(ds), median(vs)
	b.ReportMetric(float64(pd.Microseconds())/1000, "direct-p50-ms")
	b.ReportMetric(float64(pv.Microseconds())/1000, "gateway-p50-ms")
	b.ReportMetric(float64((pv-pd).Microseconds())/1000, "added-p50-ms")
	b.Logf("execute 1+1: direct p50 %v, through the gateway p50 %v: the gateway adds %v (x%.2f)", pd, pv, pv-pd, float64(pv)/float64(pd))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

type stringBody struct{ *strings.Reader }

func (stringBody) Close() error { return nil }

func readCloser(s string) stringBody { return stringBody{strings.NewReader(s)} }

// BenchmarkSessionsPerSecond: sessions created per second through a
// gateway in front of 3 hosts against 1 host, same run, 6 clients at once.
// On one machine the hosts share its cores, so this measures what the
// gateway and placement cost and allow, not added hardware.
func BenchmarkSessionsPerSecond(b *testing.B) {
	rate := func(hosts int) float64 {
		f := newFixture(b, hosts)
		const total, clients = 36, 6
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Go(func() {
				for range total / clients {
					st, body := f.do(tok1, "POST", "/v1/sessions", "")
					if st != http.StatusCreated {
						b.Errorf("client %d: %d %s", c, st, body)
						return
					}
				}
			})
		}
		wg.Wait()
		return total / time.Since(start).Seconds()
	}
	for b.Loop() {
		one := rate(1)
		three := rate(3)
		b.ReportMetric(one, "sessions/s-1host")
		b.ReportMetric(three, "sessions/s-3hosts")
		b.Logf("sessions created per second: 1 host %.1f, 3 hosts %.1f (x%.2f)", one, three, three/one)
	}
}

// BenchmarkGatewayBurst: a burst of 100 creates + `1+1` at once through a
// gateway in front of 3 real hosts, each forking from a zygote of its own
// (the default pandas template), with warm pools of 10, 10 and 0 (as
// after one host served a burst of its own). Each iteration runs the
// placement before issue 26 (free slots alone) and the current one (kernels
// ready first, then free slots), each on hosts emptied and refilled, and
// prints where the sessions went, how many took a kernel started ahead,
// and p50/p95 of create + 1+1. On one machine the hosts share its cores:
// this measures placement, not added hardware.
func BenchmarkGatewayBurst(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote here: %v", err)
	}
	pools := []int{10, 10, 0}
	i := 0
	f := newFixture(b, len(pools), func(sh *swapHost) {
		z, err := zygote.New(b.Context(), &zygote.Options{Env: session.KernelEnv()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { z.Close() })
		sh.zygote, sh.pool = z, pools[i]
		i++
	})
	const burst = 100
	type outcome struct {
		perHost       []int
		pooled, ok    int
		p50, p95, max time.Duration
	}
	hostIndex := map[string]int{}
	for i, h := range f.hosts {
		hostIndex[h.ts.Listener.Addr().String()] = i
	}
	// waitPools waits until every host's pool is full.
	waitPools := func() {
		testutil.WaitFor(b, 3*time.Minute, func() error {
			for i, h := range f.hosts {
				req, _ := http.NewRequest("GET", h.ts.URL+"/healthz", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				var st server.Health
				json.NewDecoder(resp.Body).Decode(&st)
				resp.Body.Close()
				if st.PoolReady < pools[i] || st.Sessions > 0 || st.Starting > 0 {
					return fmt.Errorf("host %d: %+v, want an empty host with its pool of %d full", i, st, pools[i])
				}
			}
			return nil
		})
		time.Sleep(time.Second) // the zygotes' spares
		f.gw.Refresh(b.Context())
	}
	run := func(slotsOnly bool) outcome {
		waitPools()
		f.gw.slotsOnly = slotsOnly
		var (
			mu  sync.Mutex
			lat []time.Duration
			ids []string
			o   = outcome{perHost: make([]int, len(f.hosts))}
			wg  sync.WaitGroup
		)
		start := make(chan struct{})
		for range burst {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				st, body := f.do(tok1, "POST", "/v1/sessions", "")
				if st != http.StatusCreated {
					b.Errorf("create: %d %s", st, body)
					return
				}
				var s struct {
					ID       string `json:"id"`
					FromPool bool   `json:"from_pool"`
				}
				json.Unmarshal([]byte(body), &s)
				st, body = f.do(tok1, "POST", "/v1/sessions/"+s.ID+"/execute", `{"code":"1+1"}`)
				d := time.Since(t0)
				pl, err := f.pg.GetPlacement(context.Background(), s.ID)
				mu.Lock()
				defer mu.Unlock()
				ids = append(ids, s.ID)
				if st != http.StatusOK || !strings.Contains(body, `"2"`) || err != nil {
					b.Errorf("1+1 in %s: %d %s %v", s.ID, st, body, err)
					return
				}
				o.ok++
				if s.FromPool {
					o.pooled++
				}
				o.perHost[hostIndex[pl.Host]]++
				lat = append(lat, d)
			})
		}
		close(start)
		wg.Wait()
		for _, id := range ids {
			if st, body := f.do(tok1, "DELETE", "/v1/sessions/"+id, ""); st != http.StatusNoContent {
				b.Errorf("delete %s: %d %s", id, st, body)
			}
		}
		if len(lat) > 0 {
			slices.Sort(lat)
			o.p50, o.p95, o.max = lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1]
		}
		return o
	}
	for b.Loop() {
		old := run(true)
		cur := run(false)
		for _, x := range []struct {
			name string
			o    outcome
		}{{"by free slots (before)", old}, {"by kernels ready, then slots", cur}} {
			b.Logf("burst of %d through the gateway, 3 hosts with pools %v, placed %s: %d ok, sessions per host %v, %d took a kernel started ahead; create + 1+1 p50 %v, p95 %v, last %v",
				burst, pools, x.name, x.o.ok, x.o.perHost, x.o.pooled, x.o.p50.Round(time.Millisecond), x.o.p95.Round(time.Millisecond), x.o.max.Round(time.Millisecond))
		}
		b.ReportMetric(float64(old.pooled), "pooled-before")
		b.ReportMetric(float64(cur.pooled), "pooled")
		b.ReportMetric(float64(old.p50.Milliseconds()), "p50-ms-before")
		b.ReportMetric(float64(cur.p50.Milliseconds()), "p50-ms")
	}
}
