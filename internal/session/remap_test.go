package session

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// remapDigest is the SHA-256 of every buffer of the state remapSetup
// makes (and the cells of TestRootForkRemapKeepsWrites change).
const remapDigest = "hashlib.sha256(b''.join([df.to_numpy().tobytes(), a.tobytes()] + [s.tobytes() for s in small])).hexdigest()"

// remapSetup holds a DataFrame's block and a large array (glibc's mmap
// chunks) and small arrays (its heap).
const remapSetup = `import numpy as np, pandas as pd, hashlib, threading, ctypes, gc
df = pd.DataFrame(np.random.default_rng(1).random((1 << 18, 8)), columns=["c%d" % i for i in range(8)])
a = np.arange(5 << 20, dtype=np.float64)  # 40 MiB: above glibc's largest mmap threshold, always a mapping of its own
small = [np.full(12_000, float(i)) for i in range(64)]
`

// remapCovered counts the small arrays in the brk heap, and those whose
// second page lies in a mapping of a state file.
const remapCovered = `_maps = [(int(l.split()[0].split("-")[0], 16), int(l.split()[0].split("-")[1], 16), l) for l in open("/proc/self/maps")]
_heap = [m for m in _maps if m[2].rstrip().endswith("[heap]")]
_r = (sum(1 for s in small if _heap[0][0] <= s.ctypes.data < _heap[-1][1]), sum(1 for s in small if any(lo <= s.ctypes.data + 4096 < hi for lo, hi, p in _maps if "memfd:sandloop-fork" in p)))
del _maps, _heap
_r`

// TestRootForkRemapKeepsWrites forks a root session again and again, its
// buffers remapped from each fork's export in between (remapLater), with
// writes of every kind before each fork: each child's buffers equal the
// parent's at the fork, and the parent's never change by a remap, even
// when it wrote them after the export and before the remap.
func TestRootForkRemapKeepsWrites(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	// Auto checkpoints: a fork of the kernel before every cell, over
	// remapped memory.
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice", Checkpoints: CheckpointsAuto})
	if err != nil {
		t.Fatal(err)
	}
	ps := parent.Session
	mustOK(t, runCode(t, ps, remapSetup))
	fork := func(step string) {
		t.Helper()
		want := managedText(t, parent, remapDigest)
		kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := managedText(t, kids[0], remapDigest); got != want {
			t.Errorf("%s: the child's buffers %s, the parent's at the fork %s", step, got, want)
		}
		kids[0].Close()
		ps.remapWait()
		if got := managedText(t, parent, remapDigest); got != want {
			t.Errorf("%s: the parent's buffers changed by the remap: %s, were %s", step, got, want)
		}
	}
	fork("first fork")
	if ps.remap.bytes.Load() < 54<<20 {
		t.Fatalf("first fork: %d bytes remapped, want the DataFrame's and a's 56 MiB", ps.remap.bytes.Load())
	}
	// Not the small arrays (glibc's brk heap, below its mmap threshold).
	if got := managedText(t, parent, remapCovered); got != "(64, 0)" {
		t.Errorf("first fork: (small arrays on the heap, remapped) %s, want (64, 0)", got)
	}
	fork("unchanged")
	if last := ps.remap.last.Load(); last.MappedBytes < 56<<20 {
		t.Errorf("unchanged: the export proved %d bytes equal by their pages (%d by comparing), want the remapped 56 MiB", last.MappedBytes, last.ComparedBytes)
	}
	for _, c := range []struct{ step, code string }{
		{"a slice of the DataFrame", "df.iloc[1000:3000, 2] = -1.0"},
		{"a whole column", "df['c5'] = df['c5'] * 2"},
		{"freed and allocated again", "del a\na = np.full(5 << 20, 7.0)"},
		{"realloc (mremap) of a remapped chunk", "a.resize(6 << 20, refcheck=False)\na[-1] = 3.0"},
		{"heap freed, trimmed (MADV_DONTNEED) and calloc'd", "del small[::2]\ngc.collect()\nctypes.CDLL(None).malloc_trim(0)\nz = [np.zeros(12_000) for _ in range(40)]\nassert not any(x.any() for x in z), 'calloc gave bytes that are not zero'\nsmall += z\ndel z"},
	} {
		mustOK(t, runCode(t, ps, c.code))
		fork(c.step)
	}

	// Written after the export, before the remap: the pages written
	// stay the parent's (the comparison finds them changed). All of it
	// changed first, so that the export copies it (a remap follows).
	mustOK(t, runCode(t, ps, "a += 0.5\ndf.iloc[:, :] = df.to_numpy() + 1.0"))
	before := ps.remap.bytes.Load()
	remapBefore = func(s *Session) {
		if s == ps {
			if r, err := s.Execute(ctx, kernel.Request{Code: "a[::65536] += 1.0\ndf.iloc[::4096, 1] = 5.0"}, nil); err != nil || r.Status != kernel.StatusOK {
				t.Errorf("the write between the export and the remap: %v %+v", err, r)
			}
		}
	}
	want := managedText(t, parent, remapDigest)
	kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, kids[0], remapDigest); got != want {
		t.Errorf("written before the remap: the child's buffers %s, the parent's at the fork %s", got, want)
	}
	kids[0].Close()
	ps.remapWait()
	remapBefore = nil
	after := managedText(t, parent, remapDigest)
	if after == want || managedText(t, parent, "float(df.iloc[4096, 1]), float(a[65536]), float(a[512])") != "(5.0, 8.5, 7.5)" {
		t.Errorf("written before the remap: the parent lost its write (digest %s, as exported %s)", after, want)
	}
	if ps.remap.bytes.Load() == before {
		t.Errorf("written before the remap: nothing was remapped (the pages not written should be)")
	}

	// A thread of the user's: no remap while it lives; its write after
	// the fork is the parent's alone.
	mustOK(t, runCode(t, ps, "ev = threading.Event()\nth = threading.Thread(target=lambda: (ev.wait(), a.__setitem__(7, -7.0)))\nth.start()\ndf.iloc[5, 5] = 1.5"))
	before = ps.remap.bytes.Load()
	fork("a background thread waiting")
	if ps.remap.bytes.Load() != before {
		t.Errorf("a background thread waiting: %d bytes remapped while it lived", ps.remap.bytes.Load()-before)
	}
	mustOK(t, runCode(t, ps, "ev.set()\nth.join()\ndel th, ev"))
	if got := managedText(t, parent, "float(a[7])"); got != "-7.0" {
		t.Errorf("the thread's write: a[7] = %s", got)
	}
	fork("after the thread's write")

	// A checkpoint and a restore over remapped memory.
	mustOK(t, runCode(t, ps, "df.iloc[7, 7] = 2.5"))
	want = managedText(t, parent, remapDigest)
	if _, err := ps.Checkpoint(ctx, "mark"); err != nil {
		t.Fatal(err)
	}
	cps := ps.Checkpoints()
	fork("after a checkpoint")
	mustOK(t, runCode(t, ps, "a[:] = 0.0\ndf.iloc[:, :] = 0.0"))
	if _, err := ps.RestoreCheckpoint(ctx, cps[len(cps)-1].ID); err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, parent, remapDigest); got != want {
		t.Errorf("restored over remapped memory: %s, at the checkpoint %s", got, want)
	}
	fork("after a restore")
	// Undo (the auto checkpoint of the cell's start) over remapped memory.
	want = managedText(t, parent, remapDigest)
	mustOK(t, runCode(t, ps, "a[:5] = 99.0\ndf.iloc[:3, :] = 99.0"))
	if _, err := ps.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, parent, remapDigest); got != want {
		t.Errorf("undone over remapped memory: %s, before the cell %s", got, want)
	}
	fork("after an undo")
	if s := managedText(t, parent, "sum(1 for l in open('/proc/self/maps') if 'memfd:sandloop-fork' in l) > 0"); !strings.Contains(s, "True") {
		t.Errorf("no mapping of a state file in the parent after its forks")
	}
}

func TestRemapPieces(t *testing.T) {
	page := uint64(4096)
	const max = 8 << 20
	in := [][3]uint64{{page + 16, 16, 3 * max}, {1 << 40, 200 * page, 96000}, {1 << 41, 400 * page, max - 1000}}
	pieces := remapPieces(in, max)
	var total uint64
	next := in[0][0]
	for i, p := range pieces {
		var size uint64
		for _, r := range p {
			size += r[2]
			if r[0]-in[0][0] != r[1]-in[0][1] && r[0] < in[1][0] {
				t.Errorf("piece %d: address %x and offset %x moved apart", i, r[0], r[1])
			}
			if r[0] < in[1][0] {
				if r[0] != next {
					t.Errorf("piece %d starts at %x, want %x", i, r[0], next)
				}
				next = r[0] + r[2]
				if r[0] != in[0][0] && r[0]%page != 0 {
					t.Errorf("piece %d cut at %x, not a page boundary", i, r[0])
				}
			}
		}
		if size > 2*max {
			t.Errorf("piece %d: %d bytes", i, size)
		}
		total += size
	}
	if want := in[0][2] + in[1][2] + in[2][2]; total != want || next != in[0][0]+in[0][2] {
		t.Errorf("pieces cover %d bytes, want %d", total, want)
	}
	if len(pieces) != 4 {
		t.Errorf("%d pieces: %v", len(pieces), pieces)
	}
}

func TestRemapValid(t *testing.T) {
	for _, c := range []struct {
		remap [][3]uint64
		ok    bool
	}{
		{[][3]uint64{{0x1010, 0x10, 100}, {0x9000, 200, 50}}, true},
		{[][3]uint64{{0x1010, 0x10, 100}, {0x9000, 100, 50}}, false}, // overlaps the one before
		{[][3]uint64{{0x1010, 0x10, 0}}, false},                      // empty
		{[][3]uint64{{0x1010, 0x10, 1 << 62}}, false},                // past the file
		{[][3]uint64{{0x1010, 1 << 63, 1 << 63}}, false},             // past the file, wrapping
		{[][3]uint64{{0x1010, 900, 100}}, true},                      // up to its end
	} {
		if got := remapValid(c.remap, 1000); got != c.ok {
			t.Errorf("remapValid(%v, 1000) = %v, want %v", c.remap, got, c.ok)
		}
	}
}

// A pause right after a fork, while the parent's remap holds its turn,
// waits for that piece and stops the rest, rather than refusing as if an
// execution ran (E2B's SDK may pause a sandbox it has just forked); the
// parent resumes with its values.
func TestPauseStopsTheRemap(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	ps := parent.Session
	mustOK(t, runCode(t, ps, remapSetup))
	want := managedText(t, parent, remapDigest)
	holding := make(chan struct{})
	var once sync.Once
	remapHolding = func(ctx context.Context, s *Session) {
		if s == ps {
			once.Do(func() {
				close(holding)
				// Held until the pause stops the run (a guard against
				// a pause that would not).
				select {
				case <-ctx.Done():
				case <-time.After(30 * time.Second):
				}
			})
		}
	}
	t.Cleanup(func() { remapHolding = nil })
	kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kids[0].Close()
	select {
	case <-holding:
	case <-time.After(2 * time.Minute):
		t.Fatal("the parent's remap never took its turn")
	}
	if err := parent.Pause(); err != nil {
		t.Fatalf("a pause during the fork's remap: %v", err)
	}
	if st := parent.State(); st != StatePaused {
		t.Fatalf("state %q after the pause", st)
	}
	ps.remapWait()
	if got := ps.remap.bytes.Load(); got >= 54<<20 {
		t.Errorf("%d bytes remapped: the remap went on after the pause", got)
	}
	if err := parent.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, parent, remapDigest); got != want {
		t.Errorf("the parent's buffers after the pause: %s, were %s", got, want)
	}
}

// The pages a remap maps are the server's, not charged to the session:
// a session forked again after filling its limit anew is not remapped
// further, so it cannot hold many times its memory limit by forks
// (remapFits).
func TestRemapWithinTheLimit(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	const limit = 320 << 20
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice", Limits: jail.Limits{Memory: limit}})
	if err != nil {
		t.Fatal(err)
	}
	ps := parent.Session
	if _, err := ps.Resources(); err != nil {
		t.Skipf("no cgroup measures the session (%v): RLIMIT_DATA counts the mappings", err)
	}
	mustOK(t, runCode(t, ps, "import numpy as np\na1 = np.full(100 << 17, 1.0)  # 100 MiB"))
	fork := func() {
		t.Helper()
		kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		kids[0].Close()
		ps.remapWait()
	}
	fork()
	first := ps.remap.bytes.Load()
	if first < 90<<20 {
		t.Fatalf("the first fork remapped %d bytes, want a1's 100 MiB", first)
	}
	// Fill the room the remap freed: the charge now nears the limit, and
	// with a1's mapped pages the session holds more than it.
	u, err := ps.Resources()
	if err != nil {
		t.Fatal(err)
	}
	room := (limit - u.Memory - 40<<20) / 8
	if room < 60<<17 {
		t.Fatalf("%d bytes charged after the remap: no room to fill", u.Memory)
	}
	mustOK(t, runCode(t, ps, fmt.Sprintf("a2 = np.full(%d, 2.0)", room)))
	fork()
	if got := ps.remap.bytes.Load(); got != first {
		u, _ := ps.Resources()
		t.Errorf("remapped %d more bytes with %d charged and %d mapped, limit %d", got-first, u.Memory, ps.remap.last.Load().MappedBytes, limit)
	}
	if got := textOf(t, ps, "float(a1.sum() + a2[0])"); got != "13107202.0" { // 100 << 17 ones, and a 2
		t.Errorf("values after the forks: %s", got)
	}
}

// The export cache keeps a chain only within its bound: more bytes in its
// files than that empty it, and the next fork starts a new chain.
func TestExportCacheBound(t *testing.T) {
	var bases []kernel.StateBase
	for i, size := range []int64{3 << 20, 5 << 20} {
		f, err := kernel.NewStateFile("bound")
		if err != nil {
			t.Skip(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		bases = append(bases, kernel.StateBase{Serial: uint64(i + 1), File: f})
	}
	var c exportCache
	defer c.close()
	for _, tc := range []struct {
		bound int64
		kept  int
	}{{0, 2}, {8 << 20, 2}, {8<<20 - 1, 0}, {1 << 30, 2}} {
		c.keep(bases, tc.bound)
		got := c.get()
		closeBases(got)
		if len(got) != tc.kept {
			t.Errorf("bound %d: %d files kept, want %d", tc.bound, len(got), tc.kept)
		}
	}
}
