package runs

import (
	"context"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

// A run's session is in use for the whole run: neither its executions
// nor the model's thinking between them (longer than the idle timeout)
// get it reaped as idle. It is given back when the run ends.
func TestRunSessionNotReapedAsIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	mgr := session.NewManager(&session.ManagerOptions{IdleTimeout: idle, ReapInterval: 20 * time.Millisecond})
	t.Cleanup(func() { mgr.Close() })
	ctx := context.Background()
	s, err := ManagerSessions(mgr)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for end := time.Now().Add(4 * idle); time.Now().Before(end); n++ {
		if _, err := s.Execute(ctx, kernel.Request{Code: "1"}, nil); err != nil {
			t.Fatalf("execution %d: %v", n+1, err)
		}
	}
	time.Sleep(2 * idle) // the model thinks
	r, err := s.Execute(ctx, kernel.Request{Code: "'still here'"}, nil)
	if err != nil || r.Status != kernel.StatusOK {
		t.Fatalf("after %d executions and a pause: %+v, %v", n, r, err)
	}
	if got := mgr.Stats().Sessions; got != 1 {
		t.Errorf("%d sessions held, want 1", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mgr.Stats().Sessions; got != 0 {
		t.Errorf("%d sessions held after the run, want 0", got)
	}
}
