package session

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/testutil"
)

// BenchmarkRestoreAfterDeath is what a server's start pays to bring back
// the sessions of a server that died with its keeper (both killed, the
// host up): 40 sessions, each with 1 MiB of files and a variable in its
// latest automatic snapshot. Measured twice in each iteration, in turn:
//
//   - "clean": none was used since its snapshot, so Restore only adopts
//     each one asleep on it (the baseline);
//   - "salvage": each wrote another 1 MiB file after it, so Restore first
//     writes each left workspace's files to a new automatic snapshot
//     (takeLeftover), 8 at a time.
//
// It reports both Restore times, the salvage's per session, and the
// salvage's cost as a ratio of the baseline's.
func BenchmarkRestoreAfterDeath(b *testing.B) {
	const n = 40
	for range b.N {
		clean := restoreAfterDeath(b, n, false)
		salvage := restoreAfterDeath(b, n, true)
		b.ReportMetric(float64(clean.Microseconds())/1000, "clean-ms")
		b.ReportMetric(float64(salvage.Microseconds())/1000, "salvage-ms")
		b.ReportMetric(float64(salvage.Microseconds())/1000/n, "salvage-ms/session")
		b.ReportMetric(float64(salvage)/float64(clean), "salvage/clean")
		b.Logf("%d sessions: Restore took %s when none was used since its snapshot, %s when each had 1 MiB of files to salvage (%.1f ms a session, %.1fx)",
			n, clean.Round(time.Millisecond), salvage.Round(time.Millisecond), float64(salvage.Microseconds())/1000/n, float64(salvage)/float64(clean))
	}
}

// restoreAfterDeath makes n durable sessions in a keeper, snapshots them,
// writes more to each if usedSince, kills the server (Detach) and its
// keeper, and times a new manager's Restore.
func restoreAfterDeath(b *testing.B, n int, usedSince bool) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	c := startTestKeeper(b)
	st, _, _ := snapshotStore(b, nil)
	o := ManagerOptions{Snapshots: st, Records: b.TempDir(), Keeper: c, MaxSessions: n}
	m := NewManager(&o)
	run := func(ms *Managed, code string) {
		r, err := ms.Execute(ctx, kernel.Request{Code: code}, nil)
		if err != nil || r.Status != kernel.StatusOK {
			b.Fatalf("%s: %+v %v", code, r, err)
		}
	}
	list := make([]*Managed, n)
	for i := range list {
		ms, err := m.Create(ctx, CreateOptions{Owner: "alice"})
		if err != nil {
			b.Fatal(err)
		}
		run(ms, "import os\nx = 1\nopen('early.bin', 'wb').write(os.urandom(1 << 20))")
		ms.markUsed()
		list[i] = ms
	}
	if got := m.SnapshotChanged(ctx, 0); got != n {
		b.Fatalf("%d automatic snapshots, want %d", got, n)
	}
	var left string
	for _, ms := range list {
		if usedSince {
			run(ms, "open('late.bin', 'wb').write(os.urandom(1 << 20))")
			ms.markUsed()
		}
		left = m.loadRecord(ms.ID()).Workspace
	}
	if err := m.Detach(); err != nil {
		b.Fatal(err)
	}
	pid := c.Pid()
	syscall.Kill(pid, syscall.SIGKILL) // (it runs: its sessions' records name it)
	testutil.WaitFor(b, 30*time.Second, func() error {
		if !jail.Leftover(left, 0) {
			return fmt.Errorf("keeper %d still runs", pid)
		}
		return nil
	})

	o.Keeper = startTestKeeper(b)
	m2 := NewManager(&o)
	b.Cleanup(func() { m2.Close() })
	t0 := time.Now()
	got, err := m2.Restore(ctx)
	d := time.Since(t0)
	if got != n || err != nil {
		b.Fatalf("restore: %d, %v; want %d", got, err, n)
	}
	return d
}
