package workspace

import (
	"io"
	"io/fs"
	"os"
	"syscall"
	"unsafe"
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

// setMtime sets f's modification time (and its access time) to mtime, in
// nanoseconds: futimens(2), utimensat on the descriptor itself.
func setMtime(f *os.File, mtime int64) error {
	ts := [2]syscall.Timespec{syscall.NsecToTimespec(mtime), syscall.NsecToTimespec(mtime)}
	_, _, errno := syscall.Syscall6(syscall.SYS_UTIMENSAT, f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return &os.PathError{Op: "futimens", Path: f.Name(), Err: errno}
	}
	return nil
}
