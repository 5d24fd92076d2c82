package session

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkSessionSnapshot: a session holding a 100 MB pandas DataFrame
// and 50 MB of files (issue 28's state), its kernel forked from a zygote
// as serve's are by default (cold where the host cannot run one), is
// snapshotted to a directory store (its kernel's variables serialized, its
// files chunked, hashed and compressed), restored into a new session (files, then the variables
// loaded), and snapshotted again after a 1 MB change of one file, beside
// the baseline of `tar | gzip` of the same files and the same variables
// (the DataFrame pickled to a file by the kernel first, which the
// baseline's time includes) and `gzip -d | tar -x` back, in the same run.
// It reports the medians, their ratios, and the bytes the second snapshot
// wrote, counted at the storage. Disk: ~600 MB at the peak, in
// b.TempDir().
func BenchmarkSessionSnapshot(b *testing.B) {
	ctx := context.Background()
	st, cb, _ := snapshotStore(b, nil)
	o := &ManagerOptions{Snapshots: st, Defaults: benchLimits, Max: benchLimits, MaxSessions: 8}
	// As `sandloop serve` runs by default (--zygote auto): sessions forked
	// from a kernel that has imported pandas, where the host can.
	how := "cold"
	if zygote.Supported() == nil {
		z, err := zygote.New(ctx, &zygote.Options{Modules: []string{"pandas", "numpy"}, Env: KernelEnv(), Spares: 2})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { z.Close() })
		o.Zygote, how = z, "zygote-forked"
	}
	m := NewManager(o)
	b.Cleanup(func() { m.Close() })
	src, err := m.Create(ctx, CreateOptions{Owner: "b"})
	if err != nil {
		b.Fatal(err)
	}
	mustRun(b, src.Session, buildDataFrame)
	mustRun(b, src.Session, buildFiles)

	// The baseline: the variables pickled to a file in the workspace, then
	// tar | gzip of the workspace; gzip -d | tar -x back (into a
	// directory: no session, no variables loaded, so it is a lower bound).
	tarDir := b.TempDir()
	tgz := filepath.Join(tarDir, "out.tgz")
	sh := func(cmd string) {
		b.Helper()
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	var tarT, untarT, snapT, restoreT, incrT []time.Duration
	var tgzBytes, firstBytes, incrBytes int64
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		mustRun(b, src.Session, "import pickle\nwith open('/workspace/state.pkl', 'wb') as f: pickle.dump(v_df, f, protocol=5)")
		sh(fmt.Sprintf("tar -C %s -cf - . | gzip > %s", src.Workspace(), tgz))
		tarT = append(tarT, time.Since(t0))
		fi, _ := os.Stat(tgz)
		tgzBytes = fi.Size()
		mustRun(b, src.Session, "import os\nos.remove('/workspace/state.pkl')")
		out := b.TempDir()
		t0 = time.Now()
		sh(fmt.Sprintf("gzip -dc %s | tar -C %s -xf -", tgz, out))
		untarT = append(untarT, time.Since(t0))
		os.RemoveAll(out)
		os.Remove(tgz)

		cb.put.Store(0)
		t0 = time.Now()
		man, err := m.Snapshot(ctx, "b", src.ID(), "")
		if err != nil {
			b.Fatal(err)
		}
		snapT = append(snapT, time.Since(t0))
		firstBytes = cb.put.Load()

		t0 = time.Now()
		dst, err := m.Create(ctx, CreateOptions{Owner: "b", Snapshot: man.ID})
		if err != nil {
			b.Fatal(err)
		}
		restoreT = append(restoreT, time.Since(t0))
		dst.Close()

		mustRun(b, src.Session, fmt.Sprintf("open('/workspace/data/f7.bin', 'r+b').write(os.urandom(1 << 20)) or %d", i))
		cb.put.Store(0)
		t0 = time.Now()
		man2, err := m.Snapshot(ctx, "b", src.ID(), "")
		if err != nil {
			b.Fatal(err)
		}
		incrT = append(incrT, time.Since(t0))
		incrBytes = cb.put.Load()
		for _, id := range []string{man.ID, man2.ID} {
			if err := st.Delete(ctx, "b", id); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	ms, mr, mi, mt, mu := median(snapT), median(restoreT), median(incrT), median(tarT), median(untarT)
	b.ReportMetric(float64(ms.Microseconds())/1e3, "snapshot-ms")
	b.ReportMetric(float64(mr.Microseconds())/1e3, "restore-ms")
	b.ReportMetric(float64(mi.Microseconds())/1e3, "second-snapshot-ms")
	b.ReportMetric(float64(incrBytes)/(1<<20), "second-snapshot-MB-written")
	b.ReportMetric(float64(mt)/float64(ms), "tar-gzip/snapshot")
	b.ReportMetric(float64(mu)/float64(mr), "gunzip-tar/restore")
	b.Logf("100 MB DataFrame + 50 MB of files, %s sessions: snapshot p50 %v (%.1f MB written), restore into a new session p50 %v, second snapshot after a 1 MB change p50 %v (%.2f MB written); pickle + tar|gzip p50 %v (%.1f MB), gzip -d|tar -x p50 %v (no session, no variables loaded); n=%d; ratios tar-gzip/snapshot %.2f, gunzip-tar/restore %.2f",
		how, ms, float64(firstBytes)/(1<<20), mr, mi, float64(incrBytes)/(1<<20), mt, float64(tgzBytes)/(1<<20), mu, len(snapT), float64(mt)/float64(ms), float64(mu)/float64(mr))
}
