package kernel

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
)

// TestRemapExport gives a kernel its own export back (RemapExport): its
// large buffers become private mappings of the file where they still
// equal it, without a value changing, also those written after the
// export; memory that is no longer the kernel's own anonymous memory (a
// shared mapping now at a buffer's address) is left alone; no remap while
// another thread lives; the next export proves the remapped buffers
// equal by their pages, or by their bytes with ExportByBytes, and a
// kernel loading it gets the same values.
func TestRemapExport(t *testing.T) {
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	if !src.stateChannel {
		t.Skip("no state channel")
	}
	ctx := context.Background()
	export := func(name string, bases []StateBase) (*os.File, *StateManifest) {
		t.Helper()
		f, err := NewStateFile(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		e, err := src.StartExportOver(ctx, f, 0, false, bases)
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := SealStateFile(f); err != nil {
			t.Fatal(err)
		}
		return f, m
	}
	const digest = "import hashlib\nprint(hashlib.sha256(big.tobytes() + df.to_numpy().tobytes()).hexdigest())"
	const where = `def where(addr):
    for line in open('/proc/self/maps'):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if lo <= addr < hi:
            return f[1] + ' ' + (f[5] if len(f) > 5 else 'anon')
`
	execOK(t, src, `import numpy as np, pandas as pd, mmap, threading
big = np.arange(1 << 20, dtype='float64')
df = pd.DataFrame(np.ones((1 << 17, 4)))
gone = np.full(1 << 19, 3.0)
`+where)
	f1, m1 := export("sandloop-remap-1", nil)
	if len(m1.Remap) < 3 {
		t.Fatalf("the export's remap ranges: %v, want big's, df's and gone's", m1.Remap)
	}
	// After the export: a write to big, and gone's memory given to a
	// shared mapping holding the same bytes at the same address.
	sharedAt := execOK(t, src, `big[:1000] = -1.0
addr, data = gone.ctypes.data, gone.tobytes()
del gone
sh = mmap.mmap(-1, len(data) + 4096)
import ctypes
base = ctypes.addressof(ctypes.c_char.from_buffer(sh))
sh[addr - base:addr - base + len(data)] = data if base <= addr < base + 4096 else b''
print(base <= addr < base + 4096)`)
	want := execOK(t, src, digest)

	// A thread of the user's: refused.
	execOK(t, src, "ev = threading.Event()\nth = threading.Thread(target=ev.wait)\nth.start()")
	r, err := src.RemapExport(ctx, f1, m1.Remap)
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes != 0 || len(r.Threads) == 0 {
		t.Errorf("with a thread waiting: %+v, want nothing remapped and the thread named", r)
	}
	execOK(t, src, "ev.set()\nth.join()\ndel th, ev")

	r, err = src.RemapExport(ctx, f1, m1.Remap)
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes < 11<<20 || r.Bytes > 12<<20 {
		t.Errorf("remapped %d bytes (%s), want big's and df's 12 MiB less big's written page", r.Bytes, r.Skipped)
	}
	if got := execOK(t, src, digest); got != want {
		t.Errorf("the values changed by the remap: %s, were %s", got, want)
	}
	if got := execOK(t, src, "print(where(big.ctypes.data + 1000 * 8 + 4096), where(df[0].values.ctypes.data + 4096), float(big[999]), float(big[1000]))"); got != "rw-p /memfd:sandloop-remap-1 rw-p /memfd:sandloop-remap-1 -1.0 1000.0" {
		t.Errorf("after the remap: %s", got)
	}
	if got := execOK(t, src, "print(where(big.ctypes.data + 4096))"); strings.Contains(got, "memfd") {
		t.Errorf("big's page written after the export was remapped: %s", got)
	}
	if strings.TrimSpace(sharedAt) == "True" {
		if got := execOK(t, src, "print(where(addr + 4096))"); !strings.HasPrefix(got, "rw-s") {
			t.Errorf("the shared mapping at a remap range's address: %s, want it left shared", got)
		}
	} else {
		t.Log("the shared mapping did not take the freed buffer's address: that case is not checked")
	}

	// The next export: by pages (big's written page compared), and by bytes.
	b1 := []StateBase{{Serial: 1, File: f1}}
	f2, m2 := export("sandloop-remap-2", b1)
	if m2.MappedBytes < 4<<20 {
		t.Errorf("the export after the remap proved %d bytes equal by pages, %d by comparing: want df's 4 MiB by pages", m2.MappedBytes, m2.ComparedBytes)
	}
	ExportByBytes.Store(true)
	_, m3 := export("sandloop-remap-3", b1)
	ExportByBytes.Store(false)
	if m3.MappedBytes != 0 || m3.ComparedBytes < 4<<20 {
		t.Errorf("ExportByBytes after the remap: %d by pages, %d compared", m3.MappedBytes, m3.ComparedBytes)
	}
	dst := startJailed(t, jail.Limits{Memory: 1 << 30})
	if _, err := dst.ImportStateFiles(ctx, f2, b1); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, dst, digest); got != want {
		t.Errorf("a kernel loading the export after the remap: %s, want %s", got, want)
	}
}
