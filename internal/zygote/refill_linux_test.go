package zygote

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// Forks that find no spare never wait for RefillDelay: with a delay of
// an hour, a burst of forks larger than the spares is served by spares
// asked for at once (with Options.Fixed the later ones would wait for the
// delay). Afterwards the spares ready follow the arrival rate, within
// MaxSpares.
func TestBurstDoesNotWaitForRefillDelay(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skipf("no zygote on this host: %v", err)
	}
	z, err := New(context.Background(), &Options{Modules: light, Env: session.KernelEnv(), RefillDelay: time.Hour, MaxSpares: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	const burst = 6
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, burst)
	for i := range burst {
		wg.Go(func() {
			var s *session.Session
			s, errs[i] = session.New(ctx, &session.Options{Workspace: t.TempDir(), Zygote: z})
			if errs[i] == nil {
				if got := out(t, s, `print("forked")`); got != "forked" {
					t.Errorf("fork %d printed %q", i, got)
				}
				s.Close()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(z.patience(time.Minute)):
		t.Fatal("the burst waited for the refill delay")
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("fork %d: %v", i, err)
		}
	}
	z.mu.Lock()
	inst := z.cur
	z.mu.Unlock()
	inst.fill.mu.Lock()
	target := inst.fill.targetLocked(time.Now())
	inst.fill.mu.Unlock()
	if target < 1 || target > 3 {
		t.Errorf("target after the burst %d, want 1-3 (Spares to MaxSpares)", target)
	}
}

// What a first plot imports (kernel.py's backend, Pillow's plugins) is
// imported by the template, not by every fork: after a plot, the fork
// holds no module object of its own but __main__ (objects made before the
// fork are frozen: gc.get_objects does not list them).
func TestFirstPlotImportsNothing(t *testing.T) {
	z := newZygote(t, nil)
	s := newSession(t, z, session.Options{})
	code := "import gc, types\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n" +
		"print(sorted(m.__name__ for m in gc.get_objects() if isinstance(m, types.ModuleType)))"
	if got := out(t, s.Session, code); got != "['__main__']" {
		t.Errorf("modules imported after the fork: %s", got)
	}
}
