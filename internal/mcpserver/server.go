// Package mcpserver exposes sandloop sessions as Model Context Protocol
// tools (execute_python, run_shell, files, reset) over stdio or streamable
// HTTP, with the official Go SDK.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/tools"
)

// Session is the sandbox session a connection's tools run in: the methods
// of *session.Session that the tools call.
type Session interface {
	// Execute runs one cell. A failing program is a Result, not an error.
	Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error)
	// Restart replaces the kernel: Python state is gone, files stay.
	Restart(ctx context.Context) error
	// Workspace is the host directory mounted at /workspace.
	Workspace() string
	// Close ends the session and everything it started.
	Close() error
}

// SessionSource makes the sandbox session of a new MCP connection. The
// server closes each session it got when the connection ends.
type SessionSource interface {
	NewSession(ctx context.Context) (Session, error)
}

// SessionSourceFunc adapts a function to a SessionSource.
type SessionSourceFunc func(ctx context.Context) (Session, error)

// NewSession calls f(ctx).
func (f SessionSourceFunc) NewSession(ctx context.Context) (Session, error) { return f(ctx) }

// ToolNames lists every tool the server can offer (internal/tools defines
// them).
var ToolNames = []string{tools.ExecutePython, tools.RunShell, tools.WriteFile, tools.ReadFile, tools.ListFiles, tools.ResetSession,
	tools.CheckpointName, tools.Undo, tools.ForkSession, tools.SnapshotName}

// Options configure a Server. The zero value is ready to use.
type Options struct {
	// Tools names the tools offered. If nil, all of ToolNames.
	Tools []string
	// DefaultTimeout bounds an execution whose call gives no timeout_s.
	// If zero, 30 seconds.
	DefaultTimeout time.Duration
	// MaxTimeout is the largest timeout_s a call may ask for. If zero,
	// 10 minutes.
	MaxTimeout time.Duration
	// MaxCodeBytes caps execute_python's code. If zero, 1 MiB.
	MaxCodeBytes int
	// MaxTextBytes caps each of stdout, stderr and the traceback in the
	// text a tool returns: longer ones keep their head and tail and say
	// how much was cut (structuredContent keeps all that was captured).
	// If zero, 16 KiB.
	MaxTextBytes int
	// MaxFileBytes caps a file read by read_file or written by write_file.
	// If zero, 4 MiB.
	MaxFileBytes int64
	// MaxWorkspaceBytes caps the workspace's total size after a
	// write_file. If zero, 1 GiB.
	MaxWorkspaceBytes int64
	// Network tells the tools' descriptions and hints that sandboxed code
	// can reach the network.
	Network bool
	// Allow is the allowlist of sandboxes in allow mode (reached through
	// sandloop's proxy), for the same descriptions.
	Allow []string
	// IdleTimeout closes an HTTP MCP session, and its sandbox, after this
	// long without requests. If zero, 30 minutes; if negative, never.
	// Stdio connections end when the client closes the pipe.
	IdleTimeout time.Duration
	// HostChecked says the HTTP server in front refuses foreign Host
	// headers itself (as sandloop serve does, honouring --allowed-host):
	// the HTTP handler then skips its own check, which accepts only
	// loopback names on a loopback address.
	HostChecked bool
	// Version is reported to clients as the server's version. If empty,
	// "dev".
	Version string
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Tools == nil {
		r.Tools = ToolNames
	}
	for _, t := range r.Tools {
		if !slices.Contains(ToolNames, t) {
			return r, fmt.Errorf("unknown tool %q (the tools are %s)", t, strings.Join(ToolNames, ", "))
		}
	}
	// internal/tools applies the defaults of the timeouts and the text
	// limit; the code limit sizes the HTTP body too.
	if r.MaxCodeBytes <= 0 {
		r.MaxCodeBytes = 1 << 20
	}
	if r.MaxFileBytes <= 0 {
		r.MaxFileBytes = 4 << 20
	}
	if r.MaxWorkspaceBytes <= 0 {
		r.MaxWorkspaceBytes = 1 << 30
	}
	if r.IdleTimeout == 0 {
		r.IdleTimeout = 30 * time.Minute
	}
	if r.Version == "" {
		r.Version = "dev"
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// ErrClosed is returned for calls after the Server was closed.
var ErrClosed = errors.New("mcp server closed")

// Server is the MCP server: one mcp.Server whose tools run in a sandbox
// session per connection, made on the connection's first tool call and
// closed when the connection ends.
type Server struct {
	mcp  *mcp.Server
	src  SessionSource
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	conns    map[*mcp.ServerSession]*conn
	closed   bool
	watchers sync.WaitGroup // one per conn: closes its session when the connection ends
}

// conn is one MCP connection's sandbox.
type conn struct {
	mu   sync.Mutex // held while the session is made or replaced
	sess Session
	// kept are the sessions fork_session left, for switch_to.
	kept []Session
	gone bool // the connection ended: no more sessions
}

// New returns a server whose connections get their sessions from src. It
// fails only on bad options (an unknown tool name).
func New(src SessionSource, opts *Options) (*Server, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{src: src, opts: o, log: o.Logger, conns: map[*mcp.ServerSession]*conn{}}
	inst := instructions
	if slices.Contains(o.Tools, tools.Undo) {
		inst += undoInstructions
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "sandloop", Title: "sandloop: sandboxed Python", Version: o.Version}, &mcp.ServerOptions{
		Instructions: inst,
		Logger:       o.Logger,
	})
	if err := s.addTools(); err != nil {
		return nil, err
	}
	return s, nil
}

const instructions = `sandloop runs Python in an isolated sandbox. Each connection has its own stateful Python kernel: variables, imports and files persist between calls until reset_session. The working directory is /workspace; use write_file, read_file and list_files to move files in and out.`

// undoInstructions are added when undo is offered.
const undoInstructions = ` undo reverts the last call (variables and files); checkpoint keeps a state to come back to.`

// MCP returns the underlying mcp.Server (for transports of the caller's own).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one connection over t (for example &mcp.StdioTransport{})
// until the client disconnects or ctx is done, then closes its session.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	ss, err := s.Connect(ctx, t)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- ss.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		s.drop(ss)
		ss.Close()
		<-done
		err = ctx.Err()
	}
	s.drop(ss)
	return err
}

// Connect starts serving one connection over t and returns at once.
func (s *Server) Connect(ctx context.Context, t mcp.Transport) (*mcp.ServerSession, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return s.mcp.Connect(ctx, t, nil)
}

// Close closes every connection and its sandbox session, and waits until
// they are gone.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := make(map[*mcp.ServerSession]*conn, len(s.conns))
	for ss, c := range s.conns {
		conns[ss] = c
	}
	s.mu.Unlock()
	var errs []error
	// Sandboxes first: that ends running executions, which the MCP
	// session's Close waits for.
	for _, c := range conns {
		errs = append(errs, c.close())
	}
	for ss := range conns {
		ss.Close()
	}
	s.watchers.Wait()
	return errors.Join(errs...)
}

// conn returns the connection's state, starting to watch the connection
// the first time. It is nil once the server is closed.
func (s *Server) conn(ss *mcp.ServerSession) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	c := s.conns[ss]
	if c == nil {
		c = &conn{}
		s.conns[ss] = c
		s.watchers.Add(1)
		go func() {
			defer s.watchers.Done()
			ss.Wait()
			s.drop(ss)
		}()
	}
	return c
}

// drop forgets a connection and closes its session.
func (s *Server) drop(ss *mcp.ServerSession) {
	s.mu.Lock()
	c := s.conns[ss]
	delete(s.conns, ss)
	s.mu.Unlock()
	if c != nil {
		if err := c.close(); err != nil {
			s.log.Warn("close session", "err", err)
		}
	}
}

func (c *conn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	var errs []error
	for _, k := range c.kept {
		errs = append(errs, k.Close())
	}
	c.kept = nil
	if c.sess != nil {
		errs = append(errs, c.sess.Close())
		c.sess = nil
	}
	return errors.Join(errs...)
}

// session returns the connection's session, making it on first use.
func (s *Server) session(ctx context.Context, ss *mcp.ServerSession) (Session, error) {
	c := s.conn(ss)
	if c == nil {
		return nil, ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil, errors.New("the MCP connection has ended")
	}
	if c.sess == nil {
		sess, err := s.src.NewSession(ctx)
		if err != nil {
			return nil, fmt.Errorf("start a sandbox session: %w", err)
		}
		c.sess = sess
		s.log.Debug("sandbox session started", "mcp_session", ss.ID())
	}
	return c.sess, nil
}

// existing returns the connection's session if it has one.
func (s *Server) existing(ss *mcp.ServerSession) Session {
	c := s.conn(ss)
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess
}

// replace closes old, the connection's session that can no longer be used
// (the session manager closed it), so that the next call makes a new one.
func (s *Server) replace(ss *mcp.ServerSession, old Session) {
	c := s.conn(ss)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == old {
		old.Close()
		c.sess = nil
	}
}
