package mcpserver

import "github.com/sandloop/sandloop/internal/jail"

// sandboxHostID is the host uid and gid of the sandbox user when the
// server runs as root.
func sandboxHostID() int { return jail.HostID }
