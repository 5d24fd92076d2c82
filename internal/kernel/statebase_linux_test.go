package kernel

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
)

// TestExportOverBases exports twice, the second time given the first
// export: the unchanged DataFrame is referred to, not copied, the changed
// array is copied; a kernel given both files loads the right values, with
// the DataFrame over the first file's pages, and one not given the first
// file says what is missing. A third export, given the second and the
// first, still refers to the first (a chain does not grow).
func TestExportOverBases(t *testing.T) {
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	if !src.stateChannel {
		t.Skip("no state channel")
	}
	ctx := context.Background()
	execOK(t, src, `import numpy as np, pandas as pd
df = pd.DataFrame({'a': np.arange(1 << 20, dtype='float64')})
arr = np.arange(1 << 18, dtype='float64')`)
	export := func(name string, bases []StateBase) (*os.File, *StateManifest, int64) {
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
		fi, _ := f.Stat()
		return f, m, fi.Size()
	}
	a, ma, sizeA := export("test-a", nil)
	if len(ma.Refs) != 0 || sizeA < 8<<20 {
		t.Fatalf("first export: refs %v, %d bytes", ma.Refs, sizeA)
	}
	execOK(t, src, "arr[0] = -1")
	b, mb, sizeB := export("test-b", []StateBase{{Serial: 41, File: a}})
	if !slices.Equal(mb.Refs, []uint64{41}) || sizeB > 3<<20 || sizeB < 2<<20 {
		t.Fatalf("second export: refs %v, %d bytes (the first %d): want the DataFrame referred to, the array copied", mb.Refs, sizeB, sizeA)
	}
	const check = `def where(a):
    for line in open('/proc/self/maps'):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if lo <= a.ctypes.data < hi:
            return f[5] if len(f) > 5 else 'anon'
print(df.a.sum(), arr[0], arr[5], where(df.a.values), where(arr))`
	dst := startJailed(t, jail.Limits{Memory: 1 << 30})
	if _, err := dst.ImportStateFiles(ctx, b, []StateBase{{Serial: 41, File: a}}); err != nil {
		t.Fatal(err)
	}
	if out, want := execOK(t, dst, check), "549755289600.0 -1.0 5.0 /memfd:test-a /memfd:test-b"; !strings.HasPrefix(out, want) {
		t.Errorf("import over the first export: %s, want %s", out, want)
	}
	// A write in the importer stays its own (MAP_PRIVATE over a sealed file).
	execOK(t, dst, "df.a.values[:] = 0")
	other := startJailed(t, jail.Limits{Memory: 1 << 30})
	if _, err := other.ImportStateFiles(ctx, b, []StateBase{{Serial: 41, File: a}}); err != nil {
		t.Fatal(err)
	}
	if out := execOK(t, other, "print(df.a.sum())"); out != "549755289600.0" {
		t.Errorf("another importer after a write by the first: %s", out)
	}
	bad := startJailed(t, jail.Limits{Memory: 1 << 30})
	if _, err := bad.ImportStateFile(ctx, b); err == nil || !strings.Contains(err.Error(), "did not pass") {
		t.Errorf("import without the file it refers to: %v", err)
	}
	_, mc, sizeC := export("test-c", []StateBase{{Serial: 42, File: b}, {Serial: 41, File: a}})
	if !slices.Equal(mc.Refs, []uint64{41, 42}) || sizeC > 64<<10 {
		t.Errorf("third export: refs %v, %d bytes: want the DataFrame in the first file, the array in the second", mc.Refs, sizeC)
	}
}
