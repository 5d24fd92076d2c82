package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
)

// Ports: a server the session's code started (a Flask app, a notebook's
// dashboard) listens on the sandbox's own loopback, which nothing outside
// can route to. DialPort connects to it from the host (see
// jail.DialLoopback), for the API's port routes and previews.

// ErrPortsUnsupported means the session's kernel was started in a way whose
// network the host cannot enter (a launcher of the caller's).
var ErrPortsUnsupported = errors.New("this session's ports cannot be reached from the server")

// ErrReservedPort is the egress proxy's port inside the sandbox, which is
// the server's own listener and never a route to the session's code.
var ErrReservedPort = fmt.Errorf("port %d is the sandbox's egress proxy, not a server of its code", egress.Port)

// PortAccess says who may reach a session's ports besides its owner (who
// always may, with the token that made it, or with a signed URL it asked for).
type PortAccess struct {
	// Public: anyone who can reach the server (E2B's default,
	// allowPublicTraffic; the session's id is the only secret).
	Public bool
	// Token, if set, is accepted in portproxy.TokenHeader (and E2B's
	// traffic-token header): E2B's trafficAccessToken.
	Token string
	// HostMask, if set, is the Host header the session's apps see on the
	// requests proxied to them, "${PORT}" replaced by the port (E2B's
	// maskRequestHost, e.g. "localhost:${PORT}" for a dev server that
	// refuses other names); else the name the client used.
	HostMask string `json:",omitempty"`
	// TLSPorts are the ports whose apps serve HTTPS: the proxy speaks TLS
	// to them, not checking their certificates (E2B's httpsPorts).
	TLSPorts []int `json:",omitempty"`
}

// Reach is how the proxy reaches port: the Host header its app sees (""
// for the client's) and whether it speaks TLS to it.
func (a PortAccess) Reach(port int) (host string, tls bool) {
	if a.HostMask != "" {
		host = strings.ReplaceAll(a.HostMask, "${PORT}", strconv.Itoa(port))
	}
	return host, slices.Contains(a.TLSPorts, port)
}

// portReacher is a kernel process whose loopback the host can reach.
type portReacher interface {
	DialLoopback(ctx context.Context, port int) (net.Conn, error)
	ListeningPorts() ([]int, error)
}

func (s *Session) reacher() (portReacher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.opts.Network == jail.NetworkHost {
		return nil, jail.ErrNoOwnNetwork
	}
	if err := s.k.Err(); err != nil {
		// Its sandbox ended with the kernel: nothing listens, and its
		// PID 1 is gone (not "process already finished").
		return nil, fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	r, ok := s.proc.(portReacher)
	if !ok {
		return nil, ErrPortsUnsupported
	}
	return r, nil
}

// DialPort connects to port on the session's own loopback, where a server
// started by its code listens.
func (s *Session) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port == egress.Port && s.listenPort() != 0 {
		return nil, ErrReservedPort
	}
	r, err := s.reacher()
	if err != nil {
		return nil, err
	}
	return r.DialLoopback(ctx, port)
}

// Ports lists the TCP ports listening on the session's loopback (or on all
// of its addresses), sorted; the egress proxy's listener is not among them.
func (s *Session) Ports() ([]int, error) {
	r, err := s.reacher()
	if errors.Is(err, ErrRestartRequired) {
		return nil, nil // a dead kernel's sandbox: no server listens
	}
	if err != nil {
		return nil, err
	}
	ports, err := r.ListeningPorts()
	if err != nil {
		return nil, err
	}
	if s.listenPort() != 0 {
		ports = slices.DeleteFunc(ports, func(p int) bool { return p == egress.Port })
	}
	return ports, nil
}

// DialPort is Session.DialPort; the session is in use while the
// connection is open (close it to give the session back), so a long
// WebSocket to an app in the sandbox keeps it from being reaped as idle.
func (m *Managed) DialPort(ctx context.Context, port int) (net.Conn, error) {
	release, err := m.use()
	if err != nil {
		return nil, err
	}
	c, err := m.Session.DialPort(ctx, port)
	if err != nil {
		release()
		return nil, err
	}
	return &leasedConn{Conn: c, release: release}, nil
}

// leasedConn releases its session's lease when closed.
type leasedConn struct {
	net.Conn
	release func()
}

func (c *leasedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite half-closes the connection where the transport can (as
// *net.TCPConn does), for proxies that pass a client's end of input on.
func (c *leasedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
