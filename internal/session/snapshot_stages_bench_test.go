package session

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkSessionSnapshotStages times the stages of BenchmarkSessionSnapshot's
// snapshot and restore one by one (a 100 MB DataFrame and 50 MB of files),
// to show where the time goes: the kernel's export of its variables, a
// files-only snapshot, the whole snapshot; a session's creation, the files
// restored into it, the state stream read back (fetched, decompressed and
// verified), its import into the kernel, and the whole restore
// (Create from the snapshot). The blobs' reading, decompression and
// hashing are also timed alone, on one core. Medians, in ms.
func BenchmarkSessionSnapshotStages(b *testing.B) {
	b.Run("cold", func(b *testing.B) { snapshotStages(b, nil) })
	b.Run("zygote", func(b *testing.B) {
		if err := zygote.Supported(); err != nil {
			b.Skip("no zygote here: ", err)
		}
		z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"pandas", "numpy"}, Env: KernelEnv(), Spares: 2})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { z.Close() })
		snapshotStages(b, z)
	})
}

func snapshotStages(b *testing.B, z Zygote) {
	ctx := context.Background()
	dir := b.TempDir()
	d, err := snapshot.NewDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	tb := &timedBackend{Dir: d}
	st, err := snapshot.New(tb, nil)
	if err != nil {
		b.Fatal(err)
	}
	o := &ManagerOptions{Snapshots: st, Defaults: benchLimits, Max: benchLimits, MaxSessions: 8}
	if z != nil {
		o.Zygote = z
	}
	m := NewManager(o)
	b.Cleanup(func() { m.Close() })
	src, err := m.Create(ctx, CreateOptions{Owner: "b"})
	if err != nil {
		b.Fatal(err)
	}
	mustRun(b, src.Session, buildDataFrame)
	mustRun(b, src.Session, buildFiles)
	stages := map[string][]time.Duration{}
	order := []string{"snap:syncfs"}
	timed := func(name string, fn func()) {
		b.Helper()
		if _, ok := stages[name]; !ok {
			order = append(order, name)
		}
		t0 := time.Now()
		fn()
		stages[name] = append(stages[name], time.Since(t0))
	}
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	var mu sync.Mutex
	snapshotStageHook = func(stage string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		name := "restore:total:" + stage
		if _, ok := stages[name]; !ok {
			order = append(order, name)
		}
		stages[name] = append(stages[name], d)
	}
	b.Cleanup(func() { snapshotStageHook = nil })
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	must(err)
	defer dec.Close()
	for b.Loop() {
		// Snapshot stages.
		var state bytes.Buffer
		timed("snap:export", func() {
			must(src.Session.acquireRunning(ctx))
			defer src.Session.release()
			kc, err := src.Session.liveCheckpoints()
			must(err)
			_, err = kc.ExportState(ctx, &state, 0)
			must(err)
		})
		var filesOnly *snapshot.Manifest
		timed("snap:files-only", func() {
			ws, err := OpenWorkspace(src.Workspace(), workspace.Options{})
			must(err)
			defer ws.Close()
			filesOnly, err = st.Write(ctx, "b", snapshot.WorkspaceSource(ws), nil)
			must(err)
		})
		must(st.Delete(ctx, "b", filesOnly.ID))
		var man *snapshot.Manifest
		tb.sync.Store(0)
		timed("snap:total", func() {
			man, err = m.Snapshot(ctx, "b", src.ID(), "")
			must(err)
		})
		stages["snap:syncfs"] = append(stages["snap:syncfs"], time.Duration(tb.sync.Load()))

		// Restore stages, one CPU: read, decompress, hash every blob.
		var blobs [][]byte
		timed("blobs:read", func() {
			blobs = blobs[:0]
			each(man, func(c snapshot.Chunk) {
				z, err := os.ReadFile(filepath.Join(dir, "blobs", c.Hash[:2], c.Hash))
				must(err)
				blobs = append(blobs, z)
			})
		})
		var raw [][]byte
		timed("blobs:decompress", func() {
			for _, z := range blobs {
				if bytes.HasPrefix(z, []byte("SLR1")) { // stored raw
					raw = append(raw, z[4:])
					continue
				}
				d, err := dec.DecodeAll(z, nil)
				must(err)
				raw = append(raw, d)
			}
		})
		timed("blobs:sha256", func() {
			for _, d := range raw {
				sha256.Sum256(d)
			}
		})
		blobs, raw = nil, nil

		// Restore stages, as the session does them.
		var dst *Managed
		timed("restore:create", func() {
			dst, err = m.Create(ctx, CreateOptions{Owner: "b"})
			must(err)
		})
		timed("restore:files", func() {
			ws, err := OpenWorkspace(dst.Workspace(), workspace.Options{})
			must(err)
			defer ws.Close()
			_, _, err = st.Restore(ctx, "b", man.ID, ws)
			must(err)
		})
		timed("restore:state-read", func() {
			rc, _, err := st.OpenState(ctx, "b", man.ID)
			must(err)
			defer rc.Close()
			_, err = io.Copy(io.Discard, rc)
			must(err)
		})
		timed("restore:import", func() {
			must(dst.Session.acquireRunning(ctx))
			defer dst.Session.release()
			kc, err := dst.Session.liveCheckpoints()
			must(err)
			_, err = kc.ImportState(ctx, bytes.NewReader(state.Bytes()))
			must(err)
		})
		dst.Close()
		timed("restore:total", func() {
			dst, err = m.Create(ctx, CreateOptions{Owner: "b", Snapshot: man.ID})
			must(err)
		})
		dst.Close()
		must(st.Delete(ctx, "b", man.ID))
	}
	b.StopTimer()
	for _, name := range order {
		d := median(stages[name])
		b.ReportMetric(float64(d.Microseconds())/1e3, name+"-ms")
	}
}

func each(m *snapshot.Manifest, fn func(snapshot.Chunk)) {
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			fn(c)
		}
	}
	if m.State != nil {
		for _, c := range m.State.Chunks {
			fn(c)
		}
	}
}

// timedBackend is the directory backend, timing its Syncs.
type timedBackend struct {
	*snapshot.Dir
	sync atomic.Int64
}

func (t *timedBackend) Sync(ctx context.Context) error {
	t0 := time.Now()
	err := t.Dir.Sync(ctx)
	t.sync.Add(int64(time.Since(t0)))
	return err
}
