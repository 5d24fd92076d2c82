package zygote

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// readReport reads one message from a child, failing on {"error": ...}.
func readReport(c *net.UnixConn) ([]byte, int, error) {
	msg, pid, fds, err := readReportFDs(c)
	closeAll(fds)
	return msg, pid, err
}

// readReportFDs is readReport, keeping the descriptors that came with the
// message (the caller closes them).
func readReportFDs(c *net.UnixConn) ([]byte, int, []int, error) {
	msg, pid, fds, err := readMsgFDs(c)
	fail := func(err error) ([]byte, int, []int, error) {
		closeAll(fds)
		return nil, 0, nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("the child ended before it started the kernel: %w", err))
	}
	var r struct{ Error string }
	if json.Unmarshal(msg, &r) == nil && r.Error != "" {
		return fail(fmt.Errorf("build the session's jail: %s", r.Error))
	}
	if pid <= 0 {
		return fail(errors.New("no credentials on the report socket"))
	}
	return msg, pid, fds, nil
}

// readMsg reads one message and the sender's host PID (SO_PASSCRED),
// closing any descriptor that came with it.
func readMsg(c *net.UnixConn) ([]byte, int, error) {
	msg, pid, fds, err := readMsgFDs(c)
	closeAll(fds)
	return msg, pid, err
}

// readMsgFDs reads one message, the sender's host PID (SO_PASSCRED) and the
// descriptors it carries (close-on-exec).
func readMsgFDs(c *net.UnixConn) (msg []byte, pid int, fds []int, err error) {
	bp := msgBufs.Get().(*[64 << 10]byte)
	defer msgBufs.Put(bp)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(bp[:], oob)
	if err != nil {
		return nil, 0, nil, err
	}
	buf := bytes.Clone(bp[:n])
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for i := range msgs {
			if uc, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
				pid = int(uc.Pid)
			} else if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	if n == 0 {
		err = io.EOF
	}
	return buf, pid, fds, err
}

// msgBufs are read buffers for readMsgFDs: a message may be up to 64 KiB
// (a SOCK_SEQPACKET message arrives whole or truncated), but most are a
// few bytes, and a session's ~7 reads each allocated and zeroed 64 KiB
// (issue 26's profile: allocation and GC work per session).
var msgBufs = sync.Pool{New: func() any { return new([64 << 10]byte) }}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// seqpacketPair returns a connected pair: ours (with SO_PASSCRED, so every
// message carries its sender's PID) and theirs, to hand over.
func seqpacketPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	ours := os.NewFile(uintptr(fds[0]), "zygote-host")
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "zygote-child"), nil
}
