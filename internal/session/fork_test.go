package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/zygote"
)

func forkManager(t *testing.T, o ManagerOptions) *Manager {
	t.Helper()
	m := NewManager(&o)
	t.Cleanup(func() { m.Close() })
	return m
}

func managedText(t *testing.T, ms *Managed, code string) string {
	t.Helper()
	return textOf(t, ms.Session, code)
}

func testFork(t *testing.T, m *Manager) {
	ctx := context.Background()
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice", Env: map[string]string{"V_ENV": "kept"}, Checkpoints: CheckpointsAuto})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, `
import os, json, random
v_x = {"k": [1, 2, 3]}
v_gen = (i for i in range(3))
def v_f(a): return a * 2
os.makedirs("/workspace/sub", exist_ok=True)
open("/workspace/f.txt", "w").write("parent")
open("/workspace/sub/data.bin", "wb").write(os.urandom(100000))
`))
	parentFiles := wsTree(t, parent.Workspace())
	children, res, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 2 {
		t.Fatalf("%d children", len(children))
	}
	if res.From != "fork of "+parent.ID() || res.Files != 2 || !slices.Contains(res.Variables, "v_x") || !slices.Contains(res.Variables, "json") {
		t.Errorf("restored %+v: want v_x and json among the variables, 2 files", res)
	}
	want, why := ForkFilesSupport()
	if m.opts.ForkFiles == ForkFilesCopy {
		want, why = ForkFilesCopy, "asked for"
	}
	if res.FilesBy != want {
		t.Errorf("files by %q, want %q here (%s)", res.FilesBy, want, why)
	}
	if !strings.Contains(strings.Join(res.NotRestored, "\n"), "v_gen") {
		t.Errorf("not restored %q: want the generator v_gen (it does not serialize)", res.NotRestored)
	}
	for i, c := range children {
		if c.ID() == parent.ID() || c.Workspace() == parent.Workspace() || c.Owner != "alice" {
			t.Fatalf("child %d: %s at %s owned by %q", i, c.ID(), c.Workspace(), c.Owner)
		}
		if c.Limits != parent.Limits || c.Network != parent.Network || c.Egress != parent.Egress || c.ExecTimeout != parent.ExecTimeout {
			t.Errorf("child %d: limits %+v network %q egress %v timeout %v; the parent's: %+v %q %v %v", i, c.Limits, c.Network, c.Egress, c.ExecTimeout, parent.Limits, parent.Network, parent.Egress, parent.ExecTimeout)
		}
		if d := treeDiff(parentFiles, wsTree(t, c.Workspace())); d != "" {
			t.Fatalf("child %d's files differ from the parent's:\n%s", i, d)
		}
		if got := managedText(t, c, "v_x, v_f(21), json.dumps(1), os.environ['V_ENV']"); got != "({'k': [1, 2, 3]}, 42, '1', 'kept')" {
			t.Errorf("child %d: %s", i, got)
		}
		if r := c.Restored(); r == nil || r.From != res.From {
			t.Errorf("child %d keeps no report: %+v", i, r)
		}
		// The parent's workspace is nowhere in the child's jail.
		if got := managedText(t, c, fmt.Sprintf("os.path.exists(%q)", filepath.Join(parent.Workspace(), "f.txt"))); got != "False" {
			t.Errorf("child %d sees its parent's workspace path", i)
		}
	}
	// Writes in one child: the parent and the sibling see none of them.
	mustOK(t, runCode(t, children[0].Session, "v_x['k'].append(4)\nopen('/workspace/f.txt', 'w').write('child')\nopen('/workspace/only-child', 'w').write('x')"))
	if got := managedText(t, parent, "v_x"); got != "{'k': [1, 2, 3]}" {
		t.Errorf("the parent sees the child's change: %s", got)
	}
	if got := managedText(t, children[1], "v_x, open('/workspace/f.txt').read()"); got != "({'k': [1, 2, 3]}, 'parent')" {
		t.Errorf("the sibling sees the child's change: %s", got)
	}
	if d := treeDiff(parentFiles, wsTree(t, parent.Workspace())); d != "" {
		t.Errorf("the parent's files changed:\n%s", d)
	}
	if _, err := os.Stat(filepath.Join(children[1].Workspace(), "only-child")); err == nil {
		t.Error("the sibling has the child's file")
	}
	// A child has its parent's checkpoint mode: its last cell can be undone.
	if children[0].CheckpointMode() != CheckpointsAuto {
		t.Errorf("child's checkpoint mode %q", children[0].CheckpointMode())
	}
	if _, err := children[0].Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, children[0], "v_x, open('/workspace/f.txt').read()"); got != "({'k': [1, 2, 3]}, 'parent')" {
		t.Errorf("child after undo: %s", got)
	}
	// The parent goes on.
	if got := managedText(t, parent, "v_x['k'].append(9); len(v_x['k'])"); got != "4" {
		t.Errorf("parent after the fork: %s", got)
	}

	// From a checkpoint: the state then, not now.
	cp, err := parent.Checkpoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, "v_x = 'later'\nopen('/workspace/f.txt', 'w').write('later')"))
	kids, res, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Checkpoint: cp.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 1 || res.From != "checkpoint "+cp.ID+" of "+parent.ID() {
		t.Errorf("fork of a checkpoint: %d children, %+v", len(kids), res)
	}
	if got := managedText(t, kids[0], "v_x, open('/workspace/f.txt').read()"); got != "({'k': [1, 2, 3, 9]}, 'parent')" {
		t.Errorf("fork of %s: %s", cp.ID, got)
	}
}

func TestFork(t *testing.T) {
	testFork(t, forkManager(t, ManagerOptions{}))
}

// TestForkCopyFiles: the same with the files copied into each child
// (ForkFilesCopy, the only way without root).
func TestForkCopyFiles(t *testing.T) {
	testFork(t, forkManager(t, ManagerOptions{ForkFiles: ForkFilesCopy}))
}

func TestForkZygote(t *testing.T) {
	if err := zygote.Supported(); err != nil {
		t.Skipf("no zygote here: %v", err)
	}
	z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	testFork(t, forkManager(t, ManagerOptions{Zygote: z}))
}

func TestForkLimits(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{MaxSessions: 3})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Fork(ctx, "mallory", parent.ID(), ForkOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("fork of another owner's session: %v, want ErrNotFound", err)
	}
	if _, _, err := m.Fork(ctx, "alice", "nosuch", ForkOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("fork of no session: %v", err)
	}
	var le *LimitError
	if _, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 17}); !errors.As(err, &le) {
		t.Errorf("17 forks: %v, want a LimitError", err)
	}
	var ae *ArgumentError
	if _, err := m.Create(ctx, CreateOptions{Owner: "alice", Checkpoints: "always"}); !errors.As(err, &ae) {
		t.Errorf("create with checkpoints \"always\": %v, want an ArgumentError", err)
	}
	if _, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: -1}); !errors.As(err, &ae) {
		t.Errorf("-1 forks: %v, want an ArgumentError", err)
	}
	if _, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Checkpoint: "cp7"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("fork of an unknown checkpoint: %v", err)
	}
	if _, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 3}); !errors.Is(err, ErrCapacity) {
		t.Errorf("3 forks with 2 slots free: %v, want ErrCapacity", err)
	}
	if n := m.Stats().Sessions; n != 1 {
		t.Errorf("%d sessions after refused forks, want 1", n)
	}
	kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 2})
	if err != nil || len(kids) != 2 {
		t.Fatalf("2 forks with 2 slots free: %v", err)
	}
	if got := m.List("mallory"); len(got) != 0 {
		t.Errorf("mallory sees %d sessions", len(got))
	}
}

// inStateFile defines in_state_file(array): whether the array's memory
// lies in a mapping of a fork's state file.
const inStateFile = `def in_state_file(a):
    p = a.ctypes.data
    for line in open('/proc/self/maps'):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if lo <= p < hi:
            return len(f) > 5 and f[5].startswith('/memfd:sandloop-fork')
    return False
`

// TestForkSharesBuffers forks a session holding a numpy array: each child
// loads it over the shared state file's mapping (not a copy of its own),
// and a write to it in one child is seen by neither the parent nor the
// sibling.
func TestForkSharesBuffers(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, "import numpy as np\nv_a = np.arange(1 << 20, dtype=np.float64)\nv_b = bytearray(b'abc')"))
	children, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A large buffer lies where it lay in its page in the parent (so that
	// the parent can map the file's pages in place of its own: remap.go):
	// as aligned as the parent's, at least to 16 bytes (numpy's most).
	align := managedText(t, parent, "v_a.ctypes.data % 4096")
	for i, c := range children {
		// The array's memory is the mapping of the state file.
		got := managedText(t, c, inStateFile+"(in_state_file(v_a), v_a.flags.writeable, v_a.ctypes.data % 4096, v_a.ctypes.data % 16, float(v_a[12345]))")
		if want := "(True, True, " + align + ", 0, 12345.0)"; got != want {
			t.Errorf("child %d: the array's memory, writable, offset in its page, alignment, a value: %s; want %s (the mapped state file, writable, as the parent's, aligned)", i, got, want)
		}
		// The state file is mapped, but no descriptor of it is left open
		// (and it is sealed: see kernel.SealStateFile).
		got = managedText(t, c, "import os\ndef _link(f):\n    try: return os.readlink('/proc/self/fd/' + f)\n    except OSError: return ''\n(any('memfd:sandloop-fork' in _link(f) for f in os.listdir('/proc/self/fd')), 'memfd:sandloop-fork' in open('/proc/self/maps').read())")
		if got != "(False, True)" {
			t.Errorf("child %d: a descriptor of the state file open, the state file mapped: %s; want (False, True)", i, got)
		}
	}
	mustOK(t, runCode(t, children[0].Session, "v_a[:] = -1\nv_b[0] = ord('z')"))
	if got := managedText(t, children[0], "float(v_a.sum()), bytes(v_b)"); got != fmt.Sprintf("(%d.0, b'zbc')", -(1<<20)) {
		t.Errorf("child 0 after its write: %s", got)
	}
	want := fmt.Sprintf("(%d.0, b'abc')", (1<<20)*((1<<20)-1)/2)
	if got := managedText(t, children[1], "float(v_a.sum()), bytes(v_b)"); got != want {
		t.Errorf("the sibling sees child 0's write: %s, want %s", got, want)
	}
	if got := managedText(t, parent, "float(v_a.sum()), bytes(v_b)"); got != want {
		t.Errorf("the parent sees child 0's write: %s, want %s", got, want)
	}
	// Once the last array over it is gone, the mapping goes too.
	if got := managedText(t, children[1], "import gc\ndel v_a\ngc.collect()\n'memfd:sandloop-fork' in open('/proc/self/maps').read()"); got != "False" {
		t.Errorf("the state file still mapped after its arrays were deleted: %s", got)
	}
}

// mappedFrom defines mapped_from(array): the file its memory is a mapping
// of ('anon' if none).
const mappedFrom = `def mapped_from(a):
    for line in open('/proc/self/maps'):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if lo <= a.ctypes.data < hi:
            return f[5] if len(f) > 5 else 'anon'
`

// TestForkReusesExport forks a session twice: the array unchanged since
// the first fork is not copied again (the second fork's child maps it
// from the first fork's state file), the one changed in place is (from
// its own), and both have the values of the moment of their fork; a
// write in the second child is seen by neither the first child nor the
// parent. Once the session closes, no state file is left open.
func TestForkReusesExport(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, "import numpy as np\nv_a = np.arange(1 << 20, dtype=np.float64)\nv_c = np.zeros(1 << 18)"))
	first, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, "v_c[7] = 7"))
	second, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	show := mappedFrom + "\" \".join(str(x) for x in (mapped_from(v_a), mapped_from(v_c), float(v_a.sum()), float(v_c.sum())))"
	f1 := strings.Fields(strings.Trim(managedText(t, first[0], show), "'"))
	f2 := strings.Fields(strings.Trim(managedText(t, second[0], show), "'"))
	if len(f1) != 4 || len(f2) != 4 {
		t.Fatalf("first child %v, second %v", f1, f2)
	}
	sum := fmt.Sprintf("%d.0", (1<<20)*((1<<20)-1)/2)
	if !strings.Contains(f1[0], "memfd:sandloop-fork-") || f1[1] != f1[0] || f1[2] != sum || f1[3] != "0.0" {
		t.Errorf("first child: %v; want both arrays in its state file, sums %s and 0.0", f1, sum)
	}
	if f2[0] != f1[0] || f2[1] == f1[0] || !strings.Contains(f2[1], "memfd:sandloop-fork-") || f2[2] != sum || f2[3] != "7.0" {
		t.Errorf("second child: %v; want v_a in the first fork's state file %s, v_c in its own, sums %s and 7.0", f2, f1[0], sum)
	}
	// A fork of the second child compares against the files it was loaded
	// from: v_a is still the first fork's.
	grand, _, err := m.Fork(ctx, "alice", second[0].ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f3 := strings.Fields(strings.Trim(managedText(t, grand[0], show), "'")); !slices.Equal(f3, f2) {
		t.Errorf("the second child's fork: %v, want %v", f3, f2)
	}
	mustOK(t, runCode(t, second[0].Session, "v_a[:] = -1"))
	if got := managedText(t, first[0], "float(v_a.sum())"); got != sum {
		t.Errorf("the first child sees the second's write: %s", got)
	}
	if got := managedText(t, parent, "float(v_a.sum())"); got != sum {
		t.Errorf("the parent sees the second child's write: %s", got)
	}
	if got := managedText(t, grand[0], "float(v_a.sum())"); got != sum {
		t.Errorf("the second child's fork sees its parent's write: %s", got)
	}
	parent.Close()
	if n := parent.Session.exports.bases; n != nil {
		t.Errorf("state files kept after the session closed: %v", n)
	}
}

// TestForkOfForkSeesWrites forks a child whose array lies over the state
// files it was loaded from (proven unchanged by its pages where it has
// not written, kernel.StartExportOver): each fork of it has the child's
// values byte for byte, one element it wrote included, and a write
// undone in place (bytes equal again) as well.
func TestForkOfForkSeesWrites(t *testing.T) {
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, "import numpy as np, hashlib\nv_a = np.arange(1 << 20, dtype=np.float64)\nv_b = np.ones(1 << 18)"))
	kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := kids[0]
	const digest = "hashlib.sha256(v_a.tobytes() + v_b.tobytes()).hexdigest()"
	for i, cell := range []string{
		"",                            // nothing written: all by pages
		"v_a[12345] = -1.0",           // one page written
		"v_a[12345] = 12345.0",        // written back: equal bytes, compared
		"v_b[-1] = 2.0\nv_a[0] = 0.5", // both, at their first and last pages
	} {
		if cell != "" {
			mustOK(t, runCode(t, child.Session, cell))
		}
		want := managedText(t, child, digest)
		grand, _, err := m.Fork(ctx, "alice", child.ID(), ForkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := managedText(t, grand[0], digest); got != want {
			t.Errorf("fork %d of the child (after %q): state %s, the child's %s", i, cell, got, want)
		}
		grand[0].Close()
	}
	if got, want := managedText(t, parent, "float(v_a[12345]), float(v_a[0]), float(v_b[-1])"), "(12345.0, 0.0, 1.0)"; got != want {
		t.Errorf("the parent sees its child's writes: %s", got)
	}
}
