package kernel

import (
	"context"
	"fmt"
	"slices"
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
