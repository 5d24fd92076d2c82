package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/zygote"
)

// A burst larger than the warm pool, through the HTTP API of a real host
// with the zygote, is served in arrival order: each create is sent once
// the one before it holds its slot (healthz: sessions + starting), and
// the sessions' created_at (when each was handed its kernel, under the
// manager's lock) follow that order. Every create of the burst is answered
// 201 from the pool: none starves, none is refused while a slot remains.
// With every slot held, one more create gets 429 with Retry-After; once a
// session is deleted, a create succeeds again.
func TestBurstServedInArrivalOrder(t *testing.T) {
	if err := zygote.Supported(); err != nil {
		t.Skipf("no zygote here: %v", err)
	}
	const pool, burst = 2, 12
	url := newServer(t, &host.Config{PoolSize: pool, MaxSessions: burst, Zygote: "on"})
	c := newClient(t, url, &client.Options{HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burst + 2}}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	health := func() *client.Health {
		h, err := c.Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if h := health(); h.PoolReady < pool {
			return fmt.Errorf("the pool is not full: %+v", h)
		}
		return nil
	})

	got := make([]*client.Session, burst)
	errs := make([]error, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() { got[i], errs[i] = c.CreateSession(ctx, nil) })
		testutil.WaitFor(t, time.Minute, func() error {
			if h := health(); h.Sessions+h.Starting < i+1 {
				return fmt.Errorf("create %d holds no slot yet: %+v", i, h)
			}
			return nil
		})
	}
	// Every slot is held (the last creates may still wait in line): the
	// server is full, and says when to come back.
	_, err := c.CreateSession(ctx, nil)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.RetryAfter <= 0 {
		t.Errorf("a create beyond --max-sessions %d: %v, want 429 with Retry-After", burst, err)
	}
	wg.Wait()
	for i := range burst {
		if errs[i] != nil {
			t.Fatalf("create %d of the burst: %v", i, errs[i])
		}
		t.Cleanup(func() { c.DeleteSession(context.Background(), got[i].ID) })
		if !got[i].FromPool {
			t.Errorf("create %d did not get a pooled kernel", i)
		}
		if i > 0 && !got[i].CreatedAt.After(got[i-1].CreatedAt) {
			t.Errorf("create %d (arrived after %d) was served at %v, not after %v", i, i-1,
				got[i].CreatedAt.Format("15:04:05.000000"), got[i-1].CreatedAt.Format("15:04:05.000000"))
		}
	}
	for _, s := range []*client.Session{got[0], got[burst-1]} {
		if r, err := c.Execute(ctx, s.ID, "6*7", nil); err != nil || r.Text() != "42" {
			t.Errorf("session %s: %v %+v", s.ID, err, r)
		}
	}
	// A slot freed is a create served: 429 meant full, not busy.
	if err := c.DeleteSession(ctx, got[0].ID); err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatalf("a create after a delete freed a slot: %v", err)
	}
	t.Cleanup(func() { c.DeleteSession(context.Background(), s.ID) })
}
