package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/sandloop/sandloop/internal/workspace"
)

// WorkspaceSource takes snapshots of a workspace: every access goes
// through its os.Root, so a symlink planted by sandboxed code is stored as
// a link and never followed out of the workspace. (A *workspace.Workspace
// is a Dest as it is.)
func WorkspaceSource(w *workspace.Workspace) Source { return wsSource{w} }

type wsSource struct{ w *workspace.Workspace }

func (s wsSource) Walk(ctx context.Context, fn func(Entry) error) error {
	return s.w.WalkTree(func(e workspace.Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fn(Entry{Path: e.Path, Type: e.Type, Mode: e.FileMode, Size: e.Size, ModTime: e.ModTime})
	})
}

func (s wsSource) Open(p string) (io.ReadCloser, error) {
	f, _, err := s.w.Open(p)
	if err != nil {
		return nil, vanished(err)
	}
	return f, nil
}

func (s wsSource) Readlink(p string) (string, error) {
	t, err := s.w.Readlink(p)
	return t, vanished(err)
}

// vanished: removed or replaced by something else since the walk saw it.
func vanished(err error) error {
	if errors.Is(err, workspace.ErrNotFound) || errors.Is(err, workspace.ErrNotRegular) {
		return fmt.Errorf("%w: %v", fs.ErrNotExist, err)
	}
	return err
}

var _ Dest = (*workspace.Workspace)(nil)
