package workspace

import (
	"errors"
	"os"
	"syscall"
)

// ErrNotDir: the path is not a directory (a symlink to one neither).
var ErrNotDir = errors.New("not a directory")

// OpenDir opens directory p for reading (to list or watch it). p is
// resolved inside the workspace and its last component is never a
// symlink: the handle is a directory of the workspace, whatever sandboxed
// code plants meanwhile.
func (w *Workspace) OpenDir(p string) (*os.File, error) {
	rel, err := Clean(p)
	if err != nil {
		return nil, err
	}
	// (os.Root follows a final symlink, inside the workspace: it is
	// refused here, and the handle checked to be what was looked at.)
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return nil, mapErr(p, err)
	}
	if !fi.IsDir() {
		return nil, &PathError{p, ErrNotDir}
	}
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, mapErr(p, err)
	}
	if got, err := f.Stat(); err != nil || !os.SameFile(fi, got) {
		f.Close()
		return nil, &PathError{p, errors.New("changed while it was opened")}
	}
	return f, nil
}
