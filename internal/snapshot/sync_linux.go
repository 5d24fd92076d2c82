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

// startWriteback starts writing f's dirty pages to the disk without
// waiting for them (sync_file_range(2), SYNC_FILE_RANGE_WRITE), so that
// the syncfs before a manifest finds most of a snapshot's blobs written
// already instead of writing them all then. Best effort: syncfs is what
// makes them durable.
func startWriteback(f *os.File) {
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}
