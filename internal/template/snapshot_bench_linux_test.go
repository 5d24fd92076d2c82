package template_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkTemplateFromSnapshot measures, in one run, creating a session
// (until it is handed out) three ways, each from a warm zygote: a plain
// session; a session of a template built from a snapshot holding a 40 MB
// numpy array, a small dict and 8 MB of files (each session: the files
// copied, the variables mapped from the shared state file); and a plain
// session restored from that snapshot (CreateOptions.Snapshot: read,
// decompressed and verified each time). Run with -benchtime=1x: each way
// is measured 9 times whatever b.N is, the medians and ratios printed.
func BenchmarkTemplateFromSnapshot(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
	}
	ctx := context.Background()
	snaps := snapshotStoreAt(b, b.TempDir())
	store, err := template.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	pool := template.NewPool(store, nil)
	b.Cleanup(pool.Close)
	z, err := zygote.New(ctx, &zygote.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { z.Close() })
	m := session.NewManager(&session.ManagerOptions{Templates: pool, Snapshots: snaps, Zygote: z})
	b.Cleanup(func() { m.Close() })

	src, err := m.Create(ctx, session.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	mustRun(b, src, "import numpy as np, os\nbig = np.arange(5_000_000, dtype=np.float64)\ncfg = {'k': list(range(100))}\nos.makedirs('/workspace/d', exist_ok=True)\nfor i in range(8): open(f'/workspace/d/f{i}.bin','wb').write(os.urandom(1<<20))")
	man, err := m.Snapshot(ctx, "", src.ID(), "")
	if err != nil {
		b.Fatal(err)
	}
	src.Close()
	if _, err := store.BuildFromSnapshot(ctx, "bench-seeded", template.SnapshotSource{Store: snaps}, man.ID, nil); err != nil {
		b.Fatal(err)
	}
	if err := pool.Warm(ctx, []string{"bench-seeded"}); err != nil {
		b.Fatal(err)
	}
	const n = 9
	measure := func(o session.CreateOptions, check string) time.Duration {
		var ds []time.Duration
		for range n {
			t0 := time.Now()
			s, err := m.Create(ctx, o)
			if err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
			if check != "" {
				mustRun(b, s, check)
			}
			s.Close()
		}
		return median(ds)
	}
	check := "assert big[-1] == 4_999_999 and cfg['k'][-1] == 99 and os.path.getsize('/workspace/d/f7.bin') == 1<<20"
	for range b.N {
		plain := measure(session.CreateOptions{}, "")
		seeded := measure(session.CreateOptions{Template: "bench-seeded"}, "import os\n"+check)
		restored := measure(session.CreateOptions{Snapshot: man.ID}, "import os\n"+check)
		b.Logf("create to handed out, median of %d: plain %v; template from a snapshot (40 MB array, 8 MB files) %v (%.1fx plain); restoring the snapshot instead %v (%.1fx plain, %.1fx the template)",
			n, plain, seeded, ratio(seeded, plain), restored, ratio(restored, plain), ratio(restored, seeded))
	}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
