package session

import (
	"context"
	"errors"
	"io"

	"github.com/sandloop/sandloop/internal/kernel"
)

// kernelCheckpoints is what checkpoints and forks need of a kernel: the
// checkpoint API of package kernel (issue 27).
type kernelCheckpoints interface {
	Checkpoint(ctx context.Context) (*kernelCheckpointInfo, error)
	Restore(ctx context.Context, id int) (*kernelCheckpointInfo, error)
	DropCheckpoint(ctx context.Context, id int) error
	CheckpointMemory(ctx context.Context) (map[int]int64, error)
	ExportState(ctx context.Context, w io.Writer, fromCheckpoint int) (*stateManifest, error)
	ImportState(ctx context.Context, r io.Reader) (*stateManifest, error)
}

// The kernel's types, as its checkpoint API defines them.
type (
	kernelCheckpointInfo struct {
		ID             int
		ExecutionCount int
		Threads        []string
		Processes      []string
	}
	stateManifest struct {
		Serializer     string
		Variables      []string
		NotSaved       []notSaved
		ExecutionCount int
	}
	notSaved struct{ Name, Reason string }
)

// errCheckpointGone: the kernel's copy of a checkpoint died (the OOM killer).
var errCheckpointGone = errors.New("checkpoint gone")

// checkpointsOf returns k's checkpoint API, or nil where the kernel has none.
func checkpointsOf(k *kernel.Kernel) kernelCheckpoints {
	c, _ := any(k).(kernelCheckpoints)
	return c
}
