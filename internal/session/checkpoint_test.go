package session

import (
	"context"
	"errors"
	"fmt"
	"github.com/sandloop/sandloop/internal/testutil"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/zygote"
)

// wsTree describes every entry of a workspace byte for byte.
func wsTree(t *testing.T, dir string) map[string]string {
	return testutil.Tree(t, dir, false)
}

func treeDiff(want, have map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if want[k] != have[k] {
			out = append(out, fmt.Sprintf("%s: want %q, have %q", k, want[k], have[k]))
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: extra %q", k, have[k]))
		}
	}
	return strings.Join(out, "\n")
}

// stateOf is the user's variables as text, and the next number of the
// random generator (which the checkpoint must bring back too).
const stateOf = `sorted((k, repr(v)) for k, v in globals().items() if k.startswith("v_")), random.random()`

func textOf(t *testing.T, s *Session, code string) string {
	t.Helper()
	r := runCode(t, s, code)
	mustOK(t, r)
	return mainText(r)
}

func TestCheckpointRestore(t *testing.T) { testCheckpointRestore(t, Options{}) }

// TestCheckpointZygote: checkpoints and undo of a kernel forked from the
// zygote (not PID 2 of a jail of its own).
func TestCheckpointZygote(t *testing.T) {
	if err := zygote.Supported(); err != nil {
		t.Skipf("no zygote here: %v", err)
	}
	z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	t.Run("restore", func(t *testing.T) { testCheckpointRestore(t, Options{Zygote: z}) })
	t.Run("undo", func(t *testing.T) { testUndo(t, Options{Zygote: z}) })
}

func testCheckpointRestore(t *testing.T, o Options) {
	ctx := context.Background()
	s := newSession(t, o)
	mustOK(t, runCode(t, s, `
import os, random, json
random.seed(7)
v_list = [1, 2, 3]
v_dict = {"a": {"b": [1.5, None]}}
os.makedirs("/workspace/d/e", exist_ok=True)
open("/workspace/a.txt", "w").write("alpha")
open("/workspace/d/e/data.bin", "wb").write(os.urandom(300000))
os.chmod("/workspace/a.txt", 0o600)
os.symlink("a.txt", "/workspace/link")
`))
	wantFiles := wsTree(t, s.Workspace())
	cp, err := s.Checkpoint(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	if cp.ID != "cp1" || cp.Name != "before" || cp.Auto || cp.Files != 2 || cp.FileBytes != 300005 || cp.ExecutionCount != 1 {
		t.Errorf("checkpoint %+v", cp)
	}
	// The checkpoint is measured (by the host, in the background once the
	// call has ended): its memory figure says when.
	testutil.WaitFor(t, 30*time.Second, func() error {
		got := s.Checkpoints()[0]
		if got.MemoryMeasuredAt.IsZero() || got.MemoryMeasuredAt.Before(got.CreatedAt) || time.Since(got.MemoryMeasuredAt) > time.Hour {
			return fmt.Errorf("memory of the checkpoint measured at %v (taken at %v)", got.MemoryMeasuredAt, got.CreatedAt)
		}
		return nil
	})
	wantState := textOf(t, s, stateOf) // also draws from the generator

	mustOK(t, runCode(t, s, `
v_list.append(4); v_dict["a"]["b"].clear(); v_new = "made since"
random.random(); random.random()
os.remove("/workspace/a.txt")
open("/workspace/d/e/data.bin", "r+b").write(b"corrupted")
open("/workspace/new.txt", "w").write("added since")
os.makedirs("/workspace/newdir", exist_ok=True)
os.remove("/workspace/link"); os.mkdir("/workspace/link")
`))
	if treeDiff(wantFiles, wsTree(t, s.Workspace())) == "" {
		t.Fatal("the cell changed no file")
	}
	for i := range 2 { // restore twice: the checkpoint is kept
		res, err := s.RestoreCheckpoint(ctx, cp.ID)
		if err != nil {
			t.Fatal(err)
		}
		if res.From != "checkpoint cp1" || res.Files != 2 || res.ExecutionCount != cp.ExecutionCount {
			t.Errorf("restore %d: %+v", i+1, res)
		}
		if d := treeDiff(wantFiles, wsTree(t, s.Workspace())); d != "" {
			t.Fatalf("restore %d: the workspace differs from the checkpoint:\n%s", i+1, d)
		}
		if got := textOf(t, s, stateOf); got != wantState {
			t.Fatalf("restore %d: state %s, want %s", i+1, got, wantState)
		}
		if r := s.Restored(); r == nil || r.From != "checkpoint cp1" {
			t.Errorf("Restored() = %+v", r)
		}
	}
	if err := s.DeleteCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RestoreCheckpoint(ctx, cp.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("restore of a deleted checkpoint: %v, want ErrNotFound", err)
	}
	if err := s.DeleteCheckpoint(ctx, "cp99"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete unknown: %v", err)
	}
}

func TestUndo(t *testing.T) { testUndo(t, Options{}) }

func testUndo(t *testing.T, o Options) {
	ctx := context.Background()
	o.Checkpoints, o.AutoCheckpoints = CheckpointsAuto, 2
	s := newSession(t, o)
	mustOK(t, runCode(t, s, "v_df = list(range(10))\nopen('/workspace/out.csv', 'w').write('1,2,3')"))
	files := wsTree(t, s.Workspace())
	mustOK(t, runCode(t, s, "v_df.clear()\nopen('/workspace/out.csv', 'w').write('')\nopen('/workspace/junk', 'w').write('x')"))
	res, err := s.Undo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != "undo" || res.ExecutionCount != 1 {
		t.Errorf("undo: %+v", res)
	}
	if got := textOf(t, s, "len(v_df)"); got != "10" {
		t.Fatalf("after undo len(v_df) = %s, want 10", got)
	}
	if d := treeDiff(files, wsTree(t, s.Workspace())); d != "" {
		t.Fatalf("after undo:\n%s", d)
	}
	// The "len" cell took a checkpoint too: undo it, then the first cell.
	for range 2 {
		if _, err := s.Undo(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := runCode(t, s, "v_df")
	if r.Status != kernel.StatusError || !strings.Contains(fmt.Sprint(r.Error), "NameError") {
		t.Fatalf("after undoing the first cell: %+v, want a NameError", r)
	}
	if _, err := os.Stat(filepath.Join(s.Workspace(), "out.csv")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after undoing the first cell, its file is still there: %v", err)
	}
	// Only AutoCheckpoints are kept.
	for range 4 {
		mustOK(t, runCode(t, s, "1"))
	}
	if cps := s.Checkpoints(); len(cps) != 2 || !cps[0].Auto || !cps[1].Auto {
		t.Errorf("checkpoints %+v: want the 2 newest automatic ones", cps)
	}
	for range 2 {
		if _, err := s.Undo(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Undo(ctx); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nothing to undo") {
		t.Errorf("undo with none left: %v", err)
	}
}

func TestCheckpointLimits(t *testing.T) {
	ctx := context.Background()
	s := newSession(t, Options{MaxCheckpoints: 3, CheckpointMemory: 64 << 20})
	for range 3 {
		if _, err := s.Checkpoint(ctx, ""); err != nil {
			t.Fatal(err)
		}
	}
	var le *LimitError
	if _, err := s.Checkpoint(ctx, ""); !errors.As(err, &le) || !strings.Contains(err.Error(), "delete one") {
		t.Fatalf("a fourth checkpoint over MaxCheckpoints 3: %v", err)
	}
	for _, c := range s.Checkpoints() {
		if err := s.DeleteCheckpoint(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}

	// Files: 40 MiB fit in 64, 80 do not; the refused one is not kept.
	mustOK(t, runCode(t, s, "import os\nopen('/workspace/a', 'wb').write(os.urandom(40 << 20))"))
	if _, err := s.Checkpoint(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s, "open('/workspace/b', 'wb').write(os.urandom(40 << 20))"))
	if _, err := s.Checkpoint(ctx, "b"); !errors.As(err, &le) || !strings.Contains(err.Error(), "was not kept") {
		t.Fatalf("checkpoint over the memory bound: %v", err)
	}
	if cps := s.Checkpoints(); len(cps) != 1 || cps[0].Name != "a" {
		t.Fatalf("after the refused checkpoint: %+v", cps)
	}
	mustOK(t, runCode(t, s, "os.remove('/workspace/b')"))

	// Memory: a checkpoint holds what the live kernel changed since.
	mustOK(t, runCode(t, s, "v_big = bytearray(b'y' * (30 << 20))")) // touched: not zero pages
	if _, err := s.Checkpoint(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s, "v_big[:] = b'x' * len(v_big)")) // the copy keeps its 30 MiB
	_, err := s.Checkpoint(ctx, "over")
	if !errors.As(err, &le) {
		t.Fatalf("checkpoint with 40 MiB of files and 30 MiB held by a copy, bound 64 MiB: %v", err)
	}
	var mem int64
	for _, c := range s.Checkpoints() {
		if c.Name == "mem" {
			mem = c.MemoryBytes
		}
	}
	if mem < 25<<20 {
		t.Errorf("checkpoint 'mem' holds %d bytes of memory, want about 30 MiB", mem)
	}

	// A restart drops them all, and their store.
	dir := s.cps.store.Dir()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if cps := s.Checkpoints(); len(cps) != 0 {
		t.Errorf("after a restart: %+v", cps)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the checkpoint store outlived the restart: %v", err)
	}
}

// In auto mode the bound drops the oldest automatic checkpoints, never
// the execution.
func TestAutoCheckpointsFitTheBound(t *testing.T) {
	s := newSession(t, Options{Checkpoints: CheckpointsAuto, AutoCheckpoints: 5, CheckpointMemory: 64 << 20})
	for i := range 4 {
		mustOK(t, runCode(t, s, fmt.Sprintf("import os\nopen('/workspace/f%d', 'wb').write(os.urandom(20 << 20))", i)))
	}
	cps := s.Checkpoints()
	if len(cps) == 0 || len(cps) >= 5 {
		t.Fatalf("%d automatic checkpoints: want fewer than 5 (80 MiB written, bound 64 MiB)", len(cps))
	}
	if s.cps.store.HeldBytes() > 64<<20 {
		t.Errorf("the store holds %d bytes, over the bound", s.cps.store.HeldBytes())
	}
}

func TestCheckpointNotCarried(t *testing.T) {
	ctx := context.Background()
	s := newSession(t, Options{})
	mustOK(t, runCode(t, s, `
import subprocess, threading, time
v_server = subprocess.Popen(["sleep", "300"])
v_thread = threading.Thread(target=time.sleep, args=(300,), daemon=True, name="poller"); v_thread.start()
`))
	cp, err := s.Checkpoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(cp.NotCarried, "\n")
	if !strings.Contains(text, "sleep") || !strings.Contains(text, "poller") {
		t.Errorf("not carried: %q, want the sleep process and the poller thread", cp.NotCarried)
	}
	res, err := s.RestoreCheckpoint(ctx, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.NotRestored, cp.NotCarried) {
		t.Errorf("restore says not restored %q, want %q", res.NotRestored, cp.NotCarried)
	}
}

func TestCheckpointsClosedWithTheSession(t *testing.T) {
	ctx := context.Background()
	s := newSession(t, Options{})
	if _, err := s.Checkpoint(ctx, ""); err != nil {
		t.Fatal(err)
	}
	dir := s.cps.store.Dir()
	if strings.HasPrefix(dir, s.Workspace()+"/") {
		t.Errorf("the store %s is inside the workspace", dir)
	}
	s.Close()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the checkpoint store outlived Close: %v", err)
	}
	if _, err := s.Checkpoint(ctx, ""); !errors.Is(err, ErrClosed) {
		t.Errorf("checkpoint after close: %v", err)
	}
}

// A checkpoint whose kernel copy was killed (as the OOM killer would) is
// reported gone and forgotten; the files and the live kernel are untouched.
func TestCheckpointGone(t *testing.T) {
	ctx := context.Background()
	s := newSession(t, Options{})
	mustOK(t, runCode(t, s, "v_a = 1"))
	cp, err := s.Checkpoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s, `import os, signal, time
v_a = 2
open('/workspace/after.txt', 'w').write('kept')
dormant = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid() and 'kernel.py' in open('/proc/%s/cmdline' % p).read()]
assert len(dormant) == 1, dormant
os.kill(dormant[0], signal.SIGKILL)
def dead(pid):
    try:
        return open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0] in 'ZX'
    except OSError:
        return True
end = time.time() + 10
while not dead(dormant[0]) and time.time() < end:
    time.sleep(0.01)
assert dead(dormant[0])
`))
	_, err = s.RestoreCheckpoint(ctx, cp.ID)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("restore of a killed checkpoint: %v", err)
	}
	if cps := s.Checkpoints(); len(cps) != 0 {
		t.Errorf("the gone checkpoint is still listed: %+v", cps)
	}
	if got := textOf(t, s, "v_a, open('/workspace/after.txt').read()"); got != "(2, 'kept')" {
		t.Errorf("after the failed restore: %s", got)
	}
}

// A checkpoint is answered before the kernel's copy is forked; when that
// fork then fails (here the session's process limit), its restore says so
// and why, the checkpoint is forgotten, and the session goes on.
func TestCheckpointLost(t *testing.T) {
	ctx := context.Background()
	s := newSession(t, Options{Limits: jail.Limits{Pids: 24}})
	mustOK(t, runCode(t, s, `import subprocess
v_a = 1
procs = []
try:
    while len(procs) < 64:
        procs.append(subprocess.Popen(['sleep', '600']))
except OSError:
    pass`))
	if textOf(t, s, "len(procs)") == "64" {
		mustOK(t, runCode(t, s, "for p in procs: p.kill(); p.wait()"))
		t.Skip("the session's process limit is not enforced here")
	}
	cp, err := s.Checkpoint(ctx, "full")
	if err != nil {
		t.Fatalf("checkpoint at the process limit: %v, want it taken", err)
	}
	mustOK(t, runCode(t, s, "for p in procs: p.kill(); p.wait()\nv_a = 2"))
	_, err = s.RestoreCheckpoint(ctx, cp.ID)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "could not be made") || !strings.Contains(err.Error(), "cannot fork the kernel") {
		t.Fatalf("restore of a checkpoint whose copy failed: %v", err)
	}
	if cps := s.Checkpoints(); len(cps) != 0 {
		t.Errorf("the lost checkpoint is still listed: %+v", cps)
	}
	if got := textOf(t, s, "v_a"); got != "2" {
		t.Errorf("after the failed restore: v_a = %s", got)
	}
}

// A workspace larger than the bound is not copied before every cell only
// to be dropped: the automatic checkpoint is skipped, the older ones stay.
func TestAutoCheckpointSkippedOverTheBound(t *testing.T) {
	s := newSession(t, Options{Checkpoints: CheckpointsAuto, CheckpointMemory: 16 << 20})
	if !s.Quota().Enforced {
		t.Skip("the workspace has no quota mount here to measure it cheaply")
	}
	mustOK(t, runCode(t, s, "import os\nopen('/workspace/big', 'wb').write(os.urandom(20 << 20))"))
	mustOK(t, runCode(t, s, "1"))
	cps := s.Checkpoints()
	if len(cps) != 1 || cps[0].ExecutionCount != 0 {
		t.Fatalf("checkpoints %+v: want only the one before the first cell", cps)
	}
	if held := s.cps.store.HeldBytes(); held != 0 {
		t.Errorf("the store holds %d bytes: the big file was copied", held)
	}
}

// The bound holds on the figures the host measures in the background:
// each cell rewrites 30 MiB, so the automatic checkpoint before it keeps
// the old 30 MiB; with a 64 MiB bound the oldest ones go, and what the
// kept ones hold, measured once things are still, stays within it.
func TestAutoCheckpointsFitTheBoundMemory(t *testing.T) {
	t.Run("background", func(t *testing.T) { testAutoCheckpointsFitTheBoundMemory(t, true) })
	// Where the host cannot read the copies, the kernel measures them.
	t.Run("kernel", func(t *testing.T) { testAutoCheckpointsFitTheBoundMemory(t, false) })
}

func testAutoCheckpointsFitTheBoundMemory(t *testing.T, host bool) {
	s := newSession(t, Options{Checkpoints: CheckpointsAuto, AutoCheckpoints: 5, CheckpointMemory: 64 << 20})
	if !host {
		s.cps.hostErr = kernel.ErrNoCopies
	}
	wait := func() {
		if host {
			// Wait for the background figures to be of now (as at a
			// model's pace), so the check before the cell uses them.
			waitMeasured(t, s)
		}
	}
	mustOK(t, runCode(t, s, "v_big = bytearray(b'y' * (30 << 20))"))
	for i := range 4 {
		wait()
		mustOK(t, runCode(t, s, fmt.Sprintf("v_big[:] = b'%d' * len(v_big)", i)))
	}
	wait()
	mustOK(t, runCode(t, s, "1")) // the check, on the figures after the last rewrite
	wait()
	cps := s.Checkpoints()
	if len(cps) == 0 || len(cps) >= 5 || cps[0].ExecutionCount == 0 {
		t.Fatalf("%d automatic checkpoints (first at execution %d): want the oldest dropped (4 copies of 30 MiB, bound 64 MiB)", len(cps), cps[0].ExecutionCount)
	}
	var held int64
	for _, c := range cps {
		held += c.MemoryBytes
	}
	// The bound is checked at each checkpoint; after it the copies' share
	// grows by what the live kernel writes (its heap's churn: a few MiB
	// for the last cell and the measures), until the next check drops one.
	const churn = 8 << 20
	if held+s.cps.store.HeldBytes() > 64<<20+churn {
		t.Errorf("the checkpoints hold %d bytes of memory and %d of files: over the 64 MiB bound (and %d of churn since): %+v", held, s.cps.store.HeldBytes(), churn, cps)
	}
	if held < 25<<20 {
		t.Errorf("the checkpoints hold %d bytes of memory: want at least the 30 MiB of one rewritten copy (the background measure sees it): %+v", held, cps)
	}
}

// waitMeasured waits until the host has measured every checkpoint's copy
// since the last call on s ended.
func waitMeasured(t *testing.T, s *Session) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		_, stale, _, running := s.estimateHeld()
		if stale || running != nil {
			return fmt.Errorf("the checkpoints' memory figures are older than the last call (measure running: %v)", running != nil)
		}
		return nil
	})
}

// TestUndoFirstCellStartsFresh: the automatic checkpoint before a fresh
// kernel's first cell holds the files alone (Checkpoint.Fresh, no copy of
// the kernel); undoing that cell starts a fresh kernel in a fresh
// sandbox, brings the files back, and says what did not come back: the
// sandbox's processes and the checkpoints that were copies of the
// replaced kernel. A later cell's checkpoint is a copy as before.
func TestUndoFirstCellStartsFresh(t *testing.T) {
	const sleeps = "import os\ndef v_sleeps():\n    n = 0\n    for p in os.listdir('/proc'):\n        try:\n            n += p.isdigit() and open('/proc/%s/comm' % p).read().strip() == 'sleep'\n        except OSError:\n            pass\n    return n\n"

	ctx := context.Background()
	m := forkManager(t, ManagerOptions{})
	ms, err := m.Create(ctx, CreateOptions{Owner: "alice", Checkpoints: CheckpointsAuto})
	if err != nil {
		t.Fatal(err)
	}
	s := ms.Session
	if err := os.WriteFile(filepath.Join(s.Workspace(), "in.txt"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s, sleeps+"import subprocess\nv_x = 1\nv_p = subprocess.Popen(['sleep', '600'])\nopen('/workspace/out.txt', 'w').write('cell 1')\nopen('/tmp/t.txt', 'w').write('x')"))
	cps := s.Checkpoints()
	if len(cps) != 1 || !cps[0].Fresh || !cps[0].Auto || cps[0].MemoryBytes != 0 || cps[0].Files != 1 {
		t.Fatalf("after the first cell: %+v, want one fresh automatic checkpoint holding in.txt", cps)
	}
	named, err := s.Checkpoint(ctx, "after-1")
	if err != nil {
		t.Fatal(err)
	}
	if named.Fresh {
		t.Fatalf("a named checkpoint after a cell is fresh: %+v", named)
	}
	if _, _, err := m.Fork(ctx, "alice", ms.ID(), ForkOptions{Checkpoint: cps[0].ID}); err == nil || !strings.Contains(err.Error(), "before the session's first cell") {
		t.Errorf("fork of the fresh checkpoint: %v, want a refusal that says why", err)
	}
	mustOK(t, runCode(t, s, "v_x = 2\nassert v_sleeps() == 1, v_sleeps()"))
	if cps := s.Checkpoints(); len(cps) != 3 || cps[2].Fresh {
		t.Fatalf("after the second cell: %+v, want its checkpoint a copy of the kernel", cps)
	}
	if _, err := s.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if got := textOf(t, s, "v_x"); got != "1" {
		t.Fatalf("after undoing the second cell v_x = %s, want 1", got)
	}
	// The "v_x" cell took a checkpoint too: undo it, then the first cell.
	if _, err := s.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.Undo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExecutionCount != 0 || res.Files != 1 {
		t.Errorf("undo of the first cell: %+v", res)
	}
	said := strings.Join(res.NotRestored, "\n")
	if !strings.Contains(said, "processes, /tmp") || !strings.Contains(said, "checkpoint "+named.ID+" (dropped") {
		t.Errorf("undo of the first cell says %q: want the sandbox's processes and checkpoint %s named", said, named.ID)
	}
	if r := runCode(t, s, "v_x"); r.Status != kernel.StatusError || !strings.Contains(fmt.Sprint(r.Error), "NameError") {
		t.Fatalf("after undoing the first cell: %+v, want a NameError", r)
	}
	mustOK(t, runCode(t, s, sleeps))
	if got := textOf(t, s, "import os\n' '.join(map(str, [open('/workspace/in.txt').read(), os.path.exists('/workspace/out.txt'), os.path.exists('/tmp/t.txt'), v_sleeps()]))"); got != "'before False False 0'" {
		t.Errorf("after undoing the first cell: %q, want in.txt back, out.txt and /tmp's file gone, no sleep running", got)
	}
	for _, c := range s.Checkpoints() {
		if c.ID == named.ID {
			t.Errorf("checkpoint %s is still listed after its kernel was replaced", c.ID)
		}
	}
}
