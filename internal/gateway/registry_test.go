package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestRegisteredHosts: hosts found by their heartbeats in the real
// PostgreSQL. Sessions go to registered hosts; a host whose registration
// says it drains gets none (though its own health does not say so yet);
// one whose heartbeat is older than the deadline is no longer listed;
// while the database cannot be read the last list stays. Time is the
// store's injected clock: nothing waits for a deadline to pass.
func TestRegisteredHosts(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	pg, err := store.OpenPostgres(t.Context(), pgtest.Start(t).NewDatabase(t), &store.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	h0, h1 := newHost(t), newHost(t)
	name := func(h *swapHost) string { return h.ts.Listener.Addr().String() }
	beat := func(h *swapHost, ready bool) {
		t.Helper()
		if err := pg.Heartbeat(t.Context(), store.Registration{Name: name(h), URL: h.ts.URL, Epoch: "e", Ready: ready, Slots: 3}); err != nil {
			t.Fatal(err)
		}
	}
	const deadline = 10 * time.Second
	disc := NewRegistered(pg, deadline, nil)
	f := &fixture{t: t, pg: pg, hosts: []*swapHost{h0, h1}}
	f.gw, err = New(&Options{Discovery: disc, Cluster: pg, Secret: secret, Tokens: []string{tok1}, HealthInterval: time.Hour, LostAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.ts = httptest.NewServer(f.gw)
	t.Cleanup(f.ts.Close)
	round := func() map[string]HostInfo {
		t.Helper()
		if err := disc.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		f.gw.Refresh(t.Context())
		out := map[string]HostInfo{}
		for _, h := range f.gw.Hosts() {
			out[h.Name] = h
		}
		return out
	}

	if hs := round(); len(hs) != 0 {
		t.Fatalf("hosts before any registration: %v", hs)
	}
	beat(h0, true)
	beat(h1, true)
	hs := round()
	if !hs[name(h0)].Ready || !hs[name(h1)].Ready {
		t.Fatalf("registered hosts not ready: %+v", hs)
	}
	seen := map[string]bool{}
	for range 4 {
		_, host := f.create(tok1)
		seen[host] = true
	}
	if len(seen) != 2 {
		t.Errorf("4 sessions went to %v, want both hosts", seen)
	}

	// h0 drains: its registration says so first.
	beat(h0, false)
	if hs = round(); hs[name(h0)].Ready || !hs[name(h0)].Draining || !hs[name(h0)].Listed {
		t.Fatalf("a draining registration: %+v", hs[name(h0)])
	}
	if _, host := f.create(tok1); host != name(h1) {
		t.Errorf("a session went to the draining host %s", host)
	}

	// 6s later only h1 beats; 6s more and h0 is past the deadline.
	now.Add((6 * time.Second).Milliseconds())
	beat(h1, true)
	now.Add((6 * time.Second).Milliseconds())
	if got := disc.Targets(); len(got) != 2 {
		t.Fatalf("targets changed before a refresh: %v", got)
	}
	hs = round()
	if hs[name(h0)].Listed || !hs[name(h1)].Listed || !hs[name(h1)].Ready {
		t.Fatalf("after h0's deadline: %+v", hs)
	}
	if got := disc.Targets(); len(got) != 1 || got[0].Name != name(h1) {
		t.Fatalf("targets after h0's deadline: %v", got)
	}

	// The database goes away: the last list stays.
	pg.Close()
	if err := disc.Refresh(t.Context()); err == nil {
		t.Fatal("a refresh from a closed database did not fail")
	}
	if got := disc.Targets(); len(got) != 1 || got[0].Name != name(h1) {
		t.Errorf("targets after a failed refresh: %v", got)
	}
}

// TestRegister: a host's heartbeat loop renews its registration with what
// it reports now, and removes it when it stops.
func TestRegister(t *testing.T) {
	pg, err := store.OpenPostgres(t.Context(), pgtest.Start(t).NewDatabase(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	var used atomic.Int32
	self := func() store.Registration {
		return store.Registration{Name: "h", URL: "http://h:8080", Epoch: "e1", Ready: true, Slots: 4, Used: int(used.Load())}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { Register(ctx, pg, 10*time.Millisecond, self, nil); close(done) }()
	usedIs := func(n int) func() error {
		return func() error {
			regs, err := pg.Registrations(t.Context(), time.Minute)
			if err != nil || len(regs) != 1 || regs[0].Used != n || !regs[0].Ready {
				return fmt.Errorf("registrations %+v (%v), want one ready with %d used", regs, err, n)
			}
			return nil
		}
	}
	testutil.WaitFor(t, 10*time.Second, usedIs(0)) // the first heartbeat
	used.Store(2)
	testutil.WaitFor(t, 10*time.Second, usedIs(2)) // a renewed heartbeat
	cancel()
	<-done
	if regs, err := pg.Registrations(t.Context(), time.Minute); err != nil || len(regs) != 0 {
		t.Errorf("after the host stopped: %v %v", regs, err)
	}
}
