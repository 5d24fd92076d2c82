package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/workspace"
)

// managedRun runs code through the manager's session (a use: Lease).
func managedRun(t *testing.T, ms *Managed, code string) *kernel.Result {
	t.Helper()
	r, err := ms.Execute(context.Background(), kernel.Request{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, r)
	return r
}

// durableSession is a session of alice's in a forking manager that keeps
// session records and automatic snapshots (the manager's options, to
// start another on the same records).
func durableSession(t *testing.T) (*Manager, ManagerOptions, *snapshot.Store, *Managed) {
	t.Helper()
	st, _, _ := snapshotStore(t, nil)
	o := ManagerOptions{Snapshots: st, Records: t.TempDir()}
	m := forkManager(t, o)
	ms, err := m.Create(context.Background(), CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	return m, o, st, ms
}

// lastAutoSnapshot is the manifest of the automatic snapshot ms's record
// names.
func lastAutoSnapshot(t *testing.T, m *Manager, st *snapshot.Store, ms *Managed) *snapshot.Manifest {
	t.Helper()
	rec := m.loadRecord(ms.ID())
	if rec == nil {
		t.Fatalf("session %s has no record", ms.ID())
	}
	man, err := st.Get(context.Background(), ms.Owner, rec.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	return man
}

// TestAutoSnapshotAndRestore: a session used since its last snapshot is
// written again, incrementally (a 1 MB change of a 20 MB workspace
// stores about 1 MB), replacing the automatic snapshot before; one not
// used is not written. A manager that lets go of it (its processes lost)
// leaves its record, and the next manager on the same records brings it
// back on its id, asleep: its wake restores its files exactly and its
// variables as of the snapshot, and says as of when and that what was
// done after it is lost. Deleting it removes its record and snapshot.
func TestAutoSnapshotAndRestore(t *testing.T) {
	ctx := context.Background()
	st, b, _ := snapshotStore(t, nil)
	records := t.TempDir()
	o := ManagerOptions{Snapshots: st, Records: records}
	m := forkManager(t, o)
	ms, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	managedRun(t, ms, "import os\nopen('/workspace/big.bin','wb').write(os.urandom(20<<20))\nv_a = {'k': 1}")
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written, want 1", n)
	}
	first, _ := st.List(ctx, "alice")
	if len(first) != 1 || first[0].Name != autoSnapshotName || !first[0].Held || first[0].Session != ms.ID() {
		t.Fatalf("snapshots after the first automatic one: %+v", first)
	}
	if n := m.SnapshotChanged(ctx, 0); n != 0 {
		t.Errorf("a session not used since its snapshot was written again (%d)", n)
	}
	managedRun(t, ms, "open('/workspace/more.bin','wb').write(os.urandom(1<<20))\nv_b = [1, 2]")
	before := b.put.Load()
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after a change, want 1", n)
	}
	wrote := b.put.Load() - before
	t.Logf("second automatic snapshot after a 1 MiB change of a 21 MiB workspace: %d bytes written", wrote)
	if wrote > 2<<20 {
		t.Errorf("the second automatic snapshot wrote %d bytes after a 1 MiB change: want at most 2 MiB", wrote)
	}
	second, _ := st.List(ctx, "alice")
	if len(second) != 1 || second[0].ID == first[0].ID {
		t.Fatalf("snapshots after the second automatic one: %+v (the first one must be replaced)", second)
	}
	want := wsTree(t, ms.Workspace())
	evs, _, _ := ms.Events().Since(0)
	if types := eventTypes(evs); types != "created snapshot snapshot" || !strings.HasPrefix(evs[2].Reason, "automatic") || evs[2].Snapshot != second[0].ID {
		t.Errorf("events before the loss: %s %+v", types, evs)
	}
	managedRun(t, ms, "v_c = 3") // after the snapshot: lost with the processes
	_, _, next := ms.Events().Since(3)
	m.Detach() // its processes go; its record stays
	// A reader of its events stops waiting (a stream ends, not holding
	// up the server's shutdown), with no close: it goes on elsewhere.
	select {
	case <-next:
	default:
		t.Error("a reader waiting for the session's next event still waits after the server let go of it")
	}
	if evs, ended, _ := ms.Events().Since(3); len(evs) != 0 || !ended {
		t.Errorf("after the server let go: events %+v, ended %v; want none, ended", evs, ended)
	}

	m2, back := restoreOne(t, o, ms)
	if !back.Hibernated() {
		t.Errorf("a restored session is not asleep")
	}
	if _, err := m2.Get("bob", ms.ID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob sees alice's restored session: %v", err)
	}
	// Its history goes on from the server before (its record holds it),
	// with the loss.
	evs, _, _ = back.Events().Since(0)
	if types := eventTypes(evs); types != "created snapshot snapshot lost" || evs[3].Seq != 4 {
		t.Errorf("a restored session's events: %s %+v", types, evs)
	} else if e := evs[3]; e.State != StateHibernated || e.Snapshot != second[0].ID ||
		!strings.Contains(e.Reason, "the server restarted") || !strings.Contains(e.Reason, "lost: what was done") {
		t.Errorf("the loss: %+v", e)
	}
	res, err := back.Wake(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if evs, _, _ = back.Events().Since(4); len(evs) != 1 || evs[0].Type != EventWoken || evs[0].Seq != 5 || evs[0].Restored == nil || evs[0].Restored.Lost != res.Lost {
		t.Errorf("the wake's event: %+v", evs)
	}
	if res.AsOf.IsZero() || !strings.Contains(res.Lost, "after") || !slices.Contains(res.Variables, "v_b") {
		t.Errorf("restored %+v: want as_of, what was lost and v_b", res)
	}
	if s := res.Summary(); !strings.Contains(s, "as of ") || !strings.Contains(s, "lost: ") {
		t.Errorf("summary %q", s)
	}
	if d := treeDiff(want, wsTree(t, back.Workspace())); d != "" {
		t.Fatalf("files differ from the snapshot's:\n%s", d)
	}
	if got := managedText(t, back, "v_a, v_b, 'v_c' in globals()"); got != "({'k': 1}, [1, 2], False)" {
		t.Errorf("variables after the restore: %s", got)
	}
	if err := m2.Delete("alice", ms.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(records, ms.ID()+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted session's record is left: %v", err)
	}
	if left, _ := st.List(ctx, "alice"); len(left) != 0 {
		t.Errorf("the deleted session's snapshots are left: %+v", left)
	}
}

// TestWakeByUseIsRecorded wakes a hibernated session by executing in it
// (Managed.Execute: Session.Resume wakes it, as an E2B or MCP call does,
// not Managed.Wake): the manager learns of the wake, so its record says
// awake and the session, used since, is written at the next automatic
// snapshot with what the cell did.
func TestWakeByUseIsRecorded(t *testing.T) {
	ctx := context.Background()
	m, _, st, ms := durableSession(t)
	managedRun(t, ms, "v_a = 1")
	if _, err := ms.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	managedRun(t, ms, "v_b = v_a + 1")
	testutil.WaitFor(t, 60*time.Second, func() error {
		rec := m.loadRecord(ms.ID())
		if rec == nil || rec.Hibernated {
			return fmt.Errorf("the record still says hibernated: %+v", rec)
		}
		return nil
	})
	testutil.WaitFor(t, 60*time.Second, func() error {
		if n := m.SnapshotChanged(ctx, 0); n != 1 {
			return fmt.Errorf("%d automatic snapshots written of a session used after its wake, want 1", n)
		}
		return nil
	})
	man := lastAutoSnapshot(t, m, st, ms)
	if man.State == nil || !strings.Contains(string(man.State.Manifest), "v_b") {
		t.Errorf("the automatic snapshot after the wake does not hold v_b: %+v", man.State)
	}
}

// TestFilesChangeAfterSnapshotIsWritten: a file written through the
// session's workspace handle after an automatic snapshot started (the
// handle was opened before it: a use, which that snapshot counted) makes
// the session due again, so the next automatic snapshot holds the file and
// a restore after the processes are lost brings it back. Before, opening
// the handle was the only use noted: the write after it was lost.
func TestFilesChangeAfterSnapshotIsWritten(t *testing.T) {
	ctx := context.Background()
	m, o, _, ms := durableSession(t)
	ws, err := ms.Files(workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after the files were opened, want 1", n)
	}
	if _, err := ws.Write("kept.txt", strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after a file was written, want 1", n)
	}
	m.Detach()

	_, back := restoreOne(t, o, ms)
	if _, err := back.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(back.Workspace(), "kept.txt")); string(b) != "kept" {
		t.Errorf("kept.txt after the restore: %q, %v", b, err)
	}
}

// TestCommandRunningIsAUse: a command (a terminal, a server) may change
// the files at any time while it runs: the session stays due for
// automatic snapshots until it ends, and its end is a use, so the next
// snapshot holds what it wrote last. Before, only its start was a use: a
// snapshot taken while it ran was the last.
func TestCommandRunningIsAUse(t *testing.T) {
	ctx := context.Background()
	m, _, st, ms := durableSession(t)
	in, typed := io.Pipe()
	p, err := ms.StartCommand(ctx, Command{Path: "/bin/sh", Args: []string{"sh", "-c", "read a; echo \"$a\" > /workspace/late.txt"}, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { p.Wait(); close(ended) }()
	for i := range 2 {
		if n := m.SnapshotChanged(ctx, 0); n != 1 {
			t.Fatalf("snapshot %d while the command runs: %d written, want 1", i+1, n)
		}
	}
	fmt.Fprintln(typed, "late")
	typed.Close()
	<-ended
	// Written again until nothing runs and nothing was used since.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := m.SnapshotChanged(ctx, 0); n != 0 {
			return fmt.Errorf("%d automatic snapshots written: the session is still due", n)
		}
		return nil
	})
	man := lastAutoSnapshot(t, m, st, ms)
	if !slices.ContainsFunc(man.Files, func(f snapshot.File) bool { return f.Path == "late.txt" }) {
		t.Errorf("the last automatic snapshot lacks late.txt: %+v", man.Files)
	}
}

// TestBackgroundWorkIsAUse: a thread a cell left running writes a file
// later, without any call on the session: its sandbox's CPU time says it
// ran, so the next automatic snapshot holds the file. An idle sandbox (a
// sleeping thread's wake-ups included) is not written again.
func TestBackgroundWorkIsAUse(t *testing.T) {
	ctx := context.Background()
	m, _, st, ms := durableSession(t)
	managedRun(t, ms, `import os, threading, time
def later():
    while not os.path.exists('/tmp/go'):
        time.sleep(0.02)
    n = sum(range(3_000_000))
    open('/workspace/late.txt', 'w').write(str(n))
threading.Thread(target=later, daemon=True).start()`)
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after the cell, want 1", n)
	}
	// Quiet, once what the snapshot made the kernel do is done.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := m.SnapshotChanged(ctx, 0); n != 0 {
			return fmt.Errorf("%d automatic snapshots written of a sandbox whose thread sleeps, want 0", n)
		}
		return nil
	})
	tmp, err := ms.TmpFiles(workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmp.Write("go", strings.NewReader(""))
	tmp.Close()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		_, err := os.Stat(filepath.Join(ms.Workspace(), "late.txt"))
		return err
	})
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after the thread wrote a file, want 1", n)
	}
	if rec := m.loadRecord(ms.ID()); rec == nil || !rec.UsedAt.IsZero() {
		t.Errorf("the record after the snapshot: %+v", rec)
	}
	man := lastAutoSnapshot(t, m, st, ms)
	if !slices.ContainsFunc(man.Files, func(f snapshot.File) bool { return f.Path == "late.txt" }) {
		t.Errorf("the automatic snapshot lacks late.txt: %+v", man.Files)
	}
}

// TestKernelDeathLosesNoFile: a session whose kernel died (a crash, the
// memory limit) after writing files was not written again until its next
// use, so a host lost meanwhile lost those files. Now, once the kernel has
// been seen dead for deadGrace (a keeper's death is KeeperDied's), its
// files as they are go to an automatic snapshot with the variables of its
// latest one; a server restored from the records brings them back and
// says the variables are older than the files and why the newer were lost.
func TestKernelDeathLosesNoFile(t *testing.T) {
	ctx := context.Background()
	m, o, st, ms := durableSession(t)
	managedText(t, ms, "x = 1\nopen('early.txt', 'w').write('early')")
	ms.markUsed()
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written, want 1", n)
	}
	first := lastAutoSnapshot(t, m, st, ms)
	r := runCode(t, ms.Session, "y = 2\nopen('late.txt', 'w').write('late')\nimport os\nos._exit(1)")
	ms.markUsed()
	if ms.Session.Err() == nil {
		t.Fatalf("the kernel lives on after os._exit: %+v", r)
	}
	if n := m.SnapshotChanged(ctx, 0); n != 0 {
		t.Fatalf("%d automatic snapshots written as soon as the kernel died, want 0 (it waits %v)", n, deadGrace)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := m.SnapshotChanged(ctx, 0); n != 1 {
			return errors.New("no automatic snapshot of the session whose kernel died")
		}
		return nil
	})
	rec := m.loadRecord(ms.ID())
	if rec == nil || rec.Salvaged == nil || !rec.Salvaged.VariablesAsOf.Equal(first.CreatedAt) || !strings.Contains(rec.Salvaged.Lost, "kernel died") {
		t.Fatalf("record: %+v, want a salvage note: variables as of %v, the kernel's death", rec, first.CreatedAt)
	}
	if _, err := st.Get(ctx, "alice", first.ID); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("the snapshot replaced (%s) is left: %v", first.ID, err)
	}
	if n := m.SnapshotChanged(ctx, 0); n != 0 {
		t.Errorf("%d more automatic snapshots with nothing changed, want 0", n)
	}
	m.Detach()

	_, back := restoreOne(t, o, ms)
	got := managedText(t, back, "import os\nsorted(os.listdir('.')), 'x' in globals(), 'y' in globals()")
	if want := "(['early.txt', 'late.txt'], True, False)"; got != want {
		t.Errorf("restored: %s, want %s", got, want)
	}
	res := back.Restored()
	if res == nil || res.FilesAsOf.IsZero() || !res.AsOf.Equal(first.CreatedAt) || !strings.Contains(res.Lost, "kernel died") {
		t.Errorf("restored %+v: want files as of the salvage, variables as of %v, the kernel's death said", res, first.CreatedAt)
	}
}

// restoreOne starts a manager on o (the records of a manager detached
// before) and restores ms, the one session they hold.
func restoreOne(t *testing.T, o ManagerOptions, ms *Managed) (*Manager, *Managed) {
	t.Helper()
	m2 := forkManager(t, o)
	if n, err := m2.Restore(context.Background()); n != 1 || err != nil {
		t.Fatalf("restore: %d, %v", n, err)
	}
	back, err := m2.Get(ms.Owner, ms.ID())
	if err != nil {
		t.Fatal(err)
	}
	return m2, back
}

// TestWriteDuringSnapshotKeepsItDue: a file changed while an automatic
// snapshot is written (after its walk passed), by work that then uses no
// CPU, was in no snapshot: the session was marked clean and nothing made
// it due again. The workspace is now checked for changes made meanwhile
// (the write here comes from the host, at the worst moment: after the
// snapshot is written, before the session is marked).
func TestWriteDuringSnapshotKeepsItDue(t *testing.T) {
	ctx := context.Background()
	m, _, st, ms := durableSession(t)
	managedRun(t, ms, "open('a.txt', 'w').write('a')")
	wrote := false
	snapshotWrittenHook = func(dir string) {
		if !wrote {
			wrote = true
			if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("changed"), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() { snapshotWrittenHook = nil })
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after the cell, want 1", n)
	}
	if rec := m.loadRecord(ms.ID()); rec == nil || rec.UsedAt.IsZero() {
		t.Fatalf("record after a snapshot the workspace changed under: %+v, want it still due (used_at set)", rec)
	}
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written after the change, want 1", n)
	}
	man := lastAutoSnapshot(t, m, st, ms)
	if i := slices.IndexFunc(man.Files, func(f snapshot.File) bool { return f.Path == "a.txt" }); i < 0 || man.Files[i].Size != int64(len("changed")) {
		t.Errorf("the automatic snapshot's a.txt: %+v, want the changed one", man.Files)
	}
	// Nothing changed since: quiet.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := m.SnapshotChanged(ctx, 0); n != 0 {
			return fmt.Errorf("%d automatic snapshots written with nothing changed, want 0", n)
		}
		return nil
	})
}

// TestChangedSince: an entry changed since the snapshot started is a
// change only if the snapshot does not hold it as it is: files written
// just before (in the same tick of the file clock) are not, a rewrite, a
// removal, a new entry or a chmod after the walk are.
func TestChangedSince(t *testing.T) {
	st, _, _ := snapshotStore(t, nil)
	for _, c := range []struct {
		name   string
		change func(dir string) error
		want   bool
	}{
		{"nothing", func(string) error { return nil }, false},
		{"rewritten", func(dir string) error { return os.WriteFile(filepath.Join(dir, "a.txt"), []byte("longer"), 0o644) }, true},
		{"removed", func(dir string) error { return os.Remove(filepath.Join(dir, "sub", "b.txt")) }, true},
		{"added", func(dir string) error { return os.WriteFile(filepath.Join(dir, "sub", "c.txt"), nil, 0o644) }, true},
		{"chmod", func(dir string) error { return os.Chmod(filepath.Join(dir, "a.txt"), 0o600) }, true},
		{"mkdir", func(dir string) error { return os.Mkdir(filepath.Join(dir, "d"), 0o755) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			since := fileClock() // the files below are changed after it, as if just before the snapshot
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			for p, s := range map[string]string{"a.txt": "a", "sub/b.txt": "b"} {
				if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ws, err := OpenWorkspace(dir, workspace.Options{})
			if err != nil {
				t.Fatal(err)
			}
			man, err := st.Write(context.Background(), "o", snapshot.WorkspaceSource(ws), nil)
			ws.Close()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.change(dir); err != nil {
				t.Fatal(err)
			}
			if got := changedSince(dir, since, man); got != c.want {
				t.Errorf("changedSince = %v, want %v", got, c.want)
			}
		})
	}
}

// TestShelve: a server that shuts down without a keeper, its sessions
// durable, hibernates each of them (a running cell interrupted first) and
// leaves it to its record: the next manager on the same records brings
// every one back asleep, and its wake restores all its variables and
// files, those set after its last automatic snapshot too (nothing is lost
// to the restart), and says what could not come back.
func TestShelve(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	o := ManagerOptions{Snapshots: st, Records: t.TempDir()}
	m := forkManager(t, o)
	idle, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	managedRun(t, idle, "open('kept.txt', 'w').write('files')\nx = 41\ng = (i for i in range(3))")
	if n := m.SnapshotChanged(ctx, 0); n != 1 {
		t.Fatalf("%d automatic snapshots written, want 1", n)
	}
	managedRun(t, idle, "x += 1\nopen('later.txt', 'w').write('after the snapshot')") // after it: kept too
	started := make(chan struct{})
	var once sync.Once
	ran := make(chan *kernel.Result, 1)
	go func() {
		r, _ := busy.Execute(ctx, kernel.Request{Code: "import time\ny = 7\nprint('in', flush=True)\ntime.sleep(60)"}, func(ev kernel.Event) {
			if ev.Type == kernel.EventStdout {
				once.Do(func() { close(started) })
			}
		})
		ran <- r
	}()
	<-started
	n, err := m.Shelve(ctx)
	if n != 2 || err != nil {
		t.Fatalf("shelve: %d asleep, %v; want 2", n, err)
	}
	if r := <-ran; r == nil || r.Status != kernel.StatusInterrupted {
		t.Errorf("the running cell: %+v, want interrupted", r)
	}
	m2 := forkManager(t, o)
	if n, err := m2.Restore(ctx); n != 2 || err != nil {
		t.Fatalf("restore: %d, %v; want 2", n, err)
	}
	back, err := m2.Get("alice", idle.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !back.Hibernated() {
		t.Fatal("a shelved session came back awake")
	}
	evs, _, _ := back.Events().Since(0)
	if len(evs) < 2 || !strings.Contains(evs[len(evs)-2].Reason, "the server shut down") || !strings.Contains(evs[len(evs)-1].Reason, "nothing was lost") {
		t.Errorf("its events: %+v", evs)
	}
	res, err := back.Wake(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Variables, "x") || len(res.NotRestored) != 1 || !strings.HasPrefix(res.NotRestored[0], "g:") {
		t.Errorf("what came back: %+v", res)
	}
	if got := managedText(t, back, "x, open('kept.txt').read(), open('later.txt').read()"); got != "(42, 'files', 'after the snapshot')" {
		t.Errorf("after the restart: %q", got)
	}
	other, err := m2.Get("alice", busy.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, other, "y"); got != "7" {
		t.Errorf("the interrupted session's y: %q", got)
	}
}
