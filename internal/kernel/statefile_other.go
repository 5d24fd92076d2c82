//go:build !linux

package kernel

import "os"

// NewStateFile needs Linux (memfd).
func NewStateFile(string) (*os.File, error) { return nil, errNeedsLinux }

// SealStateFile needs Linux.
func SealStateFile(*os.File) error  { return errNeedsLinux }
func sealedStateFile(*os.File) bool { return false }
func isStateFile(*os.File) bool     { return false }
