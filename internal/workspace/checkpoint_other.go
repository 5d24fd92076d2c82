//go:build !linux

package workspace

import (
	"io"
	"io/fs"
	"os"
	"time"
)

// idOf is the identity of the file fi describes. Without an inode number
// and a ctime it never proves a file unchanged (ino 0): every Take and
// Restore reads the files.
func idOf(fi fs.FileInfo) fileID {
	return fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}
}

// copyBlob copies src (a blob, from its start) to dst.
func copyBlob(dst, src *os.File) error {
	_, err := io.Copy(dst, src)
	return err
}

// setMtime sets f's modification time (and its access time) to mtime, in
// nanoseconds.
func setMtime(f *os.File, mtime int64) error {
	t := time.Unix(0, mtime)
	return os.Chtimes(f.Name(), t, t)
}
