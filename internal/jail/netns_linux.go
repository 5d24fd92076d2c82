package jail

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Reaching a server inside a jail from the host. A jail's network
// namespace has only loopback, so nothing outside can route to it. The host
// reaches it the way `nsenter --net` would, but for one socket only: a
// thread of ours enters the namespace of a process of the jail (named by a
// pidfd, so a recycled PID can never redirect it), creates the socket
// there, and goes back; a socket stays in the namespace it was made in, so
// the connection is to the jail's own loopback and nowhere else. Entering
// a network namespace needs CAP_SYS_ADMIN over it and over our own (root);
// an unprivileged server gets ErrPortsNeedRoot.

// ErrPortsNeedRoot means the server cannot enter its jails' network
// namespaces (it is not root), so their ports cannot be reached.
var ErrPortsNeedRoot = errors.New("reaching a port inside a sandbox needs a server running as root")

// ErrNoOwnNetwork means the jail shares the host's network: its ports are
// the host's, which a sandbox's port route never reaches.
var ErrNoOwnNetwork = errors.New("the sandbox shares the host's network, so it has no ports of its own")

// DialLoopback connects to port on the loopback of the network namespace
// of the process pidfd refers to.
func DialLoopback(ctx context.Context, pidfd int, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, &ArgumentError{"port", fmt.Errorf("%d: must be 1-65535", port)}
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread stays locked (and so ends with this goroutine) unless
		// it is back in our own namespace.
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{nil, fmt.Errorf("open own network namespace: %w", err)}
			return
		}
		defer self.Close()
		if err := unix.Setns(pidfd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			if errors.Is(err, unix.EPERM) {
				// Not root: a helper joins the jail's user namespace
				// first, which gives it the right to enter the network.
				c, herr := dialViaHelper(ctx, pidfd, port)
				ch <- result{c, herr}
				return
			}
			ch <- result{nil, fmt.Errorf("enter the sandbox's network: %w", err)}
			return
		}
		// The socket is made on this thread, inside the jail's namespace;
		// connecting may then wait in the poller like any other.
		var d net.Dialer
		c, derr := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if c != nil {
				c.Close()
			}
			ch <- result{nil, fmt.Errorf("leave the sandbox's network: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, derr}
	}()
	r := <-ch
	return r.c, r.err
}

// ListeningPorts returns the TCP ports listening on the loopback (or on
// every address) of the network namespace of the process pid, sorted. The
// caller checks that pid is still the process it means.
func ListeningPorts(pid int) ([]int, error) {
	var ports []int
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, name))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && name == "tcp6" {
				continue // no IPv6 in this kernel
			}
			return nil, err
		}
		ports = append(ports, parseListening(bufio.NewScanner(f))...)
		f.Close()
	}
	slices.Sort(ports)
	return slices.Compact(ports), nil
}

// parseListening reads /proc/net/tcp lines: "sl local_address rem_address
// st ...", addresses in hex (IP:PORT), state 0A meaning LISTEN.
func parseListening(sc *bufio.Scanner) []int {
	var ports []int
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		ip, port, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil || !reachableListen(ip) {
			continue
		}
		ports = append(ports, int(p))
	}
	return ports
}

// reachableListen reports whether a listener on ip (hex, as /proc shows
// it) accepts connections to 127.0.0.1: the loopback address itself or
// every address (0.0.0.0, ::, or ::ffff:0.0.0.0 and ::ffff:127.x).
func reachableListen(ip string) bool {
	switch ip {
	case "00000000", "00000000000000000000000000000000", "0000000000000000FFFF000000000000":
		return true
	}
	if len(ip) == 8 { // IPv4 in host byte order: 0100007F is 127.0.0.1
		return strings.HasSuffix(ip, "7F")
	}
	// ::ffff:127.x.y.z
	return len(ip) == 32 && strings.HasPrefix(ip, "0000000000000000FFFF0000") && strings.HasSuffix(ip, "7F")
}

// netnsInode is the inode of pid's network namespace.
func netnsInode(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// pidfdIn opens a pidfd of pid and checks that the process it holds is in
// the network namespace netns. The check cannot be fooled by a recycled
// PID: while the pidfd's process lives its PID is not reused, so /proc/PID
// read after the pidfd was opened and before it is found still alive is
// that process.
func pidfdIn(pid int, netns uint64) (int, error) {
	if netns == 0 {
		return -1, errors.New("the sandbox's network namespace is unknown")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, os.ErrProcessDone
	}
	ino, err := netnsInode(pid)
	if err != nil || ino != netns || unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
		unix.Close(fd)
		return -1, os.ErrProcessDone
	}
	return fd, nil
}

// DialLoopback connects to port on the jail's own loopback.
func (p *Process) DialLoopback(ctx context.Context, port int) (net.Conn, error) {
	if p.network == NetworkHost {
		return nil, ErrNoOwnNetwork
	}
	fd, err := pidfdIn(p.pid, p.netns)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return DialLoopback(ctx, fd, port)
}

// ListeningPorts lists the TCP ports listening on the jail's loopback.
func (p *Process) ListeningPorts() ([]int, error) {
	if p.network == NetworkHost {
		return nil, ErrNoOwnNetwork
	}
	return listeningIn(p.pid, p.netns)
}

// listeningIn lists the ports of pid's namespace, if it is still netns.
func listeningIn(pid int, netns uint64) ([]int, error) {
	fd, err := pidfdIn(pid, netns)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	ports, err := ListeningPorts(pid)
	if err != nil {
		return nil, err
	}
	if unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
		return nil, os.ErrProcessDone
	}
	return ports, nil
}

// PortsOf lists the ports listening in the network namespace of pid, which
// pidfd holds (it is checked to be alive after the read, so the answer is
// that process's and not a recycled PID's).
func PortsOf(pidfd, pid int) ([]int, error) {
	ports, err := ListeningPorts(pid)
	if err != nil {
		return nil, err
	}
	if unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		return nil, os.ErrProcessDone
	}
	return ports, nil
}
