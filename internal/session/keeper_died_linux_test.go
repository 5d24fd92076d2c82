package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/keeper"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestKeeperDiedWhileCreating: a session whose kernel a keeper spawned
// while the server learned of that keeper's death is put to sleep, as
// KeeperDied's sweep puts the sessions it finds, even when it is
// registered after the sweep. The death is told (KeeperDied) as soon as
// the session's jail is the keeper's child, while its kernel still
// starts: the keeper (a real one, this test binary) is left running, so
// without the check at registration the session would come back awake,
// its kernel held by a keeper the server believes dead. It wakes empty,
// saying its variables were lost (it had no snapshot yet) and its files
// (none) kept.
func TestKeeperDiedWhileCreating(t *testing.T) {
	c := startTestKeeper(t)
	ctx := context.Background()
	pid := c.Pid()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, Records: t.TempDir(), Keeper: c})

	type created struct {
		ms  *Managed
		err error
	}
	done := make(chan created, 1)
	go func() {
		ms, err := m.Create(ctx, CreateOptions{Owner: "alice"})
		done <- created{ms, err}
	}()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if len(childPids(pid)) == 0 {
			return errors.New("the session's jail is not the keeper's child yet")
		}
		return nil
	})
	swept, err := m.KeeperDied(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	var r created
	select {
	case r = <-done:
	case <-time.After(120 * time.Second):
		t.Fatal("the create did not end")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("put to sleep by the sweep: %v (else at its registration)", swept == 1)
	if got := r.ms.State(); got != StateHibernated {
		t.Fatalf("a session created as its keeper died: state %q, want %q", got, StateHibernated)
	}
	// Its creation, then its loss, whichever put it to sleep.
	if evs, _, _ := r.ms.Events().Since(0); eventTypes(evs) != "created lost" || evs[1].State != StateHibernated {
		t.Errorf("a session created as its keeper died: events %+v", evs)
	}
	if got := managedText(t, r.ms, "import os\nsorted(os.listdir('.')), 'x' in globals()"); got != "([], False)" {
		t.Errorf("woken: %s, want an empty session", got)
	}
	if res := r.ms.Restored(); res == nil || !strings.Contains(res.Lost, "before its first snapshot") || res.FilesAsOf.IsZero() {
		t.Errorf("woken: restored %+v does not say its variables were lost (before its first snapshot) and its files kept", res)
	}
}

// startTestKeeper starts a real keeper (this test binary) and returns
// its client; the cleanup kills it by its PID.
func startTestKeeper(t testing.TB) *keeper.Client {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a keeper's sessions need root (their workspaces are host directories)")
	}
	c, err := keeper.Connect(filepath.Join(t.TempDir(), "keeper"), os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	// Pinned while it surely runs (it has just answered): a test that
	// killed it leaves its number free for any process by the cleanup.
	keeper := testutil.Pin(t, c.Pid())
	t.Cleanup(func() {
		c.Close()
		keeper.Kill()
		testutil.WaitFor(t, 30*time.Second, func() error {
			if !keeper.Ended() {
				return fmt.Errorf("keeper %d still runs", keeper.Pid)
			}
			return nil
		})
	})
	return c
}

// TestKeeperDiedKeepsTheFiles: the workspace of a session whose keeper
// died outlives it (a host directory), so what was written after the
// latest automatic snapshot is not lost: the session sleeps on a new
// snapshot of its files as they were, with the variables of the one
// before, and its wake says so (files as of the loss, variables as of the
// snapshot, the variables set since lost). The record names the new
// snapshot and says the same to a server restarted meanwhile; the old
// snapshot is deleted. As in TestKeeperDiedWhileCreating the keeper is
// left running (KeeperDied kills the session's kernel), so the wake has
// one to start in.
func TestKeeperDiedKeepsTheFiles(t *testing.T) {
	c := startTestKeeper(t)
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, Records: t.TempDir(), Keeper: c})
	ms, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	managedText(t, ms, "x = 1\nopen('early.txt', 'w').write('early')")
	ms.markUsed()
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written, want 1", n)
	}
	first := lastAutoSnapshot(t, m, st, ms)
	managedText(t, ms, "y = 2\nopen('late.txt', 'w').write('late')\nopen('early.txt', 'a').write(' and later')")
	ms.markUsed()

	if n, err := m.KeeperDied(ctx, c.Pid()); err != nil || n != 1 {
		t.Fatalf("KeeperDied: %d sessions put to sleep, %v; want 1", n, err)
	}
	if got := ms.State(); got != StateHibernated {
		t.Fatalf("state %q after its keeper died, want %q", got, StateHibernated)
	}
	evs, _, _ := ms.Events().Since(0)
	if types := eventTypes(evs); types != "created snapshot lost" || !strings.Contains(evs[2].Reason, "(the keeper) died") ||
		!strings.Contains(evs[2].Reason, "lost: the variables set after") || evs[2].State != StateHibernated {
		t.Errorf("events after the keeper died: %s %+v", types, evs)
	}
	rec := m.loadRecord(ms.ID())
	if rec == nil || rec.Snapshot == first.ID || rec.Salvaged == nil || !rec.Hibernated {
		t.Fatalf("record after the keeper died: %+v, want a new snapshot (not %s), salvaged and hibernated", rec, first.ID)
	}
	if !rec.Salvaged.VariablesAsOf.Equal(first.CreatedAt) || !strings.Contains(rec.Salvaged.Lost, "variables set after") {
		t.Errorf("record's salvage note %+v: want variables as of %v and the variables set since lost", rec.Salvaged, first.CreatedAt)
	}
	if _, err := st.Get(ctx, "alice", first.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("the snapshot the files replaced (%s) is left: %v", first.ID, err)
	}
	// A server started now (the record alone) would say the same.
	h, _, err := m.lostState(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if !h.asOf.Equal(first.CreatedAt) || h.filesAsOf.IsZero() || h.lost != rec.Salvaged.Lost {
		t.Errorf("a restart's restore from the record: as of %v, files as of %v, lost %q; want %v, set, %q",
			h.asOf, h.filesAsOf, h.lost, first.CreatedAt, rec.Salvaged.Lost)
	}

	got := managedText(t, ms, "import os\nsorted(os.listdir('.')), open('early.txt').read(), 'x' in globals(), 'y' in globals()")
	if want := "(['early.txt', 'late.txt'], 'early and later', True, False)"; got != want {
		t.Errorf("woken: %s, want %s (the files as they were, the variables as of the snapshot)", got, want)
	}
	res := ms.Restored()
	if res == nil || res.FilesAsOf.IsZero() || !res.AsOf.Equal(first.CreatedAt) || !strings.Contains(res.Lost, "variables set after") {
		t.Fatalf("woken: restored %+v, want files as of the loss, variables as of %v, the variables set since lost", res, first.CreatedAt)
	}
	sum := res.Summary()
	for _, want := range []string{"files exact as of ", "(2 files)", "variables restored: x", "variables as of ", "lost: the variables set after"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary %q does not say %q", sum, want)
		}
	}
}

// childPids lists the PIDs whose parent is pid.
func childPids(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, n)
		}
	}
	return out
}

// TestServerDeathKeepsTheFiles: a server and its keeper both killed (no
// server left to see the keeper die) while the host stays up: the
// sessions' workspaces outlive them (lasting host directories, spared by
// every sweep for a grace), so the next server, restoring from the
// records, takes what was written after the latest automatic snapshot:
// the session comes back with its files as they were and the variables
// of that snapshot, says so, and its record names the new snapshot (the
// old one is deleted); the left workspace is removed. A session whose
// files were all in its snapshot (not used since) is restored from it
// as before, its left workspace removed too. Twice: the server lets go
// of its sessions before its keeper is killed (both killed), and after
// (a SIGTERM right after the keeper's death, before the server put its
// sessions to sleep: their kernels dead, Detach closes them, leaving the
// workspaces).
func TestServerDeathKeepsTheFiles(t *testing.T) {
	for _, keeperFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "server-then-keeper", true: "keeper-then-server"}[keeperFirst], func(t *testing.T) {
			testServerDeathKeepsTheFiles(t, keeperFirst)
		})
	}
}

func testServerDeathKeepsTheFiles(t *testing.T, keeperFirst bool) {
	c := startTestKeeper(t)
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	o := ManagerOptions{Snapshots: st, Records: t.TempDir(), Keeper: c}
	m := forkManager(t, o)
	used, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	clean, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range []*Managed{used, clean} {
		managedText(t, ms, "x = 1\nopen('early.txt', 'w').write('early')")
		ms.markUsed()
	}
	if n := m.SnapshotChanged(ctx, 0); n != 2 {
		t.Fatalf("%d automatic snapshots written, want 2", n)
	}
	first := lastAutoSnapshot(t, m, st, used)
	managedText(t, used, "y = 2\nopen('late.txt', 'w').write('late')\nopen('early.txt', 'a').write(' and later')")
	used.markUsed()
	recUsed, recClean := m.loadRecord(used.ID()), m.loadRecord(clean.ID())
	for _, rec := range []*durableRecord{recUsed, recClean} {
		if rec == nil || !strings.Contains(filepath.Base(rec.Workspace), "-lasting-") {
			t.Fatalf("record %+v: want its lasting workspace named", rec)
		}
	}

	// The server lets go (as one killed would: its records stay), and
	// its keeper is killed: nobody is left to take the files.
	if !keeperFirst {
		if err := m.Detach(); err != nil {
			t.Fatal(err)
		}
	}
	pid := c.Pid()
	syscall.Kill(pid, syscall.SIGKILL)
	testutil.WaitFor(t, 30*time.Second, func() error {
		if !jail.Leftover(recUsed.Workspace, 0) {
			return fmt.Errorf("keeper %d still runs (its workspaces are not left yet)", pid)
		}
		if keeperFirst && used.Session.Err() == nil {
			return errors.New("the kernel's death is not seen yet")
		}
		return nil
	})
	if keeperFirst {
		if err := m.Detach(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(recUsed.Workspace, "late.txt")); err != nil {
		t.Fatalf("the left workspace lacks the late file: %v", err)
	}

	o.Keeper = startTestKeeper(t)
	m2 := forkManager(t, o)
	if n, err := m2.Restore(ctx); n != 2 || err != nil {
		t.Fatalf("restore: %d, %v; want 2", n, err)
	}
	for _, p := range []string{recUsed.Workspace, recClean.Workspace} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the left workspace %s is still there after the restore (%v)", p, err)
		}
	}
	rec := m2.loadRecord(used.ID())
	if rec == nil || rec.Snapshot == first.ID || rec.Salvaged == nil || !rec.Hibernated {
		t.Fatalf("record after the restore: %+v, want a new snapshot (not %s), salvaged and hibernated", rec, first.ID)
	}
	if _, err := st.Get(ctx, "alice", first.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("the snapshot the files replaced (%s) is left: %v", first.ID, err)
	}
	back, err := m2.Get("alice", used.ID())
	if err != nil {
		t.Fatal(err)
	}
	got := managedText(t, back, "import os\nsorted(os.listdir('.')), open('early.txt').read(), 'x' in globals(), 'y' in globals()")
	if want := "(['early.txt', 'late.txt'], 'early and later', True, False)"; got != want {
		t.Errorf("woken: %s, want %s (the files as they were, the variables as of the snapshot)", got, want)
	}
	res := back.Restored()
	if res == nil || res.FilesAsOf.IsZero() || !res.AsOf.Equal(first.CreatedAt) || !strings.Contains(res.Lost, "variables set after") {
		t.Fatalf("woken: restored %+v, want files as of the loss, variables as of %v, the variables set since lost", res, first.CreatedAt)
	}
	if sum := res.Summary(); !strings.Contains(sum, "files exact as of ") || !strings.Contains(sum, "(2 files)") {
		t.Errorf("summary %q does not say the files are as of the loss", sum)
	}

	other, err := m2.Get("alice", clean.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, other, "open('early.txt').read(), x"); got != "('early', 1)" {
		t.Errorf("the session not used since its snapshot: %s", got)
	}
	if res := other.Restored(); res == nil || !res.FilesAsOf.IsZero() || res.Lost != "" {
		t.Errorf("the session not used since its snapshot: restored %+v, want it whole from its snapshot", res)
	}
}
