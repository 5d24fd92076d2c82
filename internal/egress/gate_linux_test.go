package egress_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Close ends a dial under way rather than waiting out its timeout.
func TestCloseEndsADial(t *testing.T) {
	port := fullListener(t)
	asked := make(chan struct{}, 1)
	resolve := func(ctx context.Context, host string) ([]netip.Addr, error) {
		asked <- struct{}{} // the dial follows
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	for _, req := range []string{
		"CONNECT full.test:" + port + " HTTP/1.1\r\nHost: full.test:" + port + "\r\n\r\n",
		"GET http://full.test:" + port + "/ HTTP/1.1\r\nHost: full.test:" + port + "\r\n\r\n",
	} {
		closeWhileBusy(t, []string{"full.test:" + port, "127.0.0.1"}, resolve, req, asked)
	}
}

// fullListener returns the port of a loopback listener whose accept queue
// is full: it never accepts, so a connect to it gets no answer (its SYNs
// are dropped) until the connect times out.
func fullListener(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("the accept queue of a loopback listener never filled")
	return ""
}
