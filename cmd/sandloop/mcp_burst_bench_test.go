package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/jail"
)

// BenchmarkMCPBurst: 64 MCP clients (the official Go SDK over streamable
// HTTP) connect at once to a real host's /mcp (serve's handler, zygote on,
// pool of 2, --max-sessions 64), each connection getting a sandbox
// session of its own, and call execute_python `1+1`. It runs the
// pipeline before issue 26 (host.Config.OldPipeline) and the current one
// in turn in the same run and prints, for each, the successes and p50,
// p95 and last of connect + first call.
//
//	go test ./cmd/sandloop -run '^$' -bench MCPBurst -benchtime 1x
func BenchmarkMCPBurst(b *testing.B) {
	if !jail.Probe().Cgroups.OK {
		b.Skip("the zygote needs cgroups")
	}
	const burst = 64
	run := func(old bool) (ok int, p50, p95, last time.Duration, firstErr error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		h, err := host.New(context.Background(), ln, &host.Config{PoolSize: 2, MaxSessions: burst, Zygote: "on", OldPipeline: old, MCP: mcpHandler})
		if err != nil {
			ln.Close()
			b.Fatal(err)
		}
		go h.Serve(context.Background())
		defer h.Close()
		time.Sleep(3 * time.Second) // the warm pool and the zygote's spares
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burst}}
		var (
			mu  sync.Mutex
			lat []time.Duration
			wg  sync.WaitGroup
			css []*mcp.ClientSession
		)
		start := make(chan struct{})
		for range burst {
			wg.Go(func() {
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				t0 := time.Now()
				cl := mcp.NewClient(&mcp.Implementation{Name: "burst", Version: "1"}, nil)
				cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.URL() + "/mcp", HTTPClient: hc}, nil)
				if err == nil {
					mu.Lock()
					css = append(css, cs)
					mu.Unlock()
					var res *mcp.CallToolResult
					res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "1+1"}})
					if err == nil {
						var text strings.Builder
						for _, c := range res.Content {
							if t, ok := c.(*mcp.TextContent); ok {
								text.WriteString(t.Text)
							}
						}
						if res.IsError || !strings.Contains(text.String(), "2") {
							err = fmt.Errorf("execute_python 1+1: %q (error %v)", text.String(), res.IsError)
						}
					}
				}
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					return
				}
				lat = append(lat, d)
			})
		}
		close(start)
		wg.Wait()
		for _, cs := range css {
			cs.Close()
		}
		if len(lat) == 0 {
			return 0, 0, 0, 0, firstErr
		}
		slices.Sort(lat)
		return len(lat), lat[len(lat)/2], lat[len(lat)*95/100], lat[len(lat)-1], firstErr
	}
	for b.Loop() {
		for _, old := range []bool{true, false} {
			name := "new pipeline"
			if old {
				name = "old pipeline"
			}
			ok, p50, p95, last, err := run(old)
			b.Logf("%s: MCP burst of %d (connect + execute_python 1+1): %d ok, p50 %v, p95 %v, last %v (first error: %v)",
				name, burst, ok, p50.Round(time.Millisecond), p95.Round(time.Millisecond), last.Round(time.Millisecond), err)
			if ok != burst && !old {
				b.Errorf("%d of %d succeeded: %v", ok, burst, err)
			}
			if !old {
				b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
				b.ReportMetric(float64(p95.Milliseconds()), "p95-ms")
			} else {
				b.ReportMetric(float64(p50.Milliseconds()), "old-p50-ms")
			}
		}
	}
}
