package mcpserver

import (
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPHandler serves MCP over streamable HTTP: each MCP session (the
// Mcp-Session-Id the client got at initialize) has its own sandbox
// session, closed when the client deletes the MCP session, when it has been
// idle for Options.IdleTimeout, or by Close.
type HTTPHandler struct {
	srv *Server
	h   *mcp.StreamableHTTPHandler
}

// NewHTTPHandler returns the handler to mount at /mcp; src makes a sandbox
// session for each MCP session. It fails only on bad options.
//
// Unless Options.HostChecked, a request that reached a loopback address
// with a Host that is not a loopback name is refused (DNS rebinding).
// Bodies are capped a little over the code and file limits.
func NewHTTPHandler(src SessionSource, opts *Options) (*HTTPHandler, error) {
	srv, err := New(src, opts)
	if err != nil {
		return nil, err
	}
	o := srv.opts
	// JSON escaping makes text longer (quotes, newlines, control bytes):
	// allow twice the raw limit plus room for the envelope, so that the
	// tools' own limits, with their clearer messages, apply first.
	body := 2*max(o.MaxFileBytes, int64(o.MaxCodeBytes)) + 1<<20
	hopts := &mcp.StreamableHTTPOptions{Logger: o.Logger, MaxRequestBodyBytes: body, DisableLocalhostProtection: o.HostChecked}
	if o.IdleTimeout > 0 {
		hopts.SessionTimeout = o.IdleTimeout
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.mcp }, hopts)
	return &HTTPHandler{srv: srv, h: h}, nil
}

// ServeHTTP implements http.Handler.
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.h.ServeHTTP(w, r) }

// Close ends every MCP session and closes its sandbox session.
func (h *HTTPHandler) Close() error { return h.srv.Close() }
