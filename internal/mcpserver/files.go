package mcpserver

import (
	"os"

	"github.com/sandloop/sandloop/internal/workspace"
)

// filesSession is a Session that opens its own workspace (a server's
// managed session: opening it wakes a paused or hibernated session, and
// each change through it counts as a use, for the automatic snapshots).
type filesSession interface {
	Files(opts workspace.Options) (*workspace.Workspace, error)
}

// workspace opens the session's workspace. Writes as root give the files
// to the sandbox user, so code in the sandbox can change them.
func (s *Server) workspace(sess Session) (*workspace.Workspace, error) {
	opts := workspace.Options{MaxFileBytes: s.opts.MaxFileBytes, MaxTotalBytes: s.opts.MaxWorkspaceBytes}
	if os.Geteuid() == 0 {
		opts.OwnerSet = true
		opts.UID, opts.GID = sandboxHostID(), sandboxHostID()
	}
	if fs, ok := sess.(filesSession); ok {
		return fs.Files(opts)
	}
	return workspace.Open(sess.Workspace(), &opts)
}
