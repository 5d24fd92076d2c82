package client_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/testutil/burst"
)

// BenchmarkBurst100 is issue 26's measure: 100 clients at once each create
// a session and run 1+1 in it, through the HTTP API of a real host with
// the zygote (sandloop serve's pool of 2). Each iteration measures, in
// turn in the same process, three bursts of 100:
//
//   - "old pipeline": the pipeline before issue 26 (host.Config.OldPipeline:
//     fixed refill delays, one spare, one pooled kernel started at a time)
//     on a fresh host;
//   - "first burst": the current pipeline on a fresh host (a pool of 2:
//     the other 98 wait for kernels forked on demand);
//   - "repeated burst": a second burst of 100 on that same host, once its
//     sessions of the first are deleted and its pool has refilled to the
//     target it set itself after the first (the largest burst remembered:
//     session.ManagerOptions.PoolPeakHold); how long that refill took after
//     the first burst's last answer is printed too;
//   - "sized pool": the first burst on a fresh host started with a pool
//     of 100 (`serve --pool 100 --max-sessions 128`, what a deployment
//     that expects bursts of 100 sets), once those kernels are ready.
//
// It prints for each the successes, p50, p95 and the last answer, and the
// sessions made per second over the burst; -benchtime 1x is one of each.
// Each host is closed before the next starts.
func BenchmarkBurst100(b *testing.B) {
	const n = 100
	ctx := context.Background()
	// start starts a fresh host with pool kernels kept ready (the
	// default 2, or the burst's size) and waits until they are.
	start := func(old bool, ready int) (burst.One, func() (burst.Pool, error), func()) {
		h, err := startHost(&host.Config{PoolSize: ready, MaxSessions: n + 28, Zygote: "on", OldPipeline: old})
		if err != nil {
			b.Fatal(err)
		}
		c := newClient(b, h.URL(), &client.Options{HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}})
		testutil.WaitFor(b, 2*time.Minute, func() error {
			h, err := c.Health(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if h.PoolReady < ready {
				return fmt.Errorf("the pool is not full: %+v", h)
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // the zygote's spare too
		one := func(ctx context.Context) (pooled int, remove func() error, err error) {
			s, err := c.CreateSession(ctx, nil)
			if err != nil {
				return 0, nil, err
			}
			if s.FromPool {
				pooled = 1
			}
			remove = func() error { return c.DeleteSession(context.Background(), s.ID) }
			r, err := c.Execute(ctx, s.ID, "1+1", nil)
			if err == nil && r.Text() != "2" {
				err = fmt.Errorf("1+1 gave %+v", r)
			}
			return pooled, remove, err
		}
		pool := func() (burst.Pool, error) {
			h, err := c.Health(ctx)
			if err != nil {
				return burst.Pool{}, err
			}
			return burst.Pool{Ready: h.PoolReady, Target: h.PoolTarget, Sessions: h.Sessions + h.Starting, Reason: h.PoolReason}, nil
		}
		return one, pool, func() {
			if err := h.Close(); err != nil {
				b.Errorf("host close: %v", err)
			}
		}
	}
	face := burst.Face{N: n, Profile: burst.ProfileFromEnv(b),
		Start:      func(old bool) (burst.One, func() (burst.Pool, error), func()) { return start(old, 2) },
		StartSized: func() (burst.One, func() (burst.Pool, error), func()) { return start(false, n) },
	}
	burst.Bench(b, face)
}
