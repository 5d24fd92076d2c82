package mcpserver

// TEMPORARY (issue 27): copies of session.Checkpoint and session.Restored
// (branch ck27) until it is merged; then these become aliases of them.

import "time"

type sessCheckpoint struct {
	ID             string
	Name           string
	Auto           bool
	CreatedAt      time.Time
	ExecutionCount int
	MemoryBytes    int64
	FileBytes      int64
	Files          int
	NotCarried     []string
}

type sessRestored struct {
	From           string
	Files          int
	Variables      []string
	NotRestored    []string
	ExecutionCount int
}
