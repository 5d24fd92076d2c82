package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The state channel: a unix seqpacket socket, the kernel's fd 7, on which
// the host and the kernel pass each other one pipe per state stream, tagged
// with the request's tag. The bytes then go raw through the pipe.

// recvStream takes the pipe the kernel passed for the request tagged tag
// (it passes it before it replies). Pipes of other tags (abandoned
// exports) are closed.
func (p *pipes) recvStream(tag int64) (*os.File, error) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(p.state, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil, errors.New("the kernel passed no state stream")
		}
		if err != nil {
			return nil, fmt.Errorf("state channel: %w", err)
		}
		if n == 0 && oobn == 0 {
			return nil, errors.New("the kernel closed its state channel")
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		var msg struct {
			Tag int64 `json:"tag"`
		}
		if json.Unmarshal(buf[:n], &msg) != nil || msg.Tag != tag || len(fds) != 1 {
			closeFDs(fds)
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(fds[0], &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fds[0])
			return nil, errors.New("the kernel passed something else than a pipe for its state")
		}
		if err := unix.SetNonblock(fds[0], true); err != nil {
			unix.Close(fds[0])
			return nil, err
		}
		return os.NewFile(uintptr(fds[0]), "kernel-state-export"), nil
	}
}

// sendStream passes the kernel f (a pipe's read end) for the request
// tagged tag.
func (p *pipes) sendStream(tag int64, f *os.File) error {
	msg, _ := json.Marshal(map[string]int64{"tag": tag})
	for {
		err := unix.Sendmsg(p.state, msg, unix.UnixRights(int(f.Fd())), nil, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("state channel: %w", err)
		}
		return nil
	}
}

// sendFiles passes the kernel files for the request tagged tag, in one
// message: files[skip:] are state files, named by serials.
func (p *pipes) sendFiles(tag int64, files []*os.File, skip int, serials []uint64) error {
	if len(files) > maxStateFiles {
		return fmt.Errorf("%d state files at once: at most %d", len(files), maxStateFiles)
	}
	msg, _ := json.Marshal(map[string]any{"tag": tag, "serials": serials})
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	for {
		err := unix.Sendmsg(p.state, msg, unix.UnixRights(fds...), nil, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("state channel: %w", err)
		}
		return nil
	}
}

// newStatePipe makes a pipe for a state stream to a kernel: w ours
// (nonblocking, for the runtime's poller), r for the kernel.
func newStatePipe() (r, w *os.File, err error) {
	var fd [2]int
	if err := unix.Pipe2(fd[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	unix.FcntlInt(uintptr(fd[1]), unix.F_SETPIPE_SZ, statePipeSize) // best effort
	if err := unix.SetNonblock(fd[1], true); err != nil {
		unix.Close(fd[0])
		unix.Close(fd[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd[0]), "kernel-state-import"), os.NewFile(uintptr(fd[1]), "kernel-state-import"), nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// NewStateFile makes an anonymous file in memory (a memfd) to hold an
// exported state: written once (ExportState or StartExport into it), then
// sealed (SealStateFile) and imported by any number of kernels
// (ImportStateFile), which map it instead of reading it.
func NewStateFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("state file: memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// stateSeals make a state file unchangeable for good: no write, no resize,
// and the seals themselves cannot be removed.
const stateSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// SealStateFile forbids every change to f, a NewStateFile, from now on,
// through any descriptor or mapping: a kernel given it can map it
// copy-on-write but never change what other kernels map.
//
// A write seal waits for references to the file's pages that are not
// mappings (a pipe's, a page being migrated) to go; the kernel gives up
// after ~150 ms with EBUSY. A fork's export was refused so once, under
// CPU stress, its holder not identified: EBUSY is tried again, for up to
// sealPatience.
func SealStateFile(f *os.File) error {
	deadline := time.Now().Add(sealPatience)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		_, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, stateSeals)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("seal the state file: %w", err)
		}
		time.Sleep(wait)
	}
}

// sealPatience is how long SealStateFile tries again while the file's
// pages are held.
const sealPatience = 5 * time.Second

// sealedStateFile reports whether f is a sealed NewStateFile, which a
// kernel may be given to map.
func sealedStateFile(f *os.File) bool {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	return err == nil && seals&stateSeals == stateSeals
}

// isStateFile reports whether f is a NewStateFile (a memfd that takes
// seals, sealed or not; a tmpfs file passes too), not opened to append.
func isStateFile(f *os.File) bool {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil {
		return false
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	return err == nil && fl&unix.O_APPEND == 0
}
