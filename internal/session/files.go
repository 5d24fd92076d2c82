package session

import (
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
	return OpenWorkspace(s.workspace, opts)
}
