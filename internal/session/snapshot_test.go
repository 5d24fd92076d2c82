package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
)

// countingBackend is the real directory backend, counting the bytes Put
// and able to fail a Put on cue (a Write stopped mid-way).
type countingBackend struct {
	*snapshot.Dir
	put     atomic.Int64
	puts    atomic.Int64
	failAt  atomic.Int64 // the Put of this number (1-based) fails; 0: none
	failErr error
}

func (c *countingBackend) Put(ctx context.Context, key string, data []byte) error {
	n := c.puts.Add(1)
	if f := c.failAt.Load(); f > 0 && n >= f {
		return c.failErr
	}
	c.put.Add(int64(len(data)))
	return c.Dir.Put(ctx, key, data)
}

func snapshotStore(t testing.TB, o *snapshot.Options) (*snapshot.Store, *countingBackend, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := snapshot.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := &countingBackend{Dir: d, failErr: errors.New("storage failed on cue")}
	st, err := snapshot.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	return st, b, dir
}

// TestSnapshotRoundTrip: a session's files come back exactly in a new
// session started from its snapshot, its variables as far as they
// serialize, and the report names what did not; another owner's id is
// not found.
func TestSnapshotRoundTrip(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	src, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, src.Session, `
import os, json
v_x = {"k": [1, 2, 3]}
v_gen = (i for i in range(3))
os.makedirs("/workspace/sub/deep", exist_ok=True)
open("/workspace/f.txt", "w").write("hello")
open("/workspace/sub/data.bin", "wb").write(os.urandom(300000))
os.chmod("/workspace/sub/data.bin", 0o600)
os.symlink("f.txt", "/workspace/link")
`))
	want := wsTree(t, src.Workspace())
	man, err := m.Snapshot(ctx, "alice", src.ID(), "first")
	if err != nil {
		t.Fatal(err)
	}
	if man.Name != "first" || man.Session != src.ID() || man.State == nil || !strings.Contains(string(man.State.Manifest), `"v_gen"`) {
		t.Fatalf("manifest %+v (state %s): want the name, the session and v_gen among the names not saved", man, man.State.Manifest)
	}
	if _, err := m.Snapshot(ctx, "bob", src.ID(), ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob snapshots alice's session: %v", err)
	}
	if _, err := m.Create(ctx, CreateOptions{Owner: "bob", Snapshot: man.ID}); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("bob starts from alice's snapshot: %v", err)
	}
	// The source changes after the snapshot: the copy has the old state.
	mustOK(t, runCode(t, src.Session, "v_x['k'].append(4)\nopen('/workspace/f.txt','w').write('changed')"))

	dst, err := m.Create(ctx, CreateOptions{Owner: "alice", Snapshot: man.ID})
	if err != nil {
		t.Fatal(err)
	}
	if d := treeDiff(want, wsTree(t, dst.Workspace())); d != "" {
		t.Fatalf("files differ from the snapshot's:\n%s", d)
	}
	if got := managedText(t, dst, "v_x, json.dumps(1)"); got != "({'k': [1, 2, 3]}, '1')" {
		t.Errorf("variables: %s", got)
	}
	res := dst.Restored()
	if res == nil || res.Snapshot != man.ID || res.From != "snapshot "+man.ID || !slices.Contains(res.Variables, "v_x") || res.Files != 2 {
		t.Fatalf("restored %+v", res)
	}
	if !strings.Contains(strings.Join(res.NotRestored, "\n"), "v_gen") || !strings.Contains(res.Summary(), "not restorable: v_gen") {
		t.Errorf("the report does not name v_gen: %+v / %s", res.NotRestored, res.Summary())
	}
	if _, err := m.Create(ctx, CreateOptions{Owner: "alice", Snapshot: "snap-doesnotexist0"}); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("a missing snapshot: %v", err)
	}
}

// TestSnapshotDedup: the second snapshot after a 1 MB change of a 20 MB
// workspace writes little (counted at the storage).
func TestSnapshotDedup(t *testing.T) {
	ctx := context.Background()
	st, b, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, Max: bigDisk(), Defaults: bigDisk()})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, `
import os
open("/workspace/big.bin", "wb").write(os.urandom(20 << 20))
v_arr = bytes(os.urandom(4 << 20))
`))
	if _, err := m.Snapshot(ctx, "alice", s.ID(), ""); err != nil {
		t.Fatal(err)
	}
	first := b.put.Load()
	mustOK(t, runCode(t, s.Session, `
with open("/workspace/big.bin", "r+b") as f:
    f.seek(9 << 20); f.write(os.urandom(1 << 20))
`))
	b.put.Store(0)
	man, err := m.Snapshot(ctx, "alice", s.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	second := b.put.Load()

	t.Logf("first snapshot wrote %d bytes, the second after a 1 MB change %d (manifest's new_bytes %d)", first, second, man.NewBytes)
	if first < 20<<20 {
		t.Errorf("the first snapshot wrote %d bytes: random data does not compress", first)
	}
	if second > 5<<20 {
		t.Errorf("the second snapshot wrote %d bytes, want at most 5 MiB", second)
	}
}

func bigDisk() (l jail.Limits) {
	l.Memory, l.Disk = 512<<20, 128<<20
	return l
}

// TestSnapshotCorruptRefused: a snapshot with a damaged blob is refused
// with a CorruptError, and no session is left half-restored.
func TestSnapshotCorruptRefused(t *testing.T) {
	ctx := context.Background()
	st, _, dir := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "import os\nopen('/workspace/a.bin','wb').write(os.urandom(200000))\nv_y = 7"))
	man, err := m.Snapshot(ctx, "alice", s.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"file", "state"} {
		t.Run(part, func(t *testing.T) {
			var c snapshot.Chunk
			if part == "file" {
				for _, f := range man.Files {
					if f.Path == "a.bin" {
						c = f.Chunks[0]
					}
				}
			} else {
				c = man.State.Chunks[0]
			}
			p := filepath.Join(dir, "blobs", c.Hash[:2], c.Hash)
			good, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			bad := slices.Clone(good)
			bad[len(bad)/2] ^= 0xff
			if err := os.WriteFile(p, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(p, good, 0o600)
			before := len(m.List("alice"))
			_, err = m.Create(ctx, CreateOptions{Owner: "alice", Snapshot: man.ID})
			var ce *snapshot.CorruptError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "nothing was restored") {
				t.Fatalf("a corrupted %s blob: %v, want a CorruptError", part, err)
			}
			if n := len(m.List("alice")); n != before {
				t.Errorf("%d sessions after a refused restore, %d before: a half-restored one is left", n, before)
			}
		})
	}
}

// TestSnapshotStoppedMidWrite: a snapshot whose storage fails half-way
// does not exist, and the one before it is intact and restorable.
func TestSnapshotStoppedMidWrite(t *testing.T) {
	ctx := context.Background()
	st, b, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "import os\nopen('/workspace/a.bin','wb').write(os.urandom(3 << 20))\nv_n = 1"))
	want := wsTree(t, s.Workspace())
	good, err := m.Snapshot(ctx, "alice", s.ID(), "good")
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "open('/workspace/a.bin','wb').write(os.urandom(3 << 20))\nv_n = 2"))
	b.failAt.Store(b.puts.Load() + 2) // a blob or two of the new one, then the storage fails
	if _, err := m.Snapshot(ctx, "alice", s.ID(), "bad"); err == nil {
		t.Fatal("a snapshot whose storage failed was written")
	}
	b.failAt.Store(0)
	list, err := st.List(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != good.ID {
		t.Fatalf("snapshots after a failed write: %d, want only %s", len(list), good.ID)
	}
	dst, err := m.Create(ctx, CreateOptions{Owner: "alice", Snapshot: good.ID})
	if err != nil {
		t.Fatal(err)
	}
	if d := treeDiff(want, wsTree(t, dst.Workspace())); d != "" {
		t.Fatalf("files differ:\n%s", d)
	}
	if got := managedText(t, dst, "v_n"); got != "1" {
		t.Errorf("v_n = %s", got)
	}
}

// TestSnapshotQuota: an owner's snapshots stop at the quota, with the
// reason.
func TestSnapshotQuota(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, &snapshot.Options{Quota: 2 << 20})
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "import os\nopen('/workspace/a.bin','wb').write(os.urandom(3 << 20))"))
	_, err = m.Snapshot(ctx, "alice", s.ID(), "")
	var qe *snapshot.QuotaError
	if !errors.As(err, &qe) || !strings.Contains(err.Error(), "delete old snapshots") {
		t.Fatalf("over the quota: %v", err)
	}
}

// soakCycles is how many hibernate/wake cycles TestHibernateSoak runs:
// SANDLOOP_SOAK_CYCLES (make load: 1000), else 50.
func soakCycles(t *testing.T) int {
	if v := os.Getenv("SANDLOOP_SOAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SANDLOOP_SOAK_CYCLES=%q: want a number of cycles", v)
		}
		return n
	}
	return 50
}

// TestHibernateSoak: many hibernate/wake cycles on one id lose no file
// (hashes compared after every wake) and no variable; each wake is
// transparent (the next call restores it) and says what came back.
func TestHibernateSoak(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, `
import os, hashlib
os.makedirs("/workspace/d/e", exist_ok=True)
open("/workspace/d/e/base.bin", "wb").write(os.urandom(1 << 20))
v_count = 0
`))
	id := s.ID()
	n := soakCycles(t)
	for i := range n {
		// A change each cycle: a new file, a rewritten one, a removed one.
		mustOK(t, runCode(t, s.Session, fmt.Sprintf(`
open("/workspace/c%d.txt", "w").write("cycle %d " * 100)
open("/workspace/d/e/base.bin", "r+b").write(os.urandom(4096))
if os.path.exists("/workspace/c%d.txt"): os.remove("/workspace/c%d.txt")
v_count += 1
`, i, i, i-2, i-2)))
		want := wsTree(t, s.Workspace())
		if _, err := s.Hibernate(ctx); err != nil {
			t.Fatalf("cycle %d: hibernate: %v", i, err)
		}
		if s.State() != StateHibernated {
			t.Fatalf("cycle %d: state %s", i, s.State())
		}
		if left := wsTree(t, s.Workspace()); len(left) != 0 {
			t.Fatalf("cycle %d: the hibernated workspace still holds %d entries", i, len(left))
		}
		var res *Restored
		if i%2 == 0 {
			// A request wakes it (Files, as GET .../files does).
			w, err := s.Files(workspace.Options{})
			if err != nil {
				t.Fatalf("cycle %d: files: %v", i, err)
			}
			w.Close()
			res = s.Restored()
		} else if res, err = s.Wake(ctx); err != nil {
			t.Fatalf("cycle %d: wake: %v", i, err)
		}
		if s.ID() != id || s.State() != StateRunning {
			t.Fatalf("cycle %d: id %s state %s after the wake", i, s.ID(), s.State())
		}
		if res == nil || res.From != "hibernation" || !slices.Contains(res.Variables, "v_count") {
			t.Fatalf("cycle %d: restored %+v", i, res)
		}
		if d := treeDiff(want, wsTree(t, s.Workspace())); d != "" {
			t.Fatalf("cycle %d: files lost or changed:\n%s", i, d)
		}
		if got := managedText(t, s, "v_count"); got != strconv.Itoa(i+1) {
			t.Fatalf("cycle %d: v_count = %s", i, got)
		}
	}
	// Nothing held is left once awake: every hibernation's snapshot was
	// deleted at its wake.
	if list, err := st.List(ctx, "alice"); err != nil || len(list) != 0 {
		t.Errorf("%d snapshots left after %d cycles (%v)", len(list), n, err)
	}
}

// TestIdleHibernate: the reaper hibernates a session idle past
// IdleHibernate (and a paused one, pinned or not), and an execution wakes
// it; closing a hibernated session deletes its snapshot.
func TestIdleHibernate(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, IdleHibernate: time.Minute, ReapInterval: time.Hour})
	idle, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	paused.Pin()
	busy, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Managed{idle, paused} {
		mustOK(t, runCode(t, s.Session, "v_a = 41\nopen('/workspace/x','w').write('x')"))
	}
	if err := paused.Pause(); err != nil {
		t.Fatal(err)
	}
	release := busy.Lease()
	m.Reap(time.Now().Add(2 * time.Minute))
	if idle.State() != StateHibernated || paused.State() != StateHibernated || busy.State() != StateRunning {
		t.Fatalf("states after the reap: idle %s, paused %s, leased %s", idle.State(), paused.State(), busy.State())
	}
	release()
	if st := m.Stats(); st.Hibernated != 2 || st.Busy() != 1 {
		t.Errorf("stats %+v: want 2 hibernated, 1 busy", st)
	}
	r, err := idle.Execute(ctx, kernel.Request{Code: "v_a + 1, open('/workspace/x').read()"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := mainText(r); got != "(42, 'x')" {
		t.Errorf("after the wake: %s", got)
	}
	if list, _ := st.List(ctx, "alice"); len(list) != 1 {
		t.Fatalf("%d snapshots held, want the paused one's only", len(list))
	}
	if err := paused.Close(); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.List(ctx, "alice"); len(list) != 0 {
		t.Errorf("closing a hibernated session left its snapshot (%d)", len(list))
	}
}

// Restart of a hibernated session: its files come back (the wake), its
// variables do not (a restart), and it runs.
func TestRestartHibernated(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "v_a = 1\nopen('/workspace/keep.txt','w').write('kept')"))
	if _, err := s.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, s, "'v_a' in globals(), open('/workspace/keep.txt').read()"); got != "(False, 'kept')" {
		t.Errorf("after the restart of a hibernated session: %s", got)
	}
	if s.State() != StateRunning {
		t.Errorf("state %s", s.State())
	}
}

// Past MaxPaused, a pause hibernates the session instead (it keeps no
// memory), with a snapshot store; the next call wakes it.
func TestPausePastCapHibernates(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, MaxPaused: 1})
	a, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, b.Session, "v_b = 2"))
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(); err != nil {
		t.Fatalf("a pause past the cap: %v", err)
	}
	if a.State() != StatePaused || b.State() != StateHibernated {
		t.Fatalf("states: %s, %s; want paused, hibernated", a.State(), b.State())
	}
	if got := managedText(t, b, "v_b"); got != "2" {
		t.Errorf("after the wake: %s", got)
	}
}
