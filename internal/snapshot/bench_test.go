package snapshot

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/workspace"
)

// BenchmarkSnapshot: a session of 50 MB of files (half random, half CSV
// text) and a 100 MB kernel state (a DataFrame's pickle: 60 MB of random
// float bytes, 40 MB of repetitive columns). Per backend it times a first
// snapshot, a second one after a 1 MB change, and a restore (files into a
// new workspace and the state read back), beside `tar | gzip` of the same
// files and state and `gzip -d | tar -x` in the same run, and prints the
// ratios. Disk: ~600 MB at the peak, in b.TempDir(), removed per round.
func BenchmarkSnapshot(b *testing.B) {
	src := b.TempDir()
	for i := range 10 {
		mustWriteB(b, filepath.Join(src, fmt.Sprintf("data/random%02d.bin", i)), randBytes(uint64(200+i), 25<<20/10))
	}
	var csv strings.Builder
	for i := 0; csv.Len() < 25<<20; i++ {
		fmt.Fprintf(&csv, "%d,%d.%03d,item-%d,%s\n", i, i*7%1000, i%997, i%5000, []string{"red", "green", "blue"}[i%3])
	}
	for i := range 5 {
		mustWriteB(b, filepath.Join(src, fmt.Sprintf("csv/part%d.csv", i)), []byte(csv.String()[i*5<<20:(i+1)*5<<20]))
	}
	state := append(randBytes(300, 60<<20), []byte(strings.Repeat("0123456789abcdef", 40<<20/16))...)
	w, err := workspace.Open(src, &workspace.Options{MaxFileBytes: 256 << 20, MaxTotalBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()

	// The baseline: tar | gzip of the files and the state, and back.
	tarDir := b.TempDir()
	os.WriteFile(filepath.Join(tarDir, "state.bin"), state, 0o644) // beside the files, as tar would take it
	tgz := filepath.Join(tarDir, "out.tgz")
	tarTime := func() (time.Duration, time.Duration, int64) {
		t0 := time.Now()
		sh(b, fmt.Sprintf("tar -C %s -cf - . -C %s state.bin | gzip > %s", src, tarDir, tgz))
		pack := time.Since(t0)
		fi, _ := os.Stat(tgz)
		out := b.TempDir()
		t0 = time.Now()
		sh(b, fmt.Sprintf("gzip -dc %s | tar -C %s -xf -", tgz, out))
		unpack := time.Since(t0)
		os.RemoveAll(out)
		os.Remove(tgz)
		return pack, unpack, fi.Size()
	}

	for _, bc := range []struct {
		name string
		open func(b *testing.B) Backend
	}{
		{"dir", func(b *testing.B) Backend {
			d, err := NewDir(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return d
		}},
		{"s3", func(b *testing.B) Backend {
			weed.once.Do(startWeed)
			if weed.skip != "" || weed.err != nil {
				b.Skip(weed.skip, weed.err)
			}
			s, err := openS3Prefix(weed.endpoint, "bench-"+strings.ToLower(fmt.Sprint(time.Now().UnixNano()))+"/")
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var snap, incr, restore, pack, unpack time.Duration
			var stored, incrBytes, tgzBytes int64
			for i := 0; i < b.N; i++ {
				be := bc.open(b)
				s, err := New(be, nil)
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				m, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{State: stateOf(state)})
				if err != nil {
					b.Fatal(err)
				}
				snap += time.Since(t0)
				stored = m.StoredBytes

				p := filepath.Join(src, "data/random03.bin")
				data, _ := os.ReadFile(p)
				orig := append([]byte(nil), data...)
				copy(data[1<<20:], randBytes(uint64(900+i), 1<<20))
				os.WriteFile(p, data, 0o644)
				t0 = time.Now()
				m2, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{State: stateOf(state)})
				if err != nil {
					b.Fatal(err)
				}
				incr += time.Since(t0)
				incrBytes = m2.NewBytes
				os.WriteFile(p, orig, 0o644)

				dstDir := b.TempDir()
				dst, err := workspace.Open(dstDir, &workspace.Options{MaxFileBytes: 256 << 20, MaxTotalBytes: 1 << 30})
				if err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				if _, _, err := s.Restore(ctx, "o", m.ID, dst); err != nil {
					b.Fatal(err)
				}
				r, _, err := s.OpenState(ctx, "o", m.ID)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, r)
				r.Close()
				if err != nil || n != int64(len(state)) {
					b.Fatal(n, err)
				}
				restore += time.Since(t0)
				dst.Close()
				os.RemoveAll(dstDir)
				if d, ok := be.(*Dir); ok {
					os.RemoveAll(d.dir)
				} else {
					s.Delete(ctx, "o", m.ID)
					s.Delete(ctx, "o", m2.ID)
				}

				pk, up, sz := tarTime()
				pack += pk
				unpack += up
				tgzBytes = sz
			}
			n := time.Duration(b.N)
			b.ReportMetric((snap / n).Seconds(), "snapshot_s")
			b.ReportMetric((restore / n).Seconds(), "restore_s")
			b.ReportMetric((pack / n).Seconds(), "tar_gzip_s")
			b.ReportMetric((unpack / n).Seconds(), "untar_s")
			b.ReportMetric(float64(snap)/float64(pack), "snapshot/tar_gzip")
			b.ReportMetric(float64(restore)/float64(unpack), "restore/untar")
			b.ReportMetric(mb(incrBytes), "MB_written_after_1MB_change")
			b.Logf("%s: 50 MB files + 100 MB state: snapshot %v (stored %.0f MB) vs tar|gzip %v (%.0f MB): ratio %.2f; second snapshot after a 1 MB change %v, wrote %.2f MB; restore %v vs gzip -d|tar -x %v: ratio %.2f",
				bc.name, (snap / n).Round(time.Millisecond), mb(stored), (pack / n).Round(time.Millisecond), mb(tgzBytes), float64(snap)/float64(pack),
				(incr / n).Round(time.Millisecond), mb(incrBytes), (restore / n).Round(time.Millisecond), (unpack / n).Round(time.Millisecond), float64(restore)/float64(unpack))
		})
	}
}

func mustWriteB(b *testing.B, p string, data []byte) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

func sh(b *testing.B, cmd string) {
	if out, err := exec.Command("sh", "-c", "set -e; "+cmd).CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}
