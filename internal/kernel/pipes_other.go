//go:build !linux

package kernel

import (
	"errors"
	"os"
	"time"
)

// The kernel's pipes use epoll-style polling and an eventfd: Linux only.
// Elsewhere the package builds (for go vet) and Start fails.

var errNeedsLinux = errors.New("kernel: sandboxed kernels need Linux")

type pipes struct {
	eof     [3]bool
	lenient bool
}

func newPipes(int, string) (*pipes, Files, error)       { return nil, Files{}, errNeedsLinux }
func (p *pipes) close()                                 {}
func (p *pipes) wake()                                  {}
func (p *pipes) allEOF() bool                           { return true }
func (p *pipes) drainOutput(sink)                       {}
func (p *pipes) writeRequest([]byte, time.Time) error   { return errNeedsLinux }
func (p *pipes) step(time.Duration, sink) (bool, error) { return false, errNeedsLinux }
func (p *pipes) writeRequestListening([]byte, time.Time, sink) (bool, error) {
	return false, errNeedsLinux
}

func (p *pipes) recvStream(int64) (*os.File, error) { return nil, errNeedsLinux }
func (p *pipes) sendStream(int64, *os.File) error   { return errNeedsLinux }
func (p *pipes) sendFiles(int64, []*os.File, int, []uint64) error {
	return errNeedsLinux
}
func newStatePipe() (r, w *os.File, err error) { return nil, nil, errNeedsLinux }

func (p *pipes) handoff() ([]*os.File, string, error)     { return nil, "", errNeedsLinux }
func attachPipes([]*os.File, int, string) (*pipes, error) { return nil, errNeedsLinux }

func closedPipes() *pipes { return &pipes{} }
