package kernel

import (
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A state file whose pages something else holds for a while (here a
// pipe they were spliced into, longer than the kernel's own ~150 ms wait
// for them) is still sealed once they are let go, not refused with EBUSY.
func TestSealWaitsForHeldPages(t *testing.T) {
	f, err := NewStateFile("held")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 64<<10)
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	off := int64(0)
	if n, err := unix.Splice(int(f.Fd()), &off, int(w.Fd()), nil, len(data), 0); err != nil || n != int64(len(data)) {
		t.Fatalf("splice: %d %v", n, err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != unix.EBUSY {
		t.Skipf("this kernel seals a file whose pages a pipe holds (%v): nothing to wait for", err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		io.ReadFull(r, make([]byte, len(data)))
	}()
	if err := SealStateFile(f); err != nil {
		t.Fatal(err)
	}
	if !sealedStateFile(f) {
		t.Error("the file is not sealed")
	}
}
