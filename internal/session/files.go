package session

import (
	"errors"
	"os"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/workspace"
)

// OpenWorkspace opens dir for the server's own file access, with opts'
// size caps. When the server is root, what it writes is given to the
// sandbox user's host id so code in the sandbox can change it.
func OpenWorkspace(dir string, opts workspace.Options) (*workspace.Workspace, error) {
	if os.Geteuid() == 0 {
		opts.OwnerSet, opts.UID, opts.GID = true, jail.HostID, jail.HostID
	}
	return workspace.Open(dir, &opts)
}

// Files opens the session's workspace (see OpenWorkspace). Writes are
// capped at the workspace's quota too (Quota), when opts allow more.
func (s *Session) Files(opts workspace.Options) (*workspace.Workspace, error) {
	q := s.Quota()
	if opts.MaxTotalBytes == 0 || opts.MaxTotalBytes > q.Disk {
		opts.MaxTotalBytes = q.Disk
	}
	if s.quota != nil && s.quota.Overlay() && opts.Usage == nil {
		// A fork's child: its own bytes are its upper layer's, not the
		// shared files under it.
		opts.Usage = s.overlayUsage
	}
	return OpenWorkspace(s.workspace, opts)
}

// TmpFiles opens the sandbox's /tmp (the kernel's, which its commands
// share) for the server's file access, with opts' size caps (at most the
// size of /tmp). It is reached through the kernel's jail: never a host
// directory, and no link inside leads out of it (os.Root).
func (s *Session) TmpFiles(opts workspace.Options) (*workspace.Workspace, error) {
	s.mu.Lock()
	p, closed := s.proc, s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	j, ok := p.(joinable)
	if !ok {
		return nil, ErrTmpUnreachable
	}
	t, err := j.JoinTarget()
	if err != nil {
		return nil, ErrClosed
	}
	defer t.Close()
	if max := t.Limits().TmpSize; opts.MaxTotalBytes == 0 || opts.MaxTotalBytes > max {
		opts.MaxTotalBytes = max
	}
	opts.CreateAsOwner = true // a tmpfs of the jail's user namespace
	ws, err := OpenWorkspace(t.Path("/tmp"), opts)
	if err != nil {
		return nil, err
	}
	if !t.Alive() { // the PID was recycled before the open
		ws.Close()
		return nil, ErrClosed
	}
	return ws, nil
}

// ErrTmpUnreachable means the session's kernel was started in a way whose
// /tmp the host cannot reach (a launcher of the caller's).
var ErrTmpUnreachable = errors.New("this session's /tmp cannot be reached from the server")

// TmpFiles is Session.TmpFiles, resuming a paused session first.
func (m *Managed) TmpFiles(opts workspace.Options) (*workspace.Workspace, error) {
	if err := m.Resume(); err != nil {
		return nil, err
	}
	return m.Session.TmpFiles(opts)
}
