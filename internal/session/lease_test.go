package session

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/testutil"
)

// leaseManager reaps sessions idle for more than idle, looking often.
func leaseManager(t *testing.T, idle time.Duration) *Manager {
	t.Helper()
	m := NewManager(&ManagerOptions{IdleTimeout: idle, ReapInterval: 20 * time.Millisecond})
	t.Cleanup(func() { m.Close() })
	return m
}

func alive(m *Manager, ms *Managed) bool {
	_, err := m.Get(ms.Owner, ms.ID())
	return err == nil
}

// The one rule for "in use": whoever calls a managed session's Execute
// (HTTP, MCP, E2B, an agent run), it is not reaped as idle mid-cell, nor
// while leased or pinned; once released it is.
func TestLeaseRule(t *testing.T) {
	const idle = 300 * time.Millisecond
	m := leaseManager(t, idle)
	ctx := context.Background()

	t.Run("execute", func(t *testing.T) {
		ms, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		// A cell three idle timeouts long, called on the Managed itself
		// with no bracketing by the caller.
		r, err := ms.Execute(ctx, kernel.Request{Code: "import time; time.sleep(1); 'done'"}, nil)
		if err != nil {
			t.Fatalf("the session was closed mid-cell: %v", err)
		}
		mustOK(t, r)
		if !alive(m, ms) {
			t.Fatal("reaped at the end of its cell")
		}
		// And then, unused, it goes.
		deadline := time.Now().Add(10 * time.Second)
		for alive(m, ms) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(m, ms) {
			t.Fatal("an idle session was never reaped")
		}
		if _, err := ms.Execute(ctx, kernel.Request{Code: "1"}, nil); !errors.Is(err, ErrClosed) {
			t.Errorf("execute after reaping: %v, want ErrClosed", err)
		}
	})

	t.Run("many executions", func(t *testing.T) {
		// The review's reproduction: a loop of short cells for several idle
		// timeouts (an agent run's or MCP's pattern).
		ms, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		defer ms.Close()
		for end, n := time.Now().Add(4*idle), 0; time.Now().Before(end); n++ {
			if _, err := ms.Execute(ctx, kernel.Request{Code: "1"}, nil); err != nil {
				t.Fatalf("execution %d: %v", n+1, err)
			}
		}
	})

	t.Run("lease and pin", func(t *testing.T) {
		leased, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		release := leased.Lease()
		pinned, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		pinned.Pin()
		defer pinned.Close()
		time.Sleep(4 * idle)
		if !alive(m, leased) || !alive(m, pinned) {
			t.Fatalf("reaped while in use: leased alive %v, pinned alive %v", alive(m, leased), alive(m, pinned))
		}
		release()
		release() // a second call does nothing
		deadline := time.Now().Add(10 * time.Second)
		for alive(m, leased) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(m, leased) {
			t.Fatal("a released session was never reaped")
		}
		if !alive(m, pinned) {
			t.Fatal("a pinned session was reaped as idle")
		}
	})

	t.Run("close", func(t *testing.T) {
		ms, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if err := ms.Close(); err != nil {
			t.Fatal(err)
		}
		if alive(m, ms) || ms.Err() == nil {
			t.Fatalf("Close did not give the session back: alive %v, err %v", alive(m, ms), ms.Err())
		}
		if err := ms.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// A session the manager has let go of (reaped, deleted) takes no more
// calls, even while its close is still under way: the caller holding it
// learns it is closed, rather than run a cell on a kernel about to be
// killed (or, for the reaper, have one killed under it).
func TestLetGoTakesNoCalls(t *testing.T) {
	m := leaseManager(t, time.Hour) // the test reaps, by Reap
	ctx := context.Background()
	for i := range 16 {
		ms, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		reaped := make(chan int)
		if i%2 == 0 {
			go func() { reaped <- m.Reap(time.Now().Add(2 * time.Hour)) }()
		} else {
			go func() { m.Delete("a", ms.ID()); reaped <- 1 }()
		}
		for alive(m, ms) {
			runtime.Gosched()
		}
		// Forgotten: its close may not have begun yet.
		if _, err := ms.Execute(ctx, kernel.Request{Code: "1"}, nil); !errors.Is(err, ErrClosed) {
			t.Errorf("session %d: execute once the manager let go of it: %v, want ErrClosed", i, err)
		}
		if n := <-reaped; n != 1 {
			t.Fatalf("session %d: reaped %d sessions, want 1", i, n)
		}
	}
}

// Close waits for every close, including those of sessions a Delete or
// the reaper forgot just before it: when Close returns, no workspace of
// any session is left, however the two raced.
func TestCloseRacingDeletes(t *testing.T) {
	m := NewManager(&ManagerOptions{})
	ctx := context.Background()
	var all []*Managed
	for range 6 {
		ms, err := m.Create(ctx, CreateOptions{Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ms)
	}
	deleted := make(chan struct{})
	for i, ms := range all {
		if i%2 == 0 {
			go func() { m.Delete("a", ms.ID()); deleted <- struct{}{} }()
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ms := range all {
		if _, err := os.Stat(ms.Workspace()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("session %s: its workspace is still there after Close: %v", ms.ID(), err)
		}
	}
	for range len(all) / 2 {
		<-deleted
	}
}

// A session being closed still serves its events, its close to come, to
// its owner: a client watching them while it deletes the session (or the
// reaper closes it) never gets "not found" in between.
func TestEventsWhileClosing(t *testing.T) {
	m := leaseManager(t, time.Hour)
	ms, err := m.Create(context.Background(), CreateOptions{Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ms.Session.turn <- struct{}{} // its close waits for the turn
	deleted := make(chan error, 1)
	go func() { deleted <- m.Delete("a", ms.ID()) }()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if alive(m, ms) {
			return errors.New("not let go of yet")
		}
		return nil
	})
	evs, err := m.SessionEvents("a", ms.ID())
	if err != nil {
		t.Fatalf("the events of a session being closed: %v", err)
	}
	if _, err := m.SessionEvents("b", ms.ID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's view of a session being closed: %v", err)
	}
	if _, ended, _ := evs.Since(0); ended {
		t.Error("the events ended before the close")
	}
	<-ms.Session.turn
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	all, ended, _ := evs.Since(0)
	if !ended || len(all) == 0 || all[len(all)-1].Type != EventClosed {
		t.Errorf("after the close: %+v, ended %v; want the close last", all, ended)
	}
	if _, err := m.SessionEvents("a", ms.ID()); err != nil {
		t.Errorf("the events of a closed session: %v", err)
	}
}
