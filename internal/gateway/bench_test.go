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
	"github.com/sandloop/sandloop/internal/testutil/burst"
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

// BenchmarkGatewayBurst is BenchmarkBurst100 (client) through a cell: a
// burst of 100 creates + `1+1` at once through a gateway in front of 3
// real hosts, each forking from a zygote of its own (the default pandas
// template), with warm pools of 10, 10 and 2 (--pool; serve's default is
// 2) and 128 slots each. Each iteration measures, in turn
// in the same run, on a fresh cell each time (PostgreSQL, hosts, gateway;
// each stopped before the next starts):
//
//   - "old pipeline": the hosts' pipeline before issue 26
//     (session.ManagerOptions.FixedPool, zygote.Options.Fixed), placed by
//     free slots alone;
//   - "first burst": the current pipeline, placed by the hosts' warm
//     kernels (pool and spares), then free slots (place.go's choose);
//   - "repeated burst": a second burst on that cell once the first's
//     sessions are deleted and every host's pool has refilled to the
//     target the first set it (the creates of its share that came within
//     the pool's window, remembered).
//
// It prints for each the successes, p50, p95 and last of create + 1+1,
// how many took a kernel started ahead, and where the sessions went
// (internal/testutil/burst). On one machine the hosts share its cores:
// this measures the pipeline and placement, not added hardware.
//
//	go test ./internal/gateway -run '^$' -bench GatewayBurst -benchtime 1x
func BenchmarkGatewayBurst(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote here: %v", err)
	}
	pools := []int{10, 10, 2}
	const n = 100
	var (
		mu      sync.Mutex
		perHost []int
	)
	// The repeated burst waits until every host's pool is at a target
	// above its first pool: the first burst remembered.
	face := burst.Face{N: n, Remembered: 10 + 10 + 2 + 1, Profile: burst.ProfileFromEnv(b), Start: func(old bool) (burst.One, func() (burst.Pool, error), func()) {
		sc := &scope{TB: b}
		i := 0
		f := newFixture(sc, len(pools), func(sh *swapHost) {
			z, err := zygote.New(b.Context(), &zygote.Options{Env: session.KernelEnv(), Fixed: old})
			if err != nil {
				b.Fatal(err)
			}
			sc.Cleanup(func() { z.Close() })
			sh.zygote, sh.pool, sh.fixed, sh.maxSessions = z, pools[i], old, n+28
			i++
		})
		f.gw.slotsOnly = old
		hostIndex := map[string]int{}
		for i, h := range f.hosts {
			hostIndex[h.ts.Listener.Addr().String()] = i
		}
		// pool sums the hosts' pools, each counted up to its target.
		pool := func() (burst.Pool, error) {
			var p burst.Pool
			for i := range f.hosts {
				st, err := f.health(i)
				if err != nil {
					return p, err
				}
				p.Ready += min(st.PoolReady, st.PoolTarget)
				p.Target += st.PoolTarget
				p.Sessions += st.Sessions + st.Starting
			}
			return p, nil
		}
		testutil.WaitFor(b, 3*time.Minute, func() error {
			for i := range f.hosts {
				if st, err := f.health(i); err != nil || st.PoolReady < pools[i] || st.Starting > 0 {
					return fmt.Errorf("host %d: %+v %v, want its pool of %d full", i, st, err, pools[i])
				}
			}
			return nil
		})
		time.Sleep(time.Second) // the zygotes' spares
		f.gw.Refresh(b.Context())
		mu.Lock()
		perHost = make([]int, len(pools))
		mu.Unlock()
		one := func(ctx context.Context) (pooled int, remove func() error, err error) {
			st, body := f.do(tok1, "POST", "/v1/sessions", "")
			if st != http.StatusCreated {
				return 0, nil, fmt.Errorf("create: %d %s", st, body)
			}
			var s struct {
				ID       string `json:"id"`
				FromPool bool   `json:"from_pool"`
			}
			if err := json.Unmarshal([]byte(body), &s); err != nil {
				return 0, nil, err
			}
			if s.FromPool {
				pooled = 1
			}
			// Where it went is looked up after the burst (not timed),
			// before the delete.
			remove = func() error {
				pl, err := f.pg.GetPlacement(context.Background(), s.ID)
				if err != nil {
					return err
				}
				mu.Lock()
				perHost[hostIndex[pl.Host]]++
				mu.Unlock()
				if st, body := f.do(tok1, "DELETE", "/v1/sessions/"+s.ID, ""); st != http.StatusNoContent {
					return fmt.Errorf("delete %s: %d %s", s.ID, st, body)
				}
				return nil
			}
			st, body = f.do(tok1, "POST", "/v1/sessions/"+s.ID+"/execute", `{"code":"1+1"}`)
			if st != http.StatusOK || !strings.Contains(body, `"2"`) {
				return pooled, remove, fmt.Errorf("1+1 in %s: %d %s", s.ID, st, body)
			}
			return pooled, remove, nil
		}
		return one, pool, sc.close
	}, Note: func(string) string {
		mu.Lock()
		defer mu.Unlock()
		s := fmt.Sprintf("sessions per host %v (pools %v)", perHost, pools)
		perHost = make([]int, len(pools))
		return s
	}}
	burst.Bench(b, face)
}

// scope is a testing.TB whose cleanups run when close is called, not at
// the test's end: a benchmark's cell stopped before the next starts.
type scope struct {
	testing.TB
	mu  sync.Mutex
	fns []func()
}

func (s *scope) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns = append(s.fns, f)
}

func (s *scope) Context() context.Context { return context.Background() }

// close runs the cleanups, the last registered first.
func (s *scope) close() {
	s.mu.Lock()
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
