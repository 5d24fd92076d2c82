package session

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/sandloop/sandloop/internal/kernel"
)

// kernelCheckpoints is what checkpoints and forks need of a kernel: the
// checkpoint API of package kernel (issue 27).
type kernelCheckpoints interface {
	Checkpoint(ctx context.Context) (*kernelCheckpointInfo, error)
	Restore(ctx context.Context, id int) (*kernelCheckpointInfo, error)
	RestoreAndDrop(ctx context.Context, id int) (*kernelCheckpointInfo, error)
	DropCheckpoint(ctx context.Context, id int) error
	CheckpointMemory(ctx context.Context) (map[int]int64, error)
	ExportState(ctx context.Context, w io.Writer, fromCheckpoint int) (*stateManifest, error)
	StartExport(ctx context.Context, w io.Writer, fromCheckpoint int, describe bool) (*kernel.Export, error)
	StartExportOver(ctx context.Context, w io.Writer, fromCheckpoint int, describe bool, bases []kernel.StateBase) (*kernel.Export, error)
	ImportState(ctx context.Context, r io.Reader) (*stateManifest, error)
	ImportStateFile(ctx context.Context, f *os.File) (*stateManifest, error)
	ImportStateFiles(ctx context.Context, f *os.File, bases []kernel.StateBase) (*stateManifest, error)
}

// The kernel's types.
type (
	kernelCheckpointInfo = kernel.CheckpointInfo
	stateManifest        = kernel.StateManifest
	notSaved             = kernel.NotSaved
)

// errCheckpointGone: the kernel's copy of a checkpoint died (the OOM killer).
var errCheckpointGone = kernel.ErrCheckpointGone

// lostCheckpoint is a checkpoint whose copy was never made (kernel.LostError).
type lostCheckpoint = kernel.LostError

// checkpointsOf returns k's checkpoint API.
func checkpointsOf(k *kernel.Kernel) kernelCheckpoints { return k }

// liveCheckpoints is the checkpoint side of the session's kernel, which
// must be alive (ErrRestartRequired if it died).
func (s *Session) liveCheckpoints() (kernelCheckpoints, error) {
	k, err := s.kernel()
	if err != nil {
		return nil, err
	}
	if err := k.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	return checkpointsOf(k), nil
}
