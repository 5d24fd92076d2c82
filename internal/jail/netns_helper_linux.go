package jail

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reaching a port when the server is not root. A rootless jail has a user
// namespace of its own, created by the server, so the server's uid owns
// it and may join it, and with it enter the jail's network namespace. But
// the kernel lets only a single-threaded process join a user namespace,
// and a Go program never is one: a small helper process does it for one
// socket. It joins the jail's user and network namespaces through the
// jail process's pidfd (so a recycled PID cannot redirect it), connects to
// 127.0.0.1:PORT there, hands the connected socket back over a socketpair
// (SCM_RIGHTS) and exits. The socket stays in the jail's namespace; the
// helper never sees the jail's files, processes or PID namespace.
// Debian's python3 is the helper (it is what every sandbox runs anyway),
// isolated from the environment (-I -S) and given nothing but the two
// descriptors.

// helperPython is the helper's interpreter.
var helperPython = "/usr/bin/python3"

// helperScript joins the namespaces of the pidfd on fd 4 and connects to
// the port argv[1]; it answers on fd 3: "ok" with the socket, or
// "setns ERRNO" / "connect ERRNO".
const helperScript = `import ctypes, os, socket, sys
ctl = socket.socket(fileno=3)
libc = ctypes.CDLL(None, use_errno=True)
if libc.setns(4, 0x10000000 | 0x40000000) != 0:
    ctl.send(b"setns %d" % ctypes.get_errno())
    sys.exit(1)
os.close(4)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    ctl.send(b"connect %d" % (e.errno or 110))
    sys.exit(1)
socket.send_fds(ctl, [b"ok"], [s.fileno()])
`

// dialViaHelper connects to port on the loopback of the jail whose
// process pidfd names, through a helper (see above).
func dialViaHelper(ctx context.Context, pidfd, port int) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("enter the sandbox's network: socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "helper-ctl"), os.NewFile(uintptr(fds[1]), "helper-ctl")
	defer ours.Close()
	pid, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		theirs.Close()
		return nil, fmt.Errorf("enter the sandbox's network: %w", err)
	}
	pf := os.NewFile(uintptr(pid), "pidfd")
	cmd := exec.CommandContext(ctx, helperPython, "-I", "-S", "-c", helperScript, strconv.Itoa(port))
	cmd.ExtraFiles = []*os.File{theirs, pf} // fds 3 and 4
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Start()
	theirs.Close()
	pf.Close()
	if err != nil {
		return nil, fmt.Errorf("enter the sandbox's network: start the helper: %w", err)
	}
	defer cmd.Wait()
	// The helper ends after its one answer (or dies without one, killed
	// when ctx ends: then the read sees the socket closed, as the last
	// reference to its end goes).
	buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4))
	n, oobn, err := recvmsg(ours, buf, oob)
	if err != nil {
		return nil, fmt.Errorf("enter the sandbox's network: the helper: %w", err)
	}
	msg := string(buf[:n])
	if msg != "ok" {
		what, num, _ := strings.Cut(msg, " ")
		e, _ := strconv.Atoi(num)
		switch {
		case what == "connect" && e != 0:
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}, Err: os.NewSyscallError("connect", syscall.Errno(e))}
		case what == "setns" && syscall.Errno(e) == unix.EPERM:
			return nil, fmt.Errorf("enter the sandbox's network: %w", ErrPortsNeedRoot)
		}
		return nil, fmt.Errorf("enter the sandbox's network: the helper answered %q", msg)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, errors.New("enter the sandbox's network: the helper sent no socket")
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		for _, fd := range got {
			unix.Close(fd)
		}
		return nil, errors.New("enter the sandbox's network: the helper sent no socket")
	}
	f := os.NewFile(uintptr(got[0]), "sandbox-port")
	defer f.Close()
	return net.FileConn(f)
}

// recvmsg reads one message and its control data from f.
func recvmsg(f *os.File, buf, oob []byte) (n, oobn int, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		// Close-on-exec from the start: a child this server forks and
		// executes meanwhile (a jail's init) must not keep the socket.
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err == nil && n == 0 {
		err = errors.New("it exited without an answer")
	}
	return n, oobn, err
}
