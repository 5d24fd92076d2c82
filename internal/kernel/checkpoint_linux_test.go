package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

// jailKernelPath is where the tests put kernel.py in the jail, as the session does.
const jailKernelPath = "/opt/sandloop/kernel.py"

// jailedProcess adapts a jail.Process, as internal/session does.
type jailedProcess struct{ p *jail.Process }

func (j *jailedProcess) Signal(sig os.Signal) error { return j.p.Signal(sig) }
func (j *jailedProcess) Kill() error                { j.p.Kill(); return nil }
func (j *jailedProcess) Wait() error {
	r, err := j.p.Wait()
	switch {
	case err != nil:
		return err
	case r.OOMKilled:
		return errors.New("killed by the out-of-memory killer")
	case r.Signal != "":
		return fmt.Errorf("killed by signal %s", r.Signal)
	case r.ExitCode != 0:
		return fmt.Errorf("exited with status %d", r.ExitCode)
	}
	return nil
}

// startJailed starts kernel.py in a real jail (a cold one: the jail's init
// is PID 1, the kernel PID 2) with limits.
func startJailed(t testing.TB, limits jail.Limits) *Kernel {
	t.Helper()
	return startJailedWith(t, limits, &Options{InterruptGrace: 5 * time.Second})
}

func startJailedWith(t testing.TB, limits jail.Limits, opts *Options) *Kernel {
	t.Helper()
	return startJailedFiles(t, limits, opts, func(f Files) Files { return f })
}

// startJailedFiles is startJailedWith with the files the launcher hands
// the kernel changed by files.
func startJailedFiles(t testing.TB, limits jail.Limits, opts *Options, files func(Files) Files) *Kernel {
	t.Helper()
	if _, err := os.Stat(jail.DefaultPython); err != nil {
		t.Skip("no " + jail.DefaultPython)
	}
	ws := t.TempDir()
	launch := func(ctx context.Context, f Files) (Process, error) {
		p, err := jail.Start(ctx, &jail.Config{
			Path:       jail.DefaultPython,
			Args:       []string{"python3", jailKernelPath},
			Env:        []string{"MPLBACKEND=module://sandloop_backend", "MPLCONFIGDIR=/tmp", "PYTHONDONTWRITEBYTECODE=1"},
			Workspace:  ws,
			Limits:     limits,
			Files:      []jail.File{{Path: jailKernelPath, Data: Source, Mode: 0o444}},
			Stderr:     os.Stderr,
			ExtraFiles: files(f).List(),
		})
		if err != nil {
			return nil, err
		}
		return &jailedProcess{p}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := Start(ctx, launch, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// exec runs code that must succeed and returns its stdout, trimmed.
func execOK(t testing.TB, k *Kernel, code string) string {
	t.Helper()
	r, err := k.Execute(context.Background(), Request{Code: code, Timeout: 2 * time.Minute}, nil)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if r.Status != StatusOK {
		t.Fatalf("status %s: %+v\nstdout: %s\nstderr: %s", r.Status, r.Error, r.Stdout, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// fingerprint prints what the tests compare across a restore: variables,
// a numpy array's digest, the random module's and numpy's next draws.
const fingerprint = `import hashlib
print(x, s, len(big), hashlib.sha256(arr.tobytes()).hexdigest()[:16], random.random(), np.random.rand(), sorted(k for k in globals() if not k.startswith('_')))`

func TestCheckpointRestore(t *testing.T) {
	k := startJailed(t, jail.Limits{Memory: 1 << 30})
	// A child process's CPU time before the checkpoint: a restored kernel's
	// own children have used none.
	execOK(t, k, "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'sum(range(10**7))'])")
	execOK(t, k, "import random, numpy as np\nrandom.seed(1); np.random.seed(2)\nx = 41\ns = 'before'\nbig = list(range(100000))\narr = np.arange(1000000, dtype='float64')")
	ctx := context.Background()
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp.ID != 1 || cp.ExecutionCount != 2 || len(cp.Threads) != 0 || len(cp.Processes) != 0 {
		t.Fatalf("checkpoint %+v", cp)
	}
	// The fingerprint draws random numbers: take it in a second checkpoint
	// of the same state... no: take it now, then restore, then again.
	want := execOK(t, k, fingerprint)
	execOK(t, k, "x = 0\ns = 'after'\nbig.clear()\narr *= 3\nnew_name = 1\nrandom.random(); np.random.rand()")
	for i := range 2 {
		info, err := k.Restore(ctx, cp.ID)
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if info.ID != cp.ID || info.ExecutionCount != 2 {
			t.Fatalf("restore %d: %+v", i, info)
		}
		// numpy's BLAS threads work in the restored kernel; the first
		// cell's usage is its own (no children's time from before).
		r, err := k.Execute(ctx, Request{Code: "float((np.ones((400, 400)) @ np.ones((400, 400))).sum())"}, nil)
		if err != nil || r.ExecutionCount != 3 || r.MainResult()["text/plain"] != "64000000.0" {
			t.Fatalf("restore %d: the count after a restore to 2 and a cell should be 3: %v %+v", i, err, r)
		}
		if r.CPUMS < 0 || r.MemoryPeakBytes <= 0 || r.MemoryPeakBytes > 400<<20 {
			t.Fatalf("restore %d: usage cpu %v ms, peak %d bytes", i, r.CPUMS, r.MemoryPeakBytes)
		}
		if got := execOK(t, k, fingerprint); got != want {
			t.Fatalf("restore %d: state\n got %s\nwant %s", i, got, want)
		}
		execOK(t, k, "x = -1; arr[:] = 0")
	}
	// A checkpoint taken by a restored kernel, restored from it, and the
	// first one again: every kernel can restore every checkpoint.
	execOK(t, k, "x = 7")
	cp2, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.ID != 2 {
		t.Fatalf("second checkpoint id %d, want 2", cp2.ID)
	}
	execOK(t, k, "x = 8")
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, k, "print(x)"); got != "41" {
		t.Fatalf("x = %s after restoring 1, want 41", got)
	}
	if _, err := k.Restore(ctx, cp2.ID); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, k, "print(x)"); got != "7" {
		t.Fatalf("x = %s after restoring 2, want 7", got)
	}
	// The processes: PID 1 the init, the anchor (the live kernel's parent),
	// the live kernel and one dormant process per checkpoint; nothing
	// else (no leftovers of the old live kernels).
	got := execOK(t, k, `import os, time
for _ in range(100):
    procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and open('/proc/%s/stat' % p).read().split(') ')[1][0] != 'Z')
    anchor = os.getppid()
    try:
        cmd = open('/proc/%d/cmdline' % anchor).read().split('\0')[1:3]
    except OSError:
        cmd = []  # gone meanwhile
    if len(procs) == 5 and cmd:
        break
    time.sleep(0.1)  # the old live kernel exits after the new one answers
print(len(procs), 1 in procs, anchor in procs, cmd)`)
	if got != "5 True True ['-I', '-S']" {
		t.Errorf("processes: %s, want the init, the anchor, the live kernel and two checkpoints", got)
	}
	// The anchor idles.
	got = execOK(t, k, `import os, time
def cpu(): return sum(int(v) for v in open('/proc/%d/stat' % os.getppid()).read().split(') ')[1].split()[11:13])
c0 = cpu(); time.sleep(0.5); print(cpu() - c0)`)
	if got != "0" {
		t.Errorf("the anchor used %s ticks of CPU in 0.5 s idle", got)
	}

	if err := k.DropCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Restore(ctx, cp.ID); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("restore of a dropped checkpoint: %v, want ErrNoCheckpoint", err)
	}
	if err := k.DropCheckpoint(ctx, 99); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("drop of an unknown checkpoint: %v, want ErrNoCheckpoint", err)
	}
	mem, err := k.CheckpointMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mem[cp.ID]; ok || len(mem) != 1 {
		t.Fatalf("memory after the drop: %v, want only checkpoint %d", mem, cp2.ID)
	}
}

func TestCheckpointInterruptAndCrash(t *testing.T) {
	k := startJailed(t, jail.Limits{})
	ctx := context.Background()
	execOK(t, k, "x = 1")
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := k.Restore(ctx, cp.ID); err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			k.Interrupt()
		}()
		r, err := k.Execute(ctx, Request{Code: "import time\nfor _ in range(600): time.sleep(0.1)"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != StatusInterrupted || r.Error == nil || r.Error.Name != "KeyboardInterrupt" {
			t.Fatalf("after restore %d: status %s error %+v, want interrupted", i, r.Status, r.Error)
		}
		if got := execOK(t, k, "print(x)"); got != "1" {
			t.Fatalf("x = %s", got)
		}
	}
	// The timeout still interrupts a restored kernel.
	r, err := k.Execute(ctx, Request{Code: "import time; time.sleep(60)", Timeout: 300 * time.Millisecond}, nil)
	if err != nil || r.Status != StatusTimeout {
		t.Fatalf("timeout after restores: %v %+v", err, r)
	}
	// A restored kernel that crashes ends the session with its signal; its
	// cell is numbered from the checkpoint's count.
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	r, err = k.Execute(ctx, Request{Code: "import os; os.kill(os.getpid(), 11)"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, "SIGSEGV") {
		t.Fatalf("segfault of a restored kernel: status %s error %+v, want killed by SIGSEGV", r.Status, r.Error)
	}
	if r.ExecutionCount != cp.ExecutionCount+1 {
		t.Errorf("the crashed cell is number %d, want %d (the checkpoint's count + 1)", r.ExecutionCount, cp.ExecutionCount+1)
	}
	if !errors.Is(k.Err(), ErrDead) {
		t.Fatalf("Err() = %v", k.Err())
	}
}

func TestCheckpointTimeoutKill(t *testing.T) {
	k := startJailed(t, jail.Limits{})
	ctx := context.Background()
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	k.opts.InterruptGrace = 300 * time.Millisecond
	// (A timeout long enough for the cell to ignore SIGINT first, even on
	// a loaded machine.)
	r, err := k.Execute(ctx, Request{Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", Timeout: 3 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, "timeout") {
		t.Fatalf("a restored kernel ignoring its interrupt: status %s error %+v, want killed after the timeout", r.Status, r.Error)
	}
}

func TestCheckpointGoneAndReported(t *testing.T) {
	k := startJailed(t, jail.Limits{})
	ctx := context.Background()
	execOK(t, k, "import threading, subprocess, time\nev = threading.Event()\nth = threading.Thread(target=ev.wait, name='waiter', daemon=True); th.start()\nsrv = subprocess.Popen(['sleep', '600'])\nimport os")
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Threads) != 1 || !strings.HasPrefix(cp.Threads[0], "waiter") {
		t.Errorf("threads not carried: %q, want the waiter", cp.Threads)
	}
	if len(cp.Processes) != 1 || !strings.HasSuffix(cp.Processes[0], " sleep 600") {
		t.Errorf("processes not carried: %q, want sleep 600", cp.Processes)
	}
	// A restored kernel whose threads were not carried still answers.
	// Restored twice, then a checkpoint at once: the old live kernels
	// (perhaps still exiting) are not the user's processes.
	for range 2 {
		if _, err := k.Restore(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	now, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(now.Processes) != 1 || !strings.HasSuffix(now.Processes[0], " sleep 600") {
		t.Errorf("processes not carried after restores: %q, want sleep 600 only", now.Processes)
	}
	if err := k.DropCheckpoint(ctx, now.ID); err != nil {
		t.Fatal(err)
	}
	// The server runs on, not rolled back, and is no child of the
	// restored kernel (Popen.poll sees no child: 0).
	if got := execOK(t, k, "print(th.is_alive(), srv.poll(), os.path.exists('/proc/%d' % srv.pid))"); got != "False 0 True" {
		t.Errorf("after restore: thread alive, server poll, server running = %s", got)
	}
	// A checkpoint killed (as the OOM killer would) is gone, not half restored.
	cp2, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := k.CheckpointMemory(ctx)
	if err != nil || len(mem) != 2 {
		t.Fatalf("memory %v %v", mem, err)
	}
	// The dormant copies run kernel.py; the newest is checkpoint 2's. (A
	// process may end between the listing and the read: the restore's
	// old kernel exits in the background.)
	execOK(t, k, `import os, signal, time
def cmdline(p):
    try:
        return open('/proc/%s/cmdline' % p).read()
    except OSError:
        return ''
dormant = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid() and 'kernel.py' in cmdline(p)]
os.kill(max(dormant), signal.SIGKILL); time.sleep(0.2)`)
	if _, err := k.Restore(ctx, cp2.ID); !errors.Is(err, ErrCheckpointGone) {
		t.Fatalf("restore of a killed checkpoint: %v, want ErrCheckpointGone", err)
	}
	if got := execOK(t, k, "print('alive')"); got != "alive" {
		t.Fatalf("the live kernel after a failed restore: %q", got)
	}
	mem, err = k.CheckpointMemory(ctx)
	if _, ok := mem[cp2.ID]; err != nil || ok || len(mem) != 1 {
		t.Fatalf("memory with checkpoint %d gone: %v %v, want only checkpoint %d", cp2.ID, mem, err, cp.ID)
	}
	if _, err := k.Restore(ctx, cp2.ID); !errors.Is(err, ErrCheckpointGone) {
		t.Fatalf("a second restore of a killed checkpoint: %v, want ErrCheckpointGone", err)
	}
	if err := k.DropCheckpoint(ctx, cp2.ID); err != nil {
		t.Fatalf("drop of a gone checkpoint: %v", err)
	}
	if _, err := k.Restore(ctx, cp2.ID); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("restore of a dropped checkpoint: %v, want ErrNoCheckpoint", err)
	}
	// The other checkpoint still works.
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointMemoryGrows(t *testing.T) {
	k := startJailed(t, jail.Limits{Memory: 1 << 30})
	ctx := context.Background()
	execOK(t, k, "import numpy as np\na = np.ones(50 << 20, dtype='uint8')")
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, err := k.CheckpointMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, k, "a[:] = 2")
	after, err := k.CheckpointMemory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint private memory: %d KiB before the rewrite, %d KiB after", before[cp.ID]>>10, after[cp.ID]>>10)
	if before[cp.ID] > 20<<20 || after[cp.ID]-before[cp.ID] < 45<<20 {
		t.Fatalf("checkpoint memory %d -> %d: want it small, then grown by the 50 MB rewritten", before[cp.ID], after[cp.ID])
	}
}

func TestExportImportState(t *testing.T) {
	// Small events: the state comes in many chunks, each within the bound.
	src := startJailedWith(t, jail.Limits{Memory: 1 << 30}, &Options{MaxEventBytes: 256 << 10})
	ctx := context.Background()
	execOK(t, src, `import pandas as pd, socket, math
import numpy as np
class Point:
    def __init__(self, x, y): self.x, self.y = x, y
    def norm(self): return math.hypot(self.x, self.y)
p = Point(3, 4)
f = lambda v: v * 2 + offset
offset = 1
df = pd.DataFrame({'a': range(5), 'b': list('vwxyz')})
sock = socket.socket()
n = 5
class Noisy:  # loading it prints more than a pipe holds
    def __setstate__(self, state):
        print('x' * 300000)
        self.__dict__.update(state)
noisy = Noisy()
noisy.a = 1
arr = np.arange(1 << 18, dtype='float64').reshape(512, 512)  # 2 MiB: written by the pickler as a buffer`)
	// An export abandoned after its first chunk: its rest is skipped, not
	// taken for the next export's.
	execOK(t, src, "blob = bytes(range(256)) * (16 << 10)")
	cctx, cancel := context.WithCancel(ctx)
	if _, err := src.ExportState(cctx, cancelingWriter{cancel}, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned export: %v", err)
	}
	var buf bytes.Buffer
	m, err := src.ExportState(ctx, &buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Serializer != "dill" || m.ExecutionCount != 2 || !slices.Contains(m.Variables, "blob") || len(m.NotSaved) != 1 || m.NotSaved[0].Name != "sock" || !strings.Contains(m.NotSaved[0].Reason, "socket") {
		t.Fatalf("manifest %+v", m)
	}
	// From a checkpoint: its state, not the live one.
	cp, err := src.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, src, "n = 6")
	var fromCP bytes.Buffer
	if _, err := src.ExportState(ctx, &fromCP, cp.ID); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		state []byte
	}{{"live", buf.Bytes()}, {"checkpoint", fromCP.Bytes()}} {
		dst := startJailed(t, jail.Limits{Memory: 1 << 30})
		execOK(t, dst, "import random\nrandom.seed(5)")
		got, err := dst.ImportState(ctx, bytes.NewReader(tc.state))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(got.NotSaved) != 1 || got.NotSaved[0].Name != "sock" || got.ExecutionCount != 2 || !slices.Contains(got.Variables, "blob") {
			t.Fatalf("%s: import manifest %+v", tc.name, got)
		}
		out := execOK(t, dst, "print(p.norm(), isinstance(p, Point), f(10), df.b.tolist(), df.a.sum(), n, math.pi > 3, 'sock' in globals(), arr.shape, arr[511, 511])")
		if want := "5.0 True 21 ['v', 'w', 'x', 'y', 'z'] 10 5 True False (512, 512) 262143.0"; out != want {
			t.Fatalf("%s: after import: %s, want %s", tc.name, out, want)
		}
		r, err := dst.Execute(ctx, Request{Code: "import random; random.random() != random.Random(5).random()"}, nil)
		if err != nil || r.ExecutionCount != 4 || r.MainResult()["text/plain"] != "True" {
			t.Fatalf("%s: after import the count goes on from the export's and random is reseeded: %v %+v", tc.name, err, r)
		}
	}
	// A broken stream is an error that says so; the kernel goes on.
	for _, bad := range [][]byte{[]byte("not a state"), buf.Bytes()[:buf.Len()/2]} {
		if _, err := src.ImportState(ctx, bytes.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "import state: ") {
			t.Errorf("import of %d broken bytes: %v", len(bad), err)
		}
	}
	// (The half stream had n = 5 before its break: loaded, and kept.)
	if got := execOK(t, src, "print(n)"); got != "5" {
		t.Errorf("after broken imports: n = %s, want the 5 of the half stream", got)
	}
}

func TestCheckpointRestoredOOM(t *testing.T) {
	k := startJailed(t, jail.Limits{Memory: 256 << 20})
	ctx := context.Background()
	execOK(t, k, "x = bytearray(32 << 20)")
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	r, err := k.Execute(ctx, Request{Code: "b = []\nwhile True: b.append(bytearray(16 << 20))"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, "out-of-memory") {
		t.Fatalf("a restored kernel out of memory: status %s error %+v, want killed by the OOM killer", r.Status, r.Error)
	}
}

// TestCheckpointHost: checkpoints work without a jail too (the kernel run
// by the host's Python, in its own process group), and Close ends the
// dormant copies with the rest.
func TestCheckpointHost(t *testing.T) {
	k := startHost(t, nil, nil)
	ctx := context.Background()
	execOK(t, k, "x = 1")
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, k, "x = 2")
	if _, err := k.Restore(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	pids := execOK(t, k, "import os\nprint(os.getppid(), x)")
	var anchor, x int
	if _, err := fmt.Sscan(pids, &anchor, &x); err != nil || x != 1 {
		t.Fatalf("after restore: %q", pids)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(anchor, 0); err == nil {
		t.Errorf("the anchor %d outlived Close", anchor)
	}
}

// cancelingWriter cancels its context at the first write.
type cancelingWriter struct{ cancel context.CancelFunc }

func (w cancelingWriter) Write(b []byte) (int, error) {
	w.cancel()
	return len(b), nil
}

// TestCheckpointManyRestores goes back and forth between two checkpoints,
// taking and dropping others on the way: the session keeps exactly its
// init, the anchor, the live kernel and one process per checkpoint, with
// no zombies, and each restore lands on its checkpoint's state.
func TestCheckpointManyRestores(t *testing.T) {
	k := startJailed(t, jail.Limits{})
	ctx := context.Background()
	var ids [2]int
	for i := range ids {
		execOK(t, k, fmt.Sprintf("x = %d", i))
		cp, err := k.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = cp.ID
	}
	for round := range 20 {
		i := round % 2
		if _, err := k.Restore(ctx, ids[i]); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if got := execOK(t, k, "print(x)"); got != fmt.Sprint(i) {
			t.Fatalf("round %d: x = %s, want %d", round, got, i)
		}
		cp, err := k.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.DropCheckpoint(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	got := execOK(t, k, `import os, time
for _ in range(50):
    states = [open('/proc/%s/stat' % p).read().split(') ')[1][0] for p in os.listdir('/proc') if p.isdigit()]
    if len(states) == 5 and 'Z' not in states:
        break
    time.sleep(0.1)
print(len(states), states.count('Z'))`)
	if got != "5 0" {
		t.Fatalf("processes, zombies: %s; want 5 (init, anchor, live kernel, two checkpoints), 0", got)
	}
}

// TestExportImportPickle: without dill the state is pickled; what pickle
// cannot carry (a lambda, a class defined in a cell and its instances) is
// listed, the rest (a large numpy array among it) arrives.
func TestExportImportPickle(t *testing.T) {
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	ctx := context.Background()
	execOK(t, src, `import sys
sys.modules['dill'] = None  # as where python3-dill is not installed
import numpy as np
arr = np.arange(1 << 18, dtype='float64').reshape(512, 512)
f = lambda v: v
class C: pass
c = C()
n = 3`)
	var buf bytes.Buffer
	m, err := src.ExportState(ctx, &buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Serializer != "pickle" || len(m.NotSaved) != 1 || m.NotSaved[0].Name != "f" {
		t.Fatalf("manifest %+v, want pickle with the lambda not saved", m)
	}
	dst := startJailed(t, jail.Limits{Memory: 1 << 30})
	got, err := dst.ImportState(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range got.NotSaved {
		names = append(names, ns.Name)
	}
	slices.Sort(names)
	if strings.Join(names, " ") != "C c f" || !slices.Contains(got.Variables, "arr") {
		t.Fatalf("import manifest %+v, want C, c and f not restored, arr restored", got)
	}
	if out := execOK(t, dst, "print(arr.shape, arr[511, 511], n, np.__name__)"); out != "(512, 512) 262143.0 3 numpy" {
		t.Fatalf("after import: %s", out)
	}
}

// TestExportChannel: on the state channel, the kernel answers (and runs
// cells) as soon as the copy that serializes exists, while the state is
// still streaming; the stream is the same one a kernel without the
// channel sends on its event pipe, and either loads into the other.
func TestExportChannel(t *testing.T) {
	ctx := context.Background()
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	if !src.stateChannel {
		t.Fatal("the kernel did not take its state channel")
	}
	execOK(t, src, `import numpy as np, pandas as pd, threading, time
arr = np.arange(1 << 20, dtype='float64')  # 8 MiB: far more than a pipe holds
df = pd.DataFrame({'a': arr[:1000], 'b': ['x'] * 1000})
sq = lambda v: v * v
ev = threading.Event()
th = threading.Thread(target=ev.wait, name='waiter', daemon=True)
th.start()`)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	e, err := src.StartExport(ctx, pw, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Threads) != 1 || !strings.Contains(e.Threads[0], "waiter") {
		t.Errorf("threads %q, want the waiter", e.Threads)
	}
	// Nobody reads the state yet: the copy is blocked on its pipe, and
	// the kernel is free.
	if out := execOK(t, src, "arr[0] = -1\nprint(arr[:2].tolist())"); out != "[-1.0, 1.0]" {
		t.Fatalf("a cell during the export: %s", out)
	}
	var state bytes.Buffer
	read := make(chan error, 1)
	go func() { _, err := io.Copy(&state, pr); read <- err }()
	m, err := e.Wait(ctx)
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Variables, "arr") || !slices.Contains(m.Variables, "sq") || m.ExecutionCount != 1 {
		t.Fatalf("manifest %+v", m)
	}
	// Loaded by a kernel without the channel (the bytes go as base64
	// events), and its own export loaded by one with it.
	plain := startJailedFiles(t, jail.Limits{Memory: 1 << 30}, nil, func(f Files) Files { f.State = nil; return f })
	if plain.stateChannel {
		t.Fatal("a kernel without fd 7 says it has the state channel")
	}
	if _, err := plain.ImportState(ctx, bytes.NewReader(state.Bytes())); err != nil {
		t.Fatal(err)
	}
	if out := execOK(t, plain, "arr[5] = 7\nprint(arr[:2].tolist(), arr.flags.writeable, df.b[999], sq(3))"); out != "[0.0, 1.0] True x 9" {
		t.Fatalf("after import without the channel (the export was taken before the cell set arr[0]): %s", out)
	}
	var again bytes.Buffer
	ee, err := plain.StartExport(ctx, &again, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(ee.Threads) != 0 {
		t.Errorf("threads of a kernel that has none: %q", ee.Threads)
	}
	if _, err := ee.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	dst := startJailed(t, jail.Limits{Memory: 1 << 30})
	got, err := dst.ImportState(ctx, &again)
	if err != nil {
		t.Fatal(err)
	}
	if out := execOK(t, dst, "print(arr[:2].tolist(), arr[5], arr.sum() > 0, sq(4))"); out != "[0.0, 1.0] 7.0 True 16" {
		t.Fatalf("after import on the channel: %s (%+v)", out, got)
	}
}

// TestImportStateFile exports into a state file and loads it into other
// kernels: mapped where sealed (the array's memory is the mapping, the
// values as ImportState gives them, dill's included), read where not, and
// a broken file is an error that says so.
func TestImportStateFile(t *testing.T) {
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	ctx := context.Background()
	execOK(t, src, `import numpy as np, pandas as pd
f = lambda v: v + 1
class Point:
    def __init__(self, x): self.x = x
p = Point(3)
big = {i: str(i) * 10 for i in range(100000)}  # a pickle in many pieces
df = pd.DataFrame({'a': np.arange(100000.0), 'b': np.arange(100000)})
arr = np.arange(1 << 18, dtype='float64')`)
	state, err := NewStateFile("test-state")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { state.Close() })
	if _, err := src.ExportState(ctx, state, 0); err != nil {
		t.Fatal(err)
	}
	unsealed, err := NewStateFile("test-unsealed")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unsealed.Close() })
	if _, err := io.Copy(unsealed, io.NewSectionReader(state, 0, 1<<40)); err != nil {
		t.Fatal(err)
	}
	if err := SealStateFile(state); err != nil {
		t.Fatal(err)
	}
	if _, err := state.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("a sealed state file took a write")
	}
	const check = `def mapped(a):
    for line in open('/proc/self/maps'):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if lo <= a.ctypes.data < hi:
            return len(f) > 5 and f[5].startswith('/memfd:test-state')
    return False
print(f(1), p.x, isinstance(p, Point), len(big), big[99999][:5], df.a.sum(), df.b.dtype, arr[12345], mapped(arr), arr.ctypes.data % 16)`
	for _, tc := range []struct {
		name string
		f    *os.File
		mem  string
	}{{"sealed", state, "True 0"}, {"unsealed", unsealed, "False"}} {
		dst := startJailed(t, jail.Limits{Memory: 1 << 30})
		m, err := dst.ImportStateFile(ctx, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(m.NotSaved) != 0 || !slices.Contains(m.Variables, "arr") || !slices.Contains(m.Variables, "f") {
			t.Errorf("%s: manifest %+v", tc.name, m)
		}
		out := execOK(t, dst, check)
		want := "2 3 True 100000 99999 4999950000.0 int64 12345.0 " + tc.mem
		if !strings.HasPrefix(out, want) {
			t.Errorf("%s: %s, want %s...", tc.name, out, want)
		}
	}
	// A sealed file cut short: the mapped load says the stream broke.
	fi, _ := state.Stat()
	short, err := NewStateFile("test-short")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { short.Close() })
	if _, err := io.Copy(short, io.NewSectionReader(state, 0, fi.Size()-100)); err != nil {
		t.Fatal(err)
	}
	if err := SealStateFile(short); err != nil {
		t.Fatal(err)
	}
	dst := startJailed(t, jail.Limits{Memory: 1 << 30})
	if _, err := dst.ImportStateFile(ctx, short); err == nil || !strings.Contains(err.Error(), "ended early") {
		t.Errorf("import of a cut state file: %v", err)
	}
}

// RestoreAndDrop (an undo) restores a checkpoint and forgets it, leaving
// no copy of it behind; the other checkpoints stay restorable.
func TestCheckpointRestoreAndDrop(t *testing.T) {
	k := startJailed(t, jail.Limits{Memory: 1 << 30})
	ctx := context.Background()
	execOK(t, k, "x = 1")
	first, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, k, "x = 2")
	second, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, k, "x = 3")
	for round, cp := range []*CheckpointInfo{second, first} {
		info, err := k.RestoreAndDrop(ctx, cp.ID)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if info.ID != cp.ID || info.ExecutionCount != cp.ExecutionCount {
			t.Errorf("round %d: restored %+v, want %+v", round, info, cp)
		}
		if got, want := execOK(t, k, "print(x)"), fmt.Sprint(2-round); got != want {
			t.Fatalf("round %d: x = %s, want %s", round, got, want)
		}
		if _, err := k.Restore(ctx, cp.ID); !errors.Is(err, ErrNoCheckpoint) {
			t.Fatalf("round %d: restore of a checkpoint restored and dropped: %v, want ErrNoCheckpoint", round, err)
		}
		execOK(t, k, "x = 3")
	}
	// Left: the init, the anchor and the live kernel; no copy, no zombie.
	got := execOK(t, k, `import os, time
for _ in range(50):
    states = [open('/proc/%s/stat' % p).read().split(') ')[1][0] for p in os.listdir('/proc') if p.isdigit()]
    if len(states) == 3 and 'Z' not in states:
        break
    time.sleep(0.1)
print(len(states), states.count('Z'))`)
	if got != "3 0" {
		t.Fatalf("processes, zombies: %s; want 3 (init, anchor, live kernel), 0", got)
	}
}

// TestFresh: a started kernel is fresh until a cell, an import, a restore
// or an environment change is sent to it; a checkpoint leaves it fresh.
func TestFresh(t *testing.T) {
	ctx := context.Background()
	for _, step := range []struct {
		name string
		do   func(k *Kernel) error
	}{
		{"execute", func(k *Kernel) error { _, err := k.Execute(ctx, Request{Code: "1"}, nil); return err }},
		{"setenv", func(k *Kernel) error { return k.SetEnv(ctx, map[string]string{"A": "1"}) }},
		{"restore", func(k *Kernel) error {
			cp, err := k.Checkpoint(ctx)
			if err != nil {
				return err
			}
			if !k.Fresh() {
				return errors.New("a checkpoint made the kernel not fresh")
			}
			_, err = k.Restore(ctx, cp.ID)
			return err
		}},
	} {
		k := startJailed(t, jail.Limits{Memory: 1 << 30})
		if !k.Fresh() {
			t.Fatalf("%s: a kernel just started is not fresh", step.name)
		}
		if err := step.do(k); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if k.Fresh() {
			t.Errorf("%s: the kernel is still fresh", step.name)
		}
	}
}

// A checkpoint is announced before its copy is forked (no other thread:
// nothing runs in between). A fork that then fails (here the session's
// process limit) leaves the checkpoint gone, with the reason, and the
// kernel serving.
func TestCheckpointLostAfterReply(t *testing.T) {
	k := startJailed(t, jail.Limits{Pids: 24})
	ctx := context.Background()
	if n := execOK(t, k, `import subprocess
procs = []
try:
    while len(procs) < 64:
        procs.append(subprocess.Popen(['sleep', '600']))
except OSError:
    pass
print(len(procs))`); n == "64" {
		execOK(t, k, "for p in procs: p.kill(); p.wait()")
		t.Skip("the jail's process limit is not enforced here")
	}
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatalf("checkpoint at the process limit: %v, want it announced", err)
	}
	var lost *LostError
	if _, err := k.Restore(ctx, cp.ID); !errors.As(err, &lost) || !errors.Is(err, ErrCheckpointGone) || !strings.Contains(lost.Why, "cannot fork the kernel") {
		t.Fatalf("restore of a checkpoint whose copy could not be made: %v, want a LostError saying why", err)
	}
	if got := execOK(t, k, "for p in procs: p.kill(); p.wait()\nprint('alive')"); got != "alive" {
		t.Fatalf("the live kernel after a lost checkpoint: %q", got)
	}
	if err := k.DropCheckpoint(ctx, cp.ID); err != nil {
		t.Fatalf("drop of a lost checkpoint: %v", err)
	}
	cp2, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, k, "x = 1")
	if _, err := k.Restore(ctx, cp2.ID); err != nil {
		t.Fatalf("a checkpoint after the limit was freed: %v", err)
	}
	if got := execOK(t, k, "print('x' in globals())"); got != "False" {
		t.Fatalf("after the restore, x defined: %s", got)
	}
}
