package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/zygote"
)

// newForkingManager is a manager whose kernels (pooled ones too) are
// forked from a real zygote importing only json.
func newForkingManager(t *testing.T, o ManagerOptions) *Manager {
	t.Helper()
	if err := zygote.Supported(); err != nil {
		t.Skipf("no zygote here: %v", err)
	}
	z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	o.Zygote = z
	m := NewManager(&o)
	t.Cleanup(func() { m.Close() })
	testutil.WaitFor(t, 60*time.Second, poolReady(m))
	return m
}

// arrived waits until n creates have asked the pool (in line or served).
func (m *Manager) arrived(t *testing.T, n int) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.fair.arrivals < n {
			return errors.New("the create has not reached the pool yet")
		}
		return nil
	})
}

// A burst larger than the pool is served in arrival order: each create
// arrives after the one before it is in line, and the sessions are served
// (Created, set under the manager's lock when a kernel is handed over) in
// that order; all are served from the pool, none starves.
func TestPoolServesBurstInArrivalOrder(t *testing.T) {
	const pool, burst = 2, 12
	m := newForkingManager(t, ManagerOptions{PoolSize: pool, MaxSessions: burst + 4})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got := make([]*Managed, burst)
	errs := make([]error, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() { got[i], errs[i] = m.Create(ctx, CreateOptions{Owner: "o"}) })
		m.arrived(t, i+1)
	}
	wg.Wait()
	for i := range burst {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		t.Cleanup(func() { got[i].Close() })
		if !got[i].FromPool {
			t.Errorf("create %d did not get a pooled kernel", i)
		}
		if i > 0 && !got[i].Created.After(got[i-1].Created) {
			t.Errorf("create %d (arrived after %d) was served at %v, not after %v", i, i-1,
				got[i].Created.Format("15:04:05.000000"), got[i-1].Created.Format("15:04:05.000000"))
		}
	}
	// Each session works.
	for _, ms := range []*Managed{got[0], got[burst-1]} {
		if out := mainText(runCode(t, ms.Session, "6*7")); out != "42" {
			t.Errorf("session %s answered %q", ms.ID(), out)
		}
	}
}

// A create waiting in line leaves it when its context ends; the one
// behind it is served.
func TestPoolWaitEndsWithContext(t *testing.T) {
	m := newForkingManager(t, ManagerOptions{PoolSize: 1, MaxSessions: 8, PoolParallel: 1})
	first, err := m.Create(context.Background(), CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	// Empty the pool (no refill is asked until the next create).
	m.mu.Lock()
	pooled := m.pool
	m.pool = nil
	m.mu.Unlock()
	for _, s := range pooled {
		s.Close()
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel() // it gives up at once, in line or not
	if _, err := m.Create(gone, CreateOptions{Owner: "o"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("create with an ended context: %v", err)
	}
	ms, err := m.Create(context.Background(), CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	if !ms.FromPool {
		t.Error("the kernel started for the abandoned create was not kept for the next one")
	}
	if st := m.Stats(); st.Sessions != 2 {
		t.Errorf("stats %+v: the abandoned create holds a slot", st)
	}
}

// With PrepareCommands, once sessions run commands (CommandsRun), a pooled
// session is handed out with a join of its jail made ahead: a create that
// runs commands keeps it (and its command starts in it), another create
// drops it, leaving no process. Before any command, none is made.
func TestPoolPreparesCommands(t *testing.T) {
	m := newForkingManager(t, ManagerOptions{PoolSize: 1, MaxSessions: 4, PrepareCommands: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	testutil.WaitFor(t, 60*time.Second, poolReady(m))
	m.mu.Lock()
	first := m.pool[0]
	m.mu.Unlock()
	time.Sleep(time.Second)
	if pids := (&Managed{Session: first}).PreparedPids(); pids != nil {
		t.Fatalf("a join was made ahead before any session ran a command: %v", pids)
	}
	m.CommandsRun()                                        // as E2B's handler does when a sandbox starts one
	taken, err := m.Create(ctx, CreateOptions{Owner: "o"}) // the kernel pooled before it
	if err != nil {
		t.Fatal(err)
	}
	taken.Close()
	testutil.WaitFor(t, 60*time.Second, poolReady(m))
	prepared := func(s *Managed) []int {
		var pids []int
		testutil.WaitFor(t, 60*time.Second, func() error {
			if pids = s.PreparedPids(); pids == nil {
				return errors.New("no join made ahead")
			}
			return nil
		})
		return pids
	}
	cmds, err := m.Create(ctx, CreateOptions{Owner: "o", Commands: true})
	if err != nil {
		t.Fatal(err)
	}
	if !cmds.FromPool {
		t.Fatal("not from the pool")
	}
	prepared(cmds)
	var out strings.Builder
	p, err := cmds.StartCommand(ctx, Command{Path: "/bin/sh", Args: []string{"sh", "-c", "echo joined"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(); err != nil || r.ExitCode != 0 || out.String() != "joined\n" || cmds.PreparedCommands() != 1 {
		t.Fatalf("command: %+v %v %q, %d served by a join made ahead", r, err, out.String(), cmds.PreparedCommands())
	}
	// (The pool may keep more than PoolSize now: the creates above count
	// as a burst it remembers.)
	testutil.WaitFor(t, 60*time.Second, poolReady(m))
	m.mu.Lock()
	pooled := slices.Clone(m.pool)
	m.mu.Unlock()
	if len(pooled) == 0 {
		t.Fatal("no pooled session")
	}
	joins := map[*Session][]int{}
	for _, s := range pooled {
		joins[s] = prepared(&Managed{Session: s})
	}
	plain, err := m.Create(ctx, CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	pids, ok := joins[plain.Session]
	if !ok {
		t.Fatal("the create did not take a pooled session")
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		for _, pid := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return fmt.Errorf("process %d of a dropped join is left", pid)
			}
		}
		if plain.PreparedPids() != nil {
			return errors.New("the session still holds its join")
		}
		return nil
	})
}

// After a burst the pool grows to the burst's size (the largest burst
// remembered), within PoolMemory and the free session slots, and shrinks
// back to PoolSize once the remembered burst is forgotten (PoolPeakHold
// after it; the test shortens it to a few seconds once the pool is full).
func TestPoolRemembersBurst(t *testing.T) {
	if a := memAvailable(); a < poolMinAvailable {
		t.Skipf("the host has %d MiB available: the pool does not grow past PoolSize below %d MiB", a>>20, poolMinAvailable>>20)
	}
	const pool, burst = 1, 6
	for _, c := range []struct {
		name        string
		o           ManagerOptions
		keep        bool // hold the burst's sessions while the pool refills
		want, limit int  // the target after the burst; what bounds it
		why         string
	}{
		{"grows to the burst", ManagerOptions{MaxSessions: 16, PoolMemory: -1}, false, burst, burst, "largest burst"},
		{"memory budget", ManagerOptions{MaxSessions: 16, PoolMemory: 3 * ForkedKernelMemory}, false, 3, 3, "memory budget"},
		{"free slots", ManagerOptions{MaxSessions: burst + 2, PoolMemory: -1}, true, 2, 2, "free session slots"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.PoolSize, o.PoolPeakHold, o.PoolIdleShrink = pool, 10*time.Minute, 100*time.Millisecond
			m := newForkingManager(t, o)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			got := make([]*Managed, burst)
			errs := make([]error, burst)
			var wg sync.WaitGroup
			for i := range burst {
				wg.Go(func() { got[i], errs[i] = m.Create(ctx, CreateOptions{Owner: "o"}) })
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("create %d: %v", i, err)
				}
				if c.keep {
					t.Cleanup(func() { got[i].Close() })
				} else if err := m.Delete("o", got[i].ID()); err != nil {
					t.Fatal(err)
				}
			}
			// The pool fills to the target, whose bound holds throughout.
			// (With the free slots as the bound, the kernels started while
			// more slots were free may be above it until PoolIdleShrink.)
			testutil.WaitFor(t, 2*time.Minute, func() error {
				st := m.Stats()
				if st.PoolTarget > c.limit || (!c.keep && st.PoolReady > c.limit) {
					t.Fatalf("the pool holds %d kernels, target %d (%s): more than %d", st.PoolReady, st.PoolTarget, st.PoolReason, c.limit)
				}
				if st.PoolReady != c.want || st.PoolTarget != c.want {
					return fmt.Errorf("the pool holds %d kernels, target %d (%s), want %d", st.PoolReady, st.PoolTarget, st.PoolReason, c.want)
				}
				return nil
			})
			if st := m.Stats(); !strings.Contains(st.PoolReason, c.why) {
				t.Errorf("the target's reason %q does not say %q", st.PoolReason, c.why)
			}
			// The burst is forgotten in two seconds: the pool shrinks back
			// to PoolSize.
			m.mu.Lock()
			if p := m.peakLocked(time.Now()); p.n != burst {
				t.Errorf("the burst remembered: %d creates, want %d", p.n, burst)
			} else {
				m.opts.PoolPeakHold = time.Since(p.at) + 2*time.Second
			}
			m.mu.Unlock()
			m.kick()
			testutil.WaitFor(t, 2*time.Minute, func() error {
				if st := m.Stats(); st.PoolReady != pool || st.PoolTarget != pool {
					return fmt.Errorf("the pool holds %d kernels, target %d (%s), want %d", st.PoolReady, st.PoolTarget, st.PoolReason, pool)
				}
				return nil
			})
		})
	}
}

// Stats tells the zygote's spares ready beside the pool (a cell's
// gateway weighs both through /healthz); without a zygote, none.
func TestStatsSpares(t *testing.T) {
	m := newForkingManager(t, ManagerOptions{PoolSize: 1, MaxSessions: 4})
	testutil.WaitFor(t, 60*time.Second, func() error {
		if st := m.Stats(); st.Spares < 1 {
			return fmt.Errorf("stats %+v: no spare ready", st)
		}
		return nil
	})
	cold := NewManager(&ManagerOptions{MaxSessions: 1})
	t.Cleanup(func() { cold.Close() })
	if st := cold.Stats(); st.Spares != 0 {
		t.Errorf("without a zygote: %+v", st)
	}
}

// A manager started on the PoolPeakFile of one that saw a burst (a
// restarted server) fills its pool for that burst before any create.
func TestPoolPeakKeptForTheNextManager(t *testing.T) {
	if a := memAvailable(); a < poolMinAvailable {
		t.Skipf("the host has %d MiB available: the pool does not grow past PoolSize below %d MiB", a>>20, poolMinAvailable>>20)
	}
	const pool, burst = 1, 6
	o := ManagerOptions{PoolSize: pool, MaxSessions: 16, PoolMemory: -1, PoolPeakHold: 10 * time.Minute,
		PoolPeakFile: filepath.Join(t.TempDir(), "pool-peaks.json")}
	m := newForkingManager(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, burst)
	for i := range burst {
		wg.Go(func() {
			s, err := m.Create(ctx, CreateOptions{Owner: "o"})
			if err == nil {
				err = m.Delete("o", s.ID())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	next := newForkingManager(t, o)
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if st := next.Stats(); st.PoolReady != burst || st.PoolTarget != burst || !strings.Contains(st.PoolReason, "largest burst") {
			return fmt.Errorf("the next manager's pool holds %d kernels, target %d (%s), want %d for the burst", st.PoolReady, st.PoolTarget, st.PoolReason, burst)
		}
		return nil
	})
	next.mu.Lock()
	defer next.mu.Unlock()
	if next.fair.arrivals != 0 {
		t.Errorf("%d creates reached the next manager's pool, want none", next.fair.arrivals)
	}
}
