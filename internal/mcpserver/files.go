package mcpserver

import (
	"os"

	"github.com/sandloop/sandloop/internal/workspace"
)

// workspace opens the session's workspace. Writes as root give the files
// to the sandbox user, so code in the sandbox can change them.
func (s *Server) workspace(sess Session) (*workspace.Workspace, error) {
	opts := workspace.Options{MaxFileBytes: s.opts.MaxFileBytes, MaxTotalBytes: s.opts.MaxWorkspaceBytes}
	if os.Geteuid() == 0 {
		opts.OwnerSet = true
		opts.UID, opts.GID = sandboxHostID(), sandboxHostID()
	}
	return workspace.Open(sess.Workspace(), &opts)
}
