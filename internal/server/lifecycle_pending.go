package server

// TEMPORARY (issue 27): copies of the session types of branches ck27 and
// pause27, until they are merged; then these go and lifecycle.go uses
// session.Checkpoint, session.Restored and session.ForkOptions.

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

type checkpoint struct {
	ID             string    `json:"id"`
	Name           string    `json:"name,omitempty"`
	Auto           bool      `json:"auto"`
	CreatedAt      time.Time `json:"created_at"`
	ExecutionCount int       `json:"execution_count"`
	MemoryBytes    int64     `json:"memory_bytes"`
	FileBytes      int64     `json:"file_bytes"`
	Files          int       `json:"files"`
	NotCarried     []string  `json:"not_carried,omitempty"`
}

type restored struct {
	From           string   `json:"from"`
	Files          int      `json:"files"`
	Variables      []string `json:"variables,omitempty"`
	NotRestored    []string `json:"not_restored,omitempty"`
	ExecutionCount int      `json:"execution_count"`
}

type forkOptions struct {
	Count      int
	Checkpoint string
}

var errNotBuilt = &apiError{http.StatusNotImplemented, "not_implemented", "checkpoints, fork and pause are not built into this server yet", 0}

func setCheckpointMode(o *session.CreateOptions, mode string) error {
	if mode == "" {
		return nil
	}
	return errNotBuilt
}

func forkSessions(ctx context.Context, m *session.Manager, owner, id string, o forkOptions) ([]*session.Managed, *restored, error) {
	f, ok := any(m).(interface {
		Fork(context.Context, string, string, forkOptions) ([]*session.Managed, *restored, error)
	})
	if !ok {
		return nil, nil, errNotBuilt
	}
	return f.Fork(ctx, owner, id, o)
}

var _ = errors.New
