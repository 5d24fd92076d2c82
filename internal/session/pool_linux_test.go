package session

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// With PrepareCommands, a pooled session is handed out with a join of its
// jail made ahead: a create that runs commands keeps it (and its command
// starts in it), another create drops it, leaving no process.
func TestPoolPreparesCommands(t *testing.T) {
	m := newForkingManager(t, ManagerOptions{PoolSize: 1, MaxSessions: 4, PrepareCommands: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
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
	testutil.WaitFor(t, 60*time.Second, poolReady(m))
	m.mu.Lock()
	var pooled *Session
	if len(m.pool) > 0 {
		pooled = m.pool[0]
	}
	m.mu.Unlock()
	if pooled == nil {
		t.Fatal("no pooled session")
	}
	pids := prepared(&Managed{Session: pooled})
	plain, err := m.Create(ctx, CreateOptions{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Session != pooled {
		t.Fatal("the create did not take the pooled session")
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
