package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/workspace"
)

func needGroups(t *testing.T) {
	if err := jail.GroupsSupported(); err != nil {
		t.Skip("no cgroup measures a session's CPU here: ", err)
	}
}

func TestPauseClosedOrDead(t *testing.T) {
	s := newSession(t, Options{})
	if err := s.Resume(); err != nil {
		t.Errorf("resuming a running session: %v", err)
	}
	s.Close()
	if err := s.Pause(); !errors.Is(err, ErrClosed) {
		t.Errorf("pausing a closed session: %v, want ErrClosed", err)
	}
	if err := s.Resume(); !errors.Is(err, ErrClosed) {
		t.Errorf("resuming a closed session: %v, want ErrClosed", err)
	}
}

// TestIdleActionPause: with IdleAction "pause" the reaper pauses an idle
// session instead of closing it; it then takes no slot (Stats, the cap on
// running sessions); any call resumes it; past MaxPaused an idle session
// is closed and an explicit Pause refused; a paused session closed
// through the manager ends.
func TestIdleActionPause(t *testing.T) {
	needGroups(t)
	ctx := context.Background()
	m := NewManager(&ManagerOptions{IdleTimeout: 200 * time.Millisecond, ReapInterval: time.Hour, IdleAction: IdleActionPause,
		MaxSessions: 1, MaxPaused: 1})
	t.Cleanup(func() { m.Close() })
	a, err := m.Create(ctx, CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Execute(ctx, kernel.Request{Code: "v = 'kept'"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, CreateOptions{Owner: "o"}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("a second running session past MaxSessions 1: %v, want ErrCapacity", err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := m.Reap(time.Now()); n != 0 {
		t.Errorf("the reaper closed %d sessions, want them paused", n)
	}
	if a.State() != StatePaused {
		t.Fatalf("idle session is %s, want paused", a.State())
	}
	if st := m.Stats(); st.Sessions != 1 || st.Paused != 1 || st.Busy() != 0 {
		t.Errorf("stats %+v: want 1 session, paused, none busy", st)
	}
	// Paused, it takes no slot: a second session may start.
	b, err := m.Create(ctx, CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatalf("create beside a paused session: %v", err)
	}
	// Past MaxPaused: an explicit pause is refused, an idle one closed.
	if err := b.Pause(); !errors.Is(err, ErrCapacity) {
		t.Errorf("pausing past MaxPaused: %v, want ErrCapacity", err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := m.Reap(time.Now()); n != 1 || alive(m, b) || !alive(m, a) {
		t.Errorf("reaped %d; b alive %v, a alive %v: want b closed (no paused slot left), a kept", n, alive(m, b), alive(m, a))
	}
	// Every call resumes: Files, Lease (and Execute, below).
	for name, call := range map[string]func(){
		"files": func() {
			if _, err := a.Files(workspace.Options{}); err != nil {
				t.Fatal(err)
			}
		},
		"lease": func() { a.Lease()() },
	} {
		if err := a.Pause(); err != nil {
			t.Fatal(err)
		}
		call()
		if a.State() != StateRunning {
			t.Errorf("%s left the session %s", name, a.State())
		}
	}
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	r, err := a.Execute(ctx, kernel.Request{Code: "v"}, nil)
	if err != nil || mainText(r) != "'kept'" {
		t.Fatalf("after resuming: %v %+v", err, r)
	}
	// Closed while paused, through the manager.
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("closing a paused managed session did not end")
	}
	if alive(m, a) || a.Err() == nil {
		t.Errorf("a closed paused session is still held")
	}
	if st := m.Stats(); st.Sessions != 0 || st.Paused != 0 {
		t.Errorf("stats %+v after closing", st)
	}
}

// TestPausedTimeout: a paused session unused past PausedTimeout is closed.
func TestPausedTimeout(t *testing.T) {
	needGroups(t)
	ctx := context.Background()
	// Times far apart, so a slow Pause on a busy machine cannot cross them.
	m := NewManager(&ManagerOptions{IdleTimeout: 24 * time.Hour, PausedTimeout: time.Hour, ReapInterval: time.Hour})
	t.Cleanup(func() { m.Close() })
	a, err := m.Create(ctx, CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if n := m.Reap(time.Now()); n != 0 {
		t.Fatalf("a freshly paused session was reaped")
	}
	if n := m.Reap(time.Now().Add(2 * time.Hour)); n != 1 || alive(m, a) {
		t.Errorf("a session paused past PausedTimeout was not closed")
	}
}

func TestCheckIdleAction(t *testing.T) {
	for a, ok := range map[string]bool{"": true, "close": true, "pause": true, "kill": false, "Pause": false} {
		if err := CheckIdleAction(a); (err == nil) != ok {
			t.Errorf("CheckIdleAction(%q) = %v", a, err)
		}
	}
}
