package snapshot

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS flushes the file system holding dir (syncfs(2)): one call for
// every blob of a snapshot.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
