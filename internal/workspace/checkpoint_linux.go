package workspace

import (
	"io"
	"io/fs"
	"os"
	"syscall"
)

// idOf is the identity of the file fi describes.
func idOf(fi fs.FileInfo) fileID {
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = st.Dev, st.Ino
		id.ctime = st.Ctim.Sec*1e9 + st.Ctim.Nsec
	}
	return id
}

// copyBlob copies src (a blob, from its start) to dst. Blobs and
// workspaces are on different filesystems (copy_file_range refuses that,
// and io.Copy would then move every byte through this process):
// sendfile(2) copies page to page in the kernel.
func copyBlob(dst, src *os.File) error {
	for {
		n, err := syscall.Sendfile(int(dst.Fd()), int(src.Fd()), nil, 1<<30)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		}
		if err == syscall.EINVAL || err == syscall.ENOSYS {
			_, err = io.Copy(dst, src) // from where sendfile left off
			return err
		}
		if err != nil || n == 0 {
			return err
		}
	}
}
