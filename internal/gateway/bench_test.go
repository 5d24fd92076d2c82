package gateway

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/server"
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
