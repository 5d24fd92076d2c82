package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/testutil/burst"
)

// BenchmarkMCPBurst is BenchmarkBurst100 (client) through MCP: 100 MCP
// clients (the official Go SDK over streamable HTTP) connect at once to a
// real host's /mcp (serve's handler, zygote on, pool of 2,
// --max-sessions 128), each connection getting a sandbox session of its
// own, and call execute_python `1+1`. Each iteration measures, in turn in
// the same run, the pipeline before issue 26 (host.Config.OldPipeline) on
// a fresh host ("old pipeline"), the current one on a fresh host ("first
// burst": 2 kernels ready, the rest forked on demand), and a second burst
// on that host once the first's MCP sessions are closed and its pool has
// refilled to the target the first set it ("repeated burst": the largest
// burst remembered). It prints, for each, the successes and p50, p95 and
// last of connect + first call (internal/testutil/burst).
//
//	go test ./cmd/sandloop -run '^$' -bench MCPBurst -benchtime 1x
func BenchmarkMCPBurst(b *testing.B) {
	if !jail.Probe().Cgroups.OK {
		b.Skip("the zygote needs cgroups")
	}
	const n = 100
	face := burst.Face{N: n, Profile: burst.ProfileFromEnv(b), Start: func(old bool) (burst.One, func() (burst.Pool, error), func()) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		h, err := host.New(context.Background(), ln, &host.Config{PoolSize: 2, MaxSessions: n + 28, Zygote: "on", OldPipeline: old, MCP: mcpHandler})
		if err != nil {
			ln.Close()
			b.Fatal(err)
		}
		go h.Serve(context.Background())
		pool := func() (burst.Pool, error) {
			var st server.Health
			resp, err := http.Get(h.URL() + "/healthz")
			if err != nil {
				return burst.Pool{}, err
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				return burst.Pool{}, err
			}
			return burst.Pool{Ready: st.PoolReady, Target: st.PoolTarget, Sessions: st.Sessions + st.Starting, Reason: st.PoolReason}, nil
		}
		testutil.WaitFor(b, time.Minute, func() error {
			if p, err := pool(); err != nil || p.Ready < 2 {
				return fmt.Errorf("the pool is not full: %+v %v", p, err)
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // the zygote's spare too
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
		one := func(ctx context.Context) (int, func() error, error) {
			cl := mcp.NewClient(&mcp.Implementation{Name: "burst", Version: "1"}, nil)
			cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.URL() + "/mcp", HTTPClient: hc}, nil)
			if err != nil {
				return -1, nil, err
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "1+1"}})
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
			return -1, cs.Close, err // MCP does not tell whether the kernel was started ahead
		}
		return one, pool, func() {
			if err := h.Close(); err != nil {
				b.Errorf("host close: %v", err)
			}
		}
	}}
	burst.Bench(b, face)
}
