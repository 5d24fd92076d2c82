//go:build !linux

package workspace

import (
	"io"
	"io/fs"
	"os"
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
