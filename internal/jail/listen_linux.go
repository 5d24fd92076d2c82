package jail

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// handOffListener (in the init, in the jail's network namespace) opens a
// TCP listener on 127.0.0.1:port and sends it to the host over the Unix
// socket fd, then closes both: the jail keeps no handle on it, and the
// only thing of the host inside is what answers on that port.
func handOffListener(port, fd int) error {
	defer unix.Close(fd)
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err := unix.Bind(s, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("bind 127.0.0.1:%d: %w", port, err)
	}
	if err := unix.Listen(s, 512); err != nil {
		return err
	}
	return unix.Sendmsg(fd, []byte("listener"), unix.UnixRights(s), nil, 0)
}

// handOffPair returns a connected pair of Unix sockets: ours, and theirs
// for the init.
func handOffPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("hand-off socket: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "listener-hand-off")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "listener-hand-off"), nil
}

// receiveListener reads the listener the init sent.
func receiveListener(c *net.UnixConn) (net.Listener, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	return ListenerFromMessage(oob[:oobn])
}

// ListenerFromMessage makes a net.Listener of the one descriptor carried
// by a Unix socket message's control data (SCM_RIGHTS), closing any other.
func ListenerFromMessage(oob []byte) (net.Listener, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, r...)
		}
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("no listener came with the message")
	}
	return FileListener(fds[0])
}

// FileListener makes a net.Listener of a listening TCP socket descriptor
// (taking it over), after checking it is one.
func FileListener(fd int) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), "jail-listener")
	defer f.Close()
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err == nil && typ != unix.SOCK_STREAM {
		err = errors.New("not a stream socket")
	}
	if err == nil {
		var acc int
		if acc, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && acc != 1 {
			err = errors.New("not listening")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	return net.FileListener(f)
}
