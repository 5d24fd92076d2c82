package kernel

import (
	"errors"
	"os"
)

// Gone returns a kernel that has already ended, for reason: what a
// session holds while it has no kernel (one brought back from storage,
// whose kernel starts at its first use). Its Err says reason; Kill and
// Close do nothing; every request fails as on a dead kernel.
func Gone(reason string) *Kernel {
	k := newKernel(nil, 0)
	k.proc = goneProcess{}
	k.p = closedPipes()
	k.killReason = reason
	k.retired.Store(true)
	close(k.exited)
	return k
}

// goneProcess is the process of a Gone kernel.
type goneProcess struct{}

func (goneProcess) Signal(os.Signal) error { return errors.New("the kernel is gone") }
func (goneProcess) Kill() error            { return nil }
func (goneProcess) Wait() error            { return nil }
