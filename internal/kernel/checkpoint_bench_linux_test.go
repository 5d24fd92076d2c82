package kernel

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// BenchmarkCheckpointDataFrame measures a checkpoint and a restore of a
// jailed kernel holding a 100 MB pandas DataFrame, beside the baseline: the
// cell that built it, run again (pandas already imported).
func BenchmarkCheckpointDataFrame(b *testing.B) {
	k := startJailed(b, jail.Limits{Memory: 2 << 30})
	ctx := context.Background()
	build := "import numpy as np, pandas as pd\nnp.random.seed(0)\ndf = pd.DataFrame(np.random.rand(1_250_000, 10))\ndf['k'] = df[0] > 0.5\ntotal = df[1].sum()"
	execOK(b, k, build)
	if got := execOK(b, k, "print(df.memory_usage(deep=True).sum() >= 100_000_000)"); got != "True" {
		b.Fatal("the DataFrame holds less than 100 MB")
	}
	var cps, rss, rebuilds []time.Duration
	var held []int64
	for b.Loop() {
		t0 := time.Now()
		cp, err := k.Checkpoint(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		// A cell that changes the state, as the one undone would.
		execOK(b, k, "df[0] *= 2")
		mem, err := k.CheckpointMemory(ctx)
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, mem[cp.ID])
		t2 := time.Now()
		if _, err := k.Restore(ctx, cp.ID); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if err := k.DropCheckpoint(ctx, cp.ID); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		r, err := k.Execute(ctx, Request{Code: build}, nil)
		if err != nil || r.Status != StatusOK {
			b.Fatal(err, r)
		}
		rebuilds = append(rebuilds, time.Since(t4))
		cps = append(cps, t1.Sub(t0))
		rss = append(rss, t3.Sub(t2))
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	c, r, base := p50(cps), p50(rss), p50(rebuilds)
	slices.Sort(held)
	b.ReportMetric(float64(c.Microseconds())/1e3, "checkpoint-p50-ms")
	b.ReportMetric(float64(r.Microseconds())/1e3, "restore-p50-ms")
	b.ReportMetric(float64(base.Microseconds())/1e3, "rebuild-p50-ms")
	b.ReportMetric(float64(held[len(held)/2]>>20), "held-after-a-cell-MiB")
	b.Logf("100 MB DataFrame: checkpoint p50 %v, restore p50 %v; rebuilding by re-running the cell p50 %v: checkpoint %.0fx, restore %.0fx faster than rebuilding; a checkpoint holds %d MiB after a cell rewrote one column",
		c, r, base, float64(base)/float64(c), float64(base)/float64(r), held[len(held)/2]>>20)
	fmt.Printf("checkpoint/rebuild ratio %.3f, restore/rebuild ratio %.3f\n", float64(c)/float64(base), float64(r)/float64(base))
}

// BenchmarkExportImportDataFrame measures moving a 100 MB DataFrame's
// session state into another kernel (what a fork into a new session does),
// beside rebuilding it there by re-running the cell.
func BenchmarkExportImportDataFrame(b *testing.B) {
	src := startJailed(b, jail.Limits{Memory: 2 << 30})
	dst := startJailed(b, jail.Limits{Memory: 2 << 30})
	ctx := context.Background()
	build := "import numpy as np, pandas as pd\nnp.random.seed(0)\ndf = pd.DataFrame(np.random.rand(1_250_000, 10))"
	execOK(b, src, build)
	execOK(b, dst, "import numpy as np, pandas as pd")
	var exports, imports, fileExports, mapped, rebuilds []time.Duration
	var state bytes.Buffer
	for b.Loop() {
		state.Reset()
		t0 := time.Now()
		if _, err := src.ExportState(ctx, &state, 0); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := dst.ImportState(ctx, &state); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		execOK(b, dst, "del df")
		// The fork's path: into a state file, sealed, mapped by the importer.
		f, err := NewStateFile("bench-state")
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if _, err := src.ExportState(ctx, f, 0); err != nil {
			b.Fatal(err)
		}
		if err := SealStateFile(f); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		if _, err := dst.ImportStateFile(ctx, f); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		f.Close()
		execOK(b, dst, "del df")
		t6 := time.Now()
		execOK(b, dst, build)
		rebuilds = append(rebuilds, time.Since(t6))
		exports = append(exports, t1.Sub(t0))
		imports = append(imports, t2.Sub(t1))
		fileExports = append(fileExports, t4.Sub(t3))
		mapped = append(mapped, t5.Sub(t4))
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	e, i, fe, m, base := p50(exports), p50(imports), p50(fileExports), p50(mapped), p50(rebuilds)
	b.ReportMetric(float64(e.Microseconds())/1e3, "export-p50-ms")
	b.ReportMetric(float64(i.Microseconds())/1e3, "import-p50-ms")
	b.ReportMetric(float64(fe.Microseconds())/1e3, "export-file-p50-ms")
	b.ReportMetric(float64(m.Microseconds())/1e3, "import-mapped-p50-ms")
	b.ReportMetric(float64(base.Microseconds())/1e3, "rebuild-p50-ms")
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("100 MB DataFrame (load %s): export p50 %v + import p50 %v = %.2f of rebuilding it (p50 %v); into a state file %v + mapped import %v = %.2f\n",
		strings.Fields(string(load))[0], e, i, float64(e+i)/float64(base), base, fe, m, float64(fe+m)/float64(base))
}
