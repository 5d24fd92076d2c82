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
	dir    *jail.QuotaDir
	copy   *workspace.TreeCopy // what it holds, nil if restored from a checkpoint (never reused)
	frozen bool                // read-only (freeze)

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

// newFrozenFiles makes an empty directory for a frozen copy, sized like
// the session's workspace, opened for filling (the caller closes it and
// then calls freeze).
func (s *Session) newFrozenFiles() (*frozenFiles, *workspace.Workspace, error) {
	// A fork's child sees more than its own cap: the shared files too.
	disk, files := s.quota.Disk, s.quota.Files
	if f := s.frozen.Load(); f != nil {
		disk, files = disk+f.dir.Disk, files+f.dir.Files
	}
	q, err := jail.NewFrozenDir(disk, files)
	if err != nil {
		return nil, nil, err
	}
	ws, err := OpenWorkspace(q.Path, workspace.Options{MaxFileBytes: disk + 1, MaxTotalBytes: disk + 1})
	if err != nil {
		q.Remove()
		return nil, nil, err
	}
	return &frozenFiles{dir: q, refs: 1}, ws, nil
}

// freeze makes f read-only (once).
func (f *frozenFiles) freeze() error {
	if f.frozen {
		return nil
	}
	if err := f.dir.Freeze(); err != nil {
		return err
	}
	f.frozen = true
	return nil
}

// preFrozen is a frozen copy for the next fork made before its turn:
// the session's last one (if it looks unchanged), or a fresh copy of the
// workspace made while the session may still run (fill open on it).
type preFrozen struct {
	f     *frozenFiles
	fill  *workspace.Workspace // nil: the last fork's copy, or the session's own lower layer, reused
	lower bool                 // f is the session's own lower layer (a fork's child that wrote no file)
}

// preFreeze copies the session's files for a fork, outside its turn, so
// that the turn only brings the copy up to date (freezeFiles): a walk,
// and a copy of what changed meanwhile. A copy of the last fork whose
// files still look the same is reused instead (publishFrozen keeps it).
func (s *Session) preFreeze() (*preFrozen, error) {
	_, ws, err := s.checkpointFiles()
	if err != nil {
		return nil, err
	}
	if f := s.frozen.Load(); f != nil && f.copy != nil && s.filesUnwritten() && f.acquire() {
		// A fork's child that has written no file: its files are its
		// lower layer, as they are (not one restored from a checkpoint:
		// what it holds is not recorded).
		return &preFrozen{f: f, lower: true}, nil
	}
	s.frozenMu.Lock()
	last := s.lastFrozen
	s.frozenMu.Unlock()
	if last != nil && last.copy.Unchanged(ws) && last.acquire() {
		return &preFrozen{f: last}, nil
	}
	f, fill, err := s.newFrozenFiles()
	if err != nil {
		return nil, fmt.Errorf("session %s: copy its files for a fork: %w", s.id, err)
	}
	if f.copy, err = workspace.CopyTree(fill, ws); err != nil {
		fill.Close()
		f.release()
		return nil, fmt.Errorf("session %s: copy its files for a fork: %w", s.id, err)
	}
	return &preFrozen{f: f, fill: fill}, nil
}

// close lets go of a pre-frozen copy a fork did not take.
func (p *preFrozen) close() {
	if p.fill != nil {
		p.fill.Close()
	}
	p.f.release()
}

// freezeFiles returns the frozen copy of the session's workspace ws for
// a fork, under its turn, from pre (which it takes): the last fork's, if
// nothing changed since; else pre's copy brought up to date (what changed
// since it was made is copied again: no hashing). It is frozen by
// publishFrozen, after the turn.
func (s *Session) freezeFiles(ws *workspace.Workspace, pre *preFrozen) (*frozenFiles, error) {
	if pre.fill == nil {
		if pre.lower && s.filesUnwritten() || !pre.lower && pre.f.copy.Unchanged(ws) {
			return pre.f, nil
		}
		pre.f.release() // changed since preFreeze looked: copy here
		f, fill, err := s.newFrozenFiles()
		if err != nil {
			return nil, fmt.Errorf("session %s: copy its files for a fork: %w", s.id, err)
		}
		f.copy = &workspace.TreeCopy{}
		pre = &preFrozen{f: f, fill: fill}
	}
	_, err := pre.f.copy.Update(pre.fill, ws)
	pre.fill.Close()
	if err != nil {
		pre.f.release()
		return nil, fmt.Errorf("session %s: copy its files for a fork: %w", s.id, err)
	}
	return pre.f, nil
}

// publishFrozen freezes f (read-only from now on) and makes it the copy
// the session's next fork may reuse.
func (s *Session) publishFrozen(f *frozenFiles) error {
	if err := f.freeze(); err != nil {
		return fmt.Errorf("session %s: %w", s.id, err)
	}
	if f.copy != nil && f != s.frozen.Load() && f.acquire() {
		// Held while the session lives (or until its next fork's copy
		// replaces it), as its last export is (exportCache): the next
		// fork of unchanged files reuses it, even once every child of
		// this one is gone, rather than copying them again.
		s.frozenMu.Lock()
		old := s.lastFrozen
		s.lastFrozen = f
		s.frozenMu.Unlock()
		if old != nil {
			old.release()
		}
	}
	return nil
}

// dropLastFrozen lets go of the copy publishFrozen kept for the next fork.
func (s *Session) dropLastFrozen() {
	s.frozenMu.Lock()
	f := s.lastFrozen
	s.lastFrozen = nil
	s.frozenMu.Unlock()
	if f != nil {
		f.release()
	}
}

// frozenFromCheckpoint builds a fork's frozen copy from a checkpoint of
// the session's store (outside the session's turn).
func (s *Session) frozenFromCheckpoint(st *workspace.CheckpointStore, id string) (*frozenFiles, error) {
	f, fill, err := s.newFrozenFiles()
	if err != nil {
		return nil, fmt.Errorf("session %s: copy a checkpoint's files for a fork: %w", s.id, err)
	}
	_, err = st.Restore(fill, id)
	fill.Close()
	if err == nil {
		err = f.freeze()
	}
	if err != nil {
		f.release()
		return nil, fmt.Errorf("session %s: copy a checkpoint's files for a fork: %w", s.id, err)
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

// filesUnwritten reports whether the session is a fork's child whose
// overlay workspace holds nothing of its own (jail's OverlayUnwritten):
// its files are then exactly its lower layer, which its own forks share
// as they are instead of copying them.
func (s *Session) filesUnwritten() bool {
	if s.frozen.Load() == nil || s.quota == nil {
		return false
	}
	ok, err := s.quota.OverlayUnwritten()
	return err == nil && ok
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
