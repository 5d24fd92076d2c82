package session

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/zygote"
)

// The state of issue 27's measurements: a 100 MB pandas DataFrame and
// 50 MB of workspace files (50 files).
const (
	buildDataFrame = "import pandas as pd, numpy as np\nv_df = pd.DataFrame(np.random.rand((100 << 20) // 32, 4))"
	buildFiles     = "import os\nos.makedirs('/workspace/data', exist_ok=True)\nfor i in range(50): open(f'/workspace/data/f{i}.bin', 'wb').write(os.urandom(1 << 20))"
)

var benchLimits = jail.Limits{Memory: 2 << 30, Disk: 512 << 20}

func mustRun(b *testing.B, s *Session, code string) {
	b.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: code}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if r.Status != kernel.StatusOK {
		b.Fatalf("%q: %s %+v %s", code, r.Status, r.Error, r.Stderr)
	}
}

// rebuild re-runs the cells that built the state: the baseline of a
// restore (what one does without checkpoints).
func rebuild(b *testing.B, s *Session) time.Duration {
	t0 := time.Now()
	mustRun(b, s, buildDataFrame)
	mustRun(b, s, buildFiles)
	return time.Since(t0)
}

// BenchmarkCheckpointSession takes a checkpoint of, and restores, a
// session holding a 100 MB DataFrame and 50 MB of files after a small
// change, beside re-running the cells that built that state; it reports
// the medians and their ratios.
func BenchmarkCheckpointSession(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, &Options{Limits: benchLimits})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	var rebuildT []time.Duration
	for range 3 {
		rebuildT = append(rebuildT, rebuild(b, s))
	}
	time.Sleep(100 * time.Millisecond) // past the store's racy window
	base, err := s.Checkpoint(ctx, "base")
	if err != nil {
		b.Fatal(err)
	}
	stages := &stageTimes{d: map[string][]time.Duration{}}
	forkStageHook = stages.add
	b.Cleanup(func() { forkStageHook = nil })
	var takeT, restoreT []time.Duration
	for i := 0; b.Loop(); i++ {
		mustRun(b, s, fmt.Sprintf("v_df.iloc[0, 0] = %d\nopen('/workspace/small.txt', 'w').write('%d')", i, i))
		t0 := time.Now()
		cp, err := s.Checkpoint(ctx, "")
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		mustRun(b, s, "v_df.iloc[:1000, 1] = -1\nopen('/workspace/data/f3.bin', 'r+b').write(b'changed')")
		t2 := time.Now()
		if _, err := s.RestoreCheckpoint(ctx, base.ID); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if err := s.DeleteCheckpoint(ctx, cp.ID); err != nil {
			b.Fatal(err)
		}
		takeT = append(takeT, t1.Sub(t0))
		restoreT = append(restoreT, t3.Sub(t2))
	}
	b.StopTimer()
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load average: %s; stages (p50): %s", strings.TrimSpace(string(load)), stages.reset())
	mt, mr, mb := median(takeT), median(restoreT), median(rebuildT)
	b.ReportMetric(float64(mt.Microseconds())/1e3, "checkpoint-ms")
	b.ReportMetric(float64(mr.Microseconds())/1e3, "restore-ms")
	b.ReportMetric(float64(mb.Microseconds())/1e3, "rebuild-ms")
	b.ReportMetric(float64(mb)/float64(mr), "rebuild/restore")
	b.Logf("100 MB DataFrame + 50 MB of files: checkpoint p50 %v, restore p50 %v (n=%d); re-running the cells p50 %v (n=%d); ratio rebuild/restore %.0f",
		mt, mr, len(takeT), mb, len(rebuildT), float64(mb)/float64(mr))
}

// BenchmarkCheckpointSpaced takes checkpoints of a session holding a
// 100 MB DataFrame and 50 MB of files 1.1 s apart (a human's or a model's
// pace), a small change between them, three kept: with the memory bound
// checked on the background figures (now), and, alternately in the same
// run, by asking the kernel to measure every copy when the last figure is
// over a second old (before). It reports both medians and their ratio.
func BenchmarkCheckpointSpaced(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, &Options{Limits: benchLimits})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	b.Cleanup(func() { measureOnRequest = false })
	mustRun(b, s, buildDataFrame)
	mustRun(b, s, buildFiles)
	var kept []string
	var before, now []time.Duration
	for i := 0; b.Loop(); i++ {
		for _, old := range []bool{i%2 == 0, i%2 != 0} {
			measureOnRequest = old
			mustRun(b, s, fmt.Sprintf("v_df.iloc[%d, 0] = %d\nopen('/workspace/small.txt', 'w').write('%d')", i, i, i))
			time.Sleep(1100 * time.Millisecond)
			t0 := time.Now()
			cp, err := s.Checkpoint(ctx, "")
			d := time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if old {
				before = append(before, d)
			} else {
				now = append(now, d)
			}
			if kept = append(kept, cp.ID); len(kept) > 3 {
				if err := s.DeleteCheckpoint(ctx, kept[0]); err != nil {
					b.Fatal(err)
				}
				kept = kept[1:]
			}
		}
	}
	b.StopTimer()
	measureOnRequest = false
	load, _ := os.ReadFile("/proc/loadavg")
	mb, mn := median(before), median(now)
	b.ReportMetric(float64(mb.Microseconds())/1e3, "before-ms")
	b.ReportMetric(float64(mn.Microseconds())/1e3, "checkpoint-ms")
	b.ReportMetric(float64(mb)/float64(mn), "before/now")
	b.Logf("load average: %s; checkpoints 1.1 s apart, 100 MB DataFrame + 50 MB of files, 3 kept: p50 %v now (background measure), %v before (measured on the request) (n=%d each); ratio %.1f",
		strings.TrimSpace(string(load)), mn, mb, len(now), float64(mb)/float64(mn))
}

// BenchmarkFork forks a session holding a 100 MB DataFrame and 50 MB of
// files into one child, and once into ten, beside making a new session and
// re-running the cells that built the state; it reports the medians, the
// ratio, and how long the parent's cells waited during a fork.
func BenchmarkFork(b *testing.B) {
	ctx := context.Background()
	m, how := benchManager(b, ManagerOptions{Defaults: benchLimits, Max: benchLimits, MaxSessions: 32})
	parent, err := m.Create(ctx, CreateOptions{Owner: "b"})
	if err != nil {
		b.Fatal(err)
	}
	rebuild(b, parent.Session)
	// Baseline of the remap (remap.go): a parent whose buffers stay its
	// own anonymous memory (noRemap at each of its forks).
	base, err := m.Create(ctx, CreateOptions{Owner: "b"})
	if err != nil {
		b.Fatal(err)
	}
	rebuild(b, base.Session)
	// Baseline: a new session and the cells again.
	var newT []time.Duration
	for range 3 {
		t0 := time.Now()
		s, err := m.Create(ctx, CreateOptions{Owner: "b"})
		if err != nil {
			b.Fatal(err)
		}
		rebuild(b, s.Session)
		newT = append(newT, time.Since(t0))
		s.Close()
	}
	stages := &stageTimes{d: map[string][]time.Duration{}}
	forkStageHook = stages.add
	b.Cleanup(func() { forkStageHook = nil })
	// fork forks the parent into n while it runs cells, and returns how
	// long the fork took and the parent's longest cell wait. copyAll
	// forgets the parent's last export first, so that the DataFrame is
	// copied into the state file again (the baseline: no exportCache).
	var remapT, remapTurnT []time.Duration
	var provedPages, provedBytes []int64 // of the exports with a base: bytes proven equal by pages, by comparing
	var forkOf func(parent *Managed, n int, copyAll bool) ([]*Managed, time.Duration, time.Duration)
	fork := func(n int, copyAll bool) ([]*Managed, time.Duration, time.Duration) {
		return forkOf(parent, n, copyAll)
	}
	forkOf = func(parent *Managed, n int, copyAll bool) ([]*Managed, time.Duration, time.Duration) {
		if copyAll {
			parent.Session.exports.keep(nil, 0)
		}
		stop := make(chan struct{})
		var stall time.Duration
		var wg sync.WaitGroup
		wg.Go(func() { // the parent's cells while it is forked
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				mustRun(b, parent.Session, "1")
				stall = max(stall, time.Since(t0))
			}
		})
		t0 := time.Now()
		kids, _, err := m.Fork(ctx, "b", parent.ID(), ForkOptions{Count: n})
		d := time.Since(t0)
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		// The remap after the fork (remapLater) ends before the next one
		// starts (it runs in the parent's turns, in pieces, a cell waiting
		// for at most one): its time is reported apart.
		took := parent.Session.remap.took.Load()
		t1 := time.Now()
		parent.Session.remapWait()
		if turns := parent.Session.remap.took.Load() - took; turns > 0 {
			remapT = append(remapT, time.Since(t1))
			remapTurnT = append(remapTurnT, time.Duration(turns))
		}
		if last := parent.Session.remap.last.Load(); !copyAll && last != nil {
			provedPages, provedBytes = append(provedPages, last.MappedBytes), append(provedBytes, last.ComparedBytes)
		}
		return kids, d, stall
	}
	// Each round forks twice: first copying the DataFrame (as without the
	// cache), then again with the first export to compare against.
	var baseT, baseStallT []time.Duration
	var forkT, copyT, stallT, copyStallT, liveT, liveStallT, filesCopyT, filesCopyStallT []time.Duration
	var childMem []int64
	copied, compared := &stageTimes{d: map[string][]time.Duration{}}, &stageTimes{d: map[string][]time.Duration{}}
	live, filesCopied := &stageTimes{d: map[string][]time.Duration{}}, &stageTimes{d: map[string][]time.Duration{}}
	filesBy, _ := ForkFilesSupport()
	var first string
	grandT := map[bool][]time.Duration{}
	grandStages := map[bool]*stageTimes{false: {d: map[string][]time.Duration{}}, true: {d: map[string][]time.Duration{}}}
	for i := 0; b.Loop(); i++ {
		kids, d, stall := fork(1, true)
		copyT, copyStallT = append(copyT, d), append(copyStallT, stall)
		kids[0].Close()
		if i == 0 {
			first = stages.reset() // the files were new to the parent's store
		} else {
			copied.merge(stages)
		}
		kids, d, stall = fork(1, false)
		forkT, stallT = append(forkT, d), append(stallT, stall)
		childMem = append(childMem, privateMemory(b, kids[0].Session))
		compared.merge(stages)
		// A fork of that child, whose DataFrame lies over the state files
		// it was loaded from: proven unchanged by its pages, and, the
		// baseline, by comparing its bytes (kernel.ExportByBytes); in
		// turns, each first every other round.
		for _, byBytes := range []bool{i%2 == 0, i%2 != 0} {
			kernel.ExportByBytes.Store(byBytes)
			t0 := time.Now()
			grand, _, err := m.Fork(ctx, "b", kids[0].ID(), ForkOptions{Count: 1})
			d := time.Since(t0)
			kernel.ExportByBytes.Store(false)
			if err != nil {
				b.Fatal(err)
			}
			grand[0].Close()
			grandT[byBytes] = append(grandT[byBytes], d)
			grandStages[byBytes].merge(stages)
		}
		// Again while that child lives: its frozen files are reused.
		again, d, stall := fork(1, false)
		liveT, liveStallT = append(liveT, d), append(liveStallT, stall)
		live.merge(stages)
		again[0].Close()
		kids[0].Close()
		// Baseline: the files copied into the child (ForkFilesCopy).
		m.opts.ForkFiles = ForkFilesCopy
		kids, d, stall = fork(1, false)
		m.opts.ForkFiles = ""
		filesCopyT, filesCopyStallT = append(filesCopyT, d), append(filesCopyStallT, stall)
		kids[0].Close()
		filesCopied.merge(stages)
		// Baseline of the remap: the same forks of a parent whose
		// buffers stay anonymous (compared with the last export's bytes).
		noRemap.Store(true)
		kids, _, _ = forkOf(base, 1, true)
		kids[0].Close()
		stages.reset()
		kids, d, stall = forkOf(base, 1, false)
		baseT, baseStallT = append(baseT, d), append(baseStallT, stall)
		noRemap.Store(false)
		kids[0].Close()
		stages.reset()
	}
	b.StopTimer()
	turn := median(append(copied.get("source-turn"), compared.get("source-turn")...))
	fresh, err := m.Create(ctx, CreateOptions{Owner: "b"})
	if err != nil {
		b.Fatal(err)
	}
	freshMem := privateMemory(b, fresh.Session)
	fresh.Close()
	parentMem, baseMem := anonMemory(b, parent.Session), anonMemory(b, base.Session)
	noRemap.Store(true)
	kids, baseTen, _ := forkOf(base, 10, false)
	noRemap.Store(false)
	stages.reset()
	for _, k := range kids {
		k.Close()
	}
	ten := map[bool]time.Duration{}
	tenStages := map[bool]string{}
	var tenMem []int64
	for _, copyAll := range []bool{true, false} {
		kids, d, _ := fork(10, copyAll)
		ten[copyAll], tenStages[copyAll] = d, stages.reset()
		for _, k := range kids {
			if !copyAll {
				tenMem = append(tenMem, privateMemory(b, k.Session))
			}
			k.Close()
		}
	}
	m.opts.ForkFiles = ForkFilesCopy
	kids, tenFilesCopy, _ := fork(10, false)
	m.opts.ForkFiles = ""
	tenFilesCopyStages := stages.reset()
	for _, k := range kids {
		k.Close()
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load average: %s", strings.TrimSpace(string(load)))
	b.Logf("a fork of the root, its buffers remapped from its last export (remap.go): fork p50 %v, parent's wait p50 %v, 10 children %v; its buffers its own (baseline, noRemap): fork p50 %v (n=%d), parent's wait p50 %v, 10 children %v; ratio baseline/remapped %.2f; the remap after a fork: p50 %v until done, of which the kernel's turns %v (n=%d); the parent's anonymous memory (smaps_rollup; what its cgroup is charged): remapped %.1f MiB, baseline %.1f MiB; an export with a base proved equal by pages %.1f MiB, by bytes %.1f MiB (p50)",
		median(forkT), median(stallT), ten[false], median(baseT), len(baseT), median(baseStallT), baseTen, float64(median(baseT))/float64(median(forkT)),
		median(remapT), median(remapTurnT), len(remapT), mib(parentMem), mib(baseMem), mib(medianInt(provedPages)), mib(medianInt(provedBytes)))
	b.Logf("the first fork (50 MB of files new to the parent's store: copied and hashed in its turn): %s; the parent's turn at the next ones p50 %v", first, turn.Round(100*time.Microsecond))
	b.Logf("stages of one fork, the DataFrame copied (p50 of the next ones): %s", copied.reset())
	b.Logf("stages of one fork, the DataFrame compared with the last export (p50): %s", compared.reset())
	b.Logf("stages of a fork into 10, copied (p50 of each child's): %s", tenStages[true])
	b.Logf("stages of a fork into 10, compared (p50 of each child's): %s", tenStages[false])
	b.Logf("files by %s (the default here); baseline ForkFilesCopy: stages of one fork (p50): %s; of a fork into 10: %s", filesBy, filesCopied.reset(), tenFilesCopyStages)
	b.Logf("stages of one fork while the last one's child lives (its frozen files reused; p50): %s", live.reset())
	b.Logf("files by %s: fork p50 %v, 10 children %v, parent's longest cell wait p50 %v; while a child of the last fork lives: fork p50 %v, wait p50 %v; files copied into each child (baseline): fork p50 %v, 10 children %v, wait p50 %v; ratio copy/%s: 1 child %.2f, 10 children %.2f",
		filesBy, median(forkT), ten[false], median(stallT), median(liveT), median(liveStallT), median(filesCopyT), tenFilesCopy, median(filesCopyStallT), filesBy,
		float64(median(filesCopyT))/float64(median(forkT)), float64(tenFilesCopy)/float64(ten[false]))
	b.Logf("a fork of a child (its DataFrame over the state files it was loaded from): proven unchanged by its pages p50 %v (stages %s); by comparing its bytes (baseline, ExportByBytes) p50 %v (stages %s); ratio bytes/pages %.2f",
		median(grandT[false]), grandStages[false].reset(), median(grandT[true]), grandStages[true].reset(), float64(median(grandT[true]))/float64(median(grandT[false])))
	b.ReportMetric(float64(median(grandT[false]).Microseconds())/1e3, "fork-of-child-ms")
	b.ReportMetric(float64(median(grandT[true]).Microseconds())/1e3, "fork-of-child-by-bytes-ms")
	b.ReportMetric(float64(median(baseT).Microseconds())/1e3, "fork-no-remap-ms")
	b.ReportMetric(float64(baseTen.Microseconds())/1e3, "fork10-no-remap-ms")
	b.ReportMetric(float64(median(remapTurnT).Microseconds())/1e3, "remap-turns-ms")
	b.Logf("child's kernel private memory (smaps_rollup Private_Clean+Private_Dirty) p50: 1 child %.1f MiB, 10 children %.1f MiB; a new session's %.1f MiB",
		mib(medianInt(childMem)), mib(medianInt(tenMem)), mib(freshMem))
	b.ReportMetric(mib(medianInt(childMem)), "child-private-MiB")
	b.ReportMetric(float64(turn.Microseconds())/1e3, "parent-turn-ms")
	mf, mc, mn, ms := median(forkT), median(copyT), median(newT), median(stallT)
	b.ReportMetric(float64(mf.Microseconds())/1e3, "fork-ms")
	b.ReportMetric(float64(mc.Microseconds())/1e3, "fork-copied-ms")
	b.ReportMetric(float64(ten[false].Microseconds())/1e3, "fork10-ms")
	b.ReportMetric(float64(ten[true].Microseconds())/1e3, "fork10-copied-ms")
	b.ReportMetric(float64(ms.Microseconds())/1e3, "parent-stall-ms")
	b.ReportMetric(float64(mn.Microseconds())/1e3, "new+rebuild-ms")
	b.ReportMetric(float64(mn)/float64(mf), "new+rebuild/fork")
	b.Logf("100 MB DataFrame + 50 MB of files, %s children: fork p50 %v (n=%d), 10 children %v, parent's longest cell wait p50 %v; the DataFrame copied again (no export to compare with): fork p50 %v, 10 children %v, parent's wait p50 %v; ratio copied/compared %.2f; new session + re-running the cells p50 %v (n=%d); ratio (new+rebuild)/fork %.2f",
		how, mf, len(forkT), ten[false], ms, mc, ten[true], median(copyStallT), float64(mc)/float64(mf), mn, len(newT), float64(mn)/float64(mf))
}

// stageTimes gathers forkStageHook's reports.
type stageTimes struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (s *stageTimes) add(stage string, d time.Duration) {
	s.mu.Lock()
	s.d[stage] = append(s.d[stage], d)
	s.mu.Unlock()
}

func (s *stageTimes) get(stage string) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.d[stage])
}

// merge moves o's durations into s.
func (s *stageTimes) merge(o *stageTimes) {
	o.mu.Lock()
	d := o.d
	o.d = map[string][]time.Duration{}
	o.mu.Unlock()
	s.mu.Lock()
	for k, v := range d {
		s.d[k] = append(s.d[k], v...)
	}
	s.mu.Unlock()
}

// reset returns the medians so far, by stage, and forgets them.
func (s *stageTimes) reset() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, k := range []string{"source", "source-turn", "source-prefreeze", "source-files", "source-frozen", "export", "create", "files", "import", "at-created", "at-exported", "at-imported", "at-done", "checkpoint-kernel", "checkpoint-files", "restore-kernel", "restore-files-prepare", "restore-files"} {
		if d := s.d[k]; len(d) > 0 {
			out = append(out, fmt.Sprintf("%s %v", k, median(d).Round(100*time.Microsecond)))
		}
	}
	s.d = map[string][]time.Duration{}
	return strings.Join(out, ", ")
}

// anonMemory is the anonymous memory of the session's kernel process
// (smaps_rollup's Anonymous, in bytes): not the pages of files it maps.
func anonMemory(b *testing.B, s *Session) int64 {
	b.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: "print(sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('Anonymous:')) * 1024)"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64)
	if err != nil {
		b.Fatalf("anonymous memory: %q %s %v", r.Stdout, r.Stderr, r.Error)
	}
	return n
}

// privateMemory is the private memory of the session's kernel process
// (smaps_rollup's Private_Clean + Private_Dirty, in bytes), read by a cell.
func privateMemory(b *testing.B, s *Session) int64 {
	b.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: "print(sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('Private_')) * 1024)"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64)
	if err != nil {
		b.Fatalf("private memory: %q %s %v", r.Stdout, r.Stderr, r.Error)
	}
	return n
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// benchManager is a manager with o, its sessions forked from a pandas
// template where the zygote runs ("zygote-forked"), else cold ("cold").
func benchManager(b *testing.B, o ManagerOptions) (*Manager, string) {
	how := "cold"
	if zygote.Supported() == nil {
		z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"pandas", "numpy"}, Env: KernelEnv(), Spares: 2})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { z.Close() })
		o.Zygote, how = z, "zygote-forked"
	}
	m := NewManager(&o)
	b.Cleanup(func() { m.Close() })
	return m, how
}
