package session

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// BenchmarkUndoSession undoes a cell that changed a session holding a
// 100 MB DataFrame and 50 MB of files (checkpoints "auto": one is taken
// before every cell), beside re-running the cells that built the state;
// it reports the medians and their ratio.
func BenchmarkUndoSession(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, &Options{Limits: benchLimits, Checkpoints: CheckpointsAuto})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	var rebuildT []time.Duration
	for range 3 {
		rebuildT = append(rebuildT, rebuild(b, s))
	}
	time.Sleep(100 * time.Millisecond) // past the store's racy window
	var undoT []time.Duration
	for i := 0; b.Loop(); i++ {
		mustRun(b, s, fmt.Sprintf("v_df.iloc[:1000, 1] = %d\nopen('/workspace/data/f3.bin', 'r+b').write(b'changed')\nopen('/workspace/small.txt', 'w').write('%d')", i, i))
		t0 := time.Now()
		if _, err := s.Undo(ctx); err != nil {
			b.Fatal(err)
		}
		undoT = append(undoT, time.Since(t0))
	}
	b.StopTimer()
	if _, err := os.Stat(s.Workspace() + "/small.txt"); err == nil {
		b.Fatal("the undone cell's file is still there")
	}
	load, _ := os.ReadFile("/proc/loadavg")
	mu, mb := median(undoT), median(rebuildT)
	b.ReportMetric(float64(mu.Microseconds())/1e3, "undo-ms")
	b.ReportMetric(float64(mb.Microseconds())/1e3, "rebuild-ms")
	b.ReportMetric(float64(mb)/float64(mu), "rebuild/undo")
	b.Logf("load average: %s", strings.TrimSpace(string(load)))
	b.Logf("100 MB DataFrame + 50 MB of files: undo p50 %v (n=%d); re-running the cells p50 %v (n=%d); ratio rebuild/undo %.0f",
		mu, len(undoT), mb, len(rebuildT), float64(mb)/float64(mu))
}
