package session

import (
	"errors"
	"fmt"
	"sync"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/workspace"
)

// How a fork gives its children the parent's files (ManagerOptions.ForkFiles,
// Restored.FilesBy).
const (
	// ForkFilesOverlay: one read-only copy of the parent's files per fork
	// (or the last one, if the files have not changed since), shared by
	// the children as the lower layer of an overlayfs workspace each.
	// Where it cannot run (not root), forks copy.
	ForkFilesOverlay = "overlay"
	// ForkFilesCopy: every child gets its own copy of the files.
	ForkFilesCopy = "copy"
)

// ForkFilesSupport says how forks give their children the parent's files
// on this host, and why not shared where they cannot be (for doctor).
func ForkFilesSupport() (how, why string) {
	if r := jail.OverlayUnsupported(); r != "" {
		return ForkFilesCopy, r
	}
	return ForkFilesOverlay, ""
}

// frozenFiles is a fork's read-only copy of its parent's files: the lower
// layer of its children's overlay workspaces. It is removed once its last
// holder (the fork while it runs, each child while it lives) lets go; the
// kernel frees its pages once the last overlay over it is unmounted.
type frozenFiles struct {
	dir  *jail.QuotaDir
	copy *workspace.TreeCopy // what it holds, nil if restored from a checkpoint (never reused)

	mu   sync.Mutex
	refs int // 0: removed
}

// acquire takes a hold on f; false if it is already removed.
func (f *frozenFiles) acquire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs == 0 {
		return false
	}
	f.refs++
	return true
}

// release lets go of a hold; the last one removes the copy.
func (f *frozenFiles) release() {
	f.mu.Lock()
	f.refs--
	last := f.refs == 0
	f.mu.Unlock()
	if last {
		f.dir.Remove()
	}
}

// newFrozenFiles makes an empty frozen directory sized like the session's
// workspace, and fills it with fill before freezing it.
func (s *Session) newFrozenFiles(fill func(*workspace.Workspace) error) (*frozenFiles, error) {
	q, err := jail.NewFrozenDir(s.quota.Disk, s.quota.Files)
	if err != nil {
		return nil, err
	}
	ws, err := OpenWorkspace(q.Path, workspace.Options{MaxFileBytes: s.quota.Disk + 1, MaxTotalBytes: s.quota.Disk + 1})
	if err == nil {
		err = fill(ws)
		ws.Close()
	}
	if err == nil {
		err = q.Freeze()
	}
	if err != nil {
		q.Remove()
		return nil, err
	}
	return &frozenFiles{dir: q, refs: 1}, nil
}

// freezeFiles returns a frozen copy of the workspace ws (the session's,
// under its turn): the session's last one if nothing changed since
// (no copy at all), else a plain copy (no hashing). The caller holds it.
func (s *Session) freezeFiles(ws *workspace.Workspace) (*frozenFiles, error) {
	s.frozenMu.Lock()
	last := s.lastFrozen
	s.frozenMu.Unlock()
	if last != nil && last.copy.Unchanged(ws) && last.acquire() {
		return last, nil
	}
	var tc *workspace.TreeCopy
	f, err := s.newFrozenFiles(func(dst *workspace.Workspace) (err error) {
		tc, err = workspace.CopyTree(dst, ws)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("session %s: freeze its files for a fork: %w", s.id, err)
	}
	f.copy = tc
	// Not a hold: the next fork reuses it only while a child keeps it.
	s.frozenMu.Lock()
	s.lastFrozen = f
	s.frozenMu.Unlock()
	return f, nil
}

// frozenFromCheckpoint builds a fork's frozen copy from a checkpoint of
// the session's store (outside the session's turn).
func (s *Session) frozenFromCheckpoint(st *workspace.CheckpointStore, id string) (*frozenFiles, error) {
	f, err := s.newFrozenFiles(func(dst *workspace.Workspace) error {
		_, err := st.Restore(dst, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("session %s: freeze a checkpoint's files for a fork: %w", s.id, err)
	}
	return f, nil
}

// mountFrozen makes the session's new workspace an overlay over f and
// takes a hold on f for the session's life (released by removeWorkspace).
func (s *Session) mountFrozen(f *frozenFiles) error {
	if s.quota == nil {
		return errors.New("a fork's child needs a workspace of its own")
	}
	if !f.acquire() {
		return errors.New("the fork's files were removed before its child started")
	}
	if err := s.quota.MountOverlay(f.dir.Path); err != nil {
		f.release()
		return err
	}
	s.frozen.Store(f)
	return nil
}

// releaseFrozen lets go of the session's hold on its fork's frozen files.
func (s *Session) releaseFrozen() {
	if f := s.frozen.Swap(nil); f != nil {
		f.release()
	}
}

// overlayUsage reports the bytes an overlay workspace holds of its own
// (its upper layer), for the files API's size cap.
func (s *Session) overlayUsage() (int64, error) {
	u, err := s.quota.Usage()
	return u.Bytes, err
}
