//go:build !linux

package e2b

import (
	"errors"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/workspace"
)

// dirWatcher needs inotify: Linux only.
type dirWatcher struct{ done chan struct{} }

func watchDir(*workspace.Workspace, string, bool, int, func(fsEvent) bool) (*dirWatcher, error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watching directories needs Linux's inotify"))
}

func (w *dirWatcher) err() error { return nil }
func (w *dirWatcher) close()     {}
