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

// TestExportOverMappedBuffers forks a kernel loaded from a state file
// again: its buffers, unwritten since the import, are proven equal to the
// file by their pages (MappedBytes), without a comparison; one element
// written, or a variable moved to other bytes of the same file, is never
// taken as unchanged (a kernel loading the next export sees the change);
// bytes rewritten equal are compared; ExportByBytes compares everything.
func TestExportOverMappedBuffers(t *testing.T) {
	src := startJailed(t, jail.Limits{Memory: 1 << 30})
	if !src.stateChannel {
		t.Skip("no state channel")
	}
	ctx := context.Background()
	export := func(k *Kernel, name string, bases []StateBase) (*os.File, *StateManifest, int64) {
		t.Helper()
		f, err := NewStateFile(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		e, err := k.StartExportOver(ctx, f, 0, false, bases)
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
	load := func(f *os.File, bases []StateBase) *Kernel {
		t.Helper()
		k := startJailed(t, jail.Limits{Memory: 1 << 30})
		if _, err := k.ImportStateFiles(ctx, f, bases); err != nil {
			t.Fatal(err)
		}
		return k
	}
	const mib = 1 << 20
	execOK(t, src, `import numpy as np, pandas as pd
df = pd.DataFrame({'a': np.arange(1 << 20, dtype='float64')})
arr = np.arange(1 << 18, dtype='float64')
big = np.arange(1 << 19, dtype='float64')
part = big[:1 << 18].copy()`)
	f1, _, _ := export(src, "mapped-1", nil)
	b1 := StateBase{Serial: 1, File: f1}
	child := load(f1, nil)

	// Nothing written since the import: every buffer by its pages.
	f2, m2, size2 := export(child, "mapped-2", []StateBase{b1})
	if m2.MappedBytes != 16*mib || m2.ComparedBytes != 0 || !slices.Equal(m2.Refs, []uint64{1}) || size2 > 64<<10 {
		t.Fatalf("export of an unwritten import: mapped %d, compared %d, refs %v, %d bytes; want all 16 MiB mapped", m2.MappedBytes, m2.ComparedBytes, m2.Refs, size2)
	}
	b2 := StateBase{Serial: 2, File: f2}
	ExportByBytes.Store(true)
	_, mb, _ := export(child, "mapped-bytes", []StateBase{b2, b1})
	ExportByBytes.Store(false)
	if mb.MappedBytes != 0 || mb.ComparedBytes != 16*mib {
		t.Errorf("ExportByBytes: mapped %d, compared %d; want all 16 MiB compared", mb.MappedBytes, mb.ComparedBytes)
	}

	// One element written; part moved to other bytes of the same file,
	// of its length (big's second half).
	execOK(t, child, "arr[1000] = -7.0\npart = big[1 << 18:]")
	f3, m3, size3 := export(child, "mapped-3", []StateBase{b2, b1})
	if m3.MappedBytes != 12*mib || m3.ComparedBytes != 0 || size3 < 4*mib || size3 > 5*mib {
		t.Errorf("export after a write: mapped %d, compared %d, %d bytes; want df and big mapped, arr and part copied", m3.MappedBytes, m3.ComparedBytes, size3)
	}
	b3 := StateBase{Serial: 3, File: f3}
	g := load(f3, []StateBase{b1, b2})
	if out, want := execOK(t, g, "print(arr[999], arr[1000], arr[1001], part[0], part[-1], df.a.sum(), big[-1])"), "999.0 -7.0 1001.0 262144.0 524287.0 549755289600.0 524287.0"; out != want {
		t.Errorf("a kernel loaded after the write: %s, want %s", out, want)
	}

	// The DataFrame's bytes rewritten equal: anonymous pages, compared.
	execOK(t, child, "v = df.a.values\nv[:] = v.copy()\ndel v")
	_, m4, _ := export(child, "mapped-4", []StateBase{b3, b1, b2})
	if m4.MappedBytes != 4*mib || m4.ComparedBytes != 12*mib {
		t.Errorf("export after an equal rewrite: mapped %d, compared %d; want big mapped, the rest compared", m4.MappedBytes, m4.ComparedBytes)
	}
}
