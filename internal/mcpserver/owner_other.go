//go:build !linux

package mcpserver

// sandboxHostID is nobody: there are no jails here to own files.
func sandboxHostID() int { return 65534 }
