package mcpserver_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandloop/sandloop/internal/mcpserver"
	"github.com/sandloop/sandloop/internal/mcpserver/mcptest"
)

// TestTypeScriptClientHTTP drives the HTTP handler with the official
// TypeScript MCP SDK client (see package mcptest; cmd/sandloop's tests
// drive `sandloop mcp` and `sandloop serve` the same way).
func TestTypeScriptClientHTTP(t *testing.T) {
	mcptest.TSClient(t)
	src := newSource(t)
	h, err := mcpserver.NewHTTPHandler(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	t.Cleanup(func() { h.Close() })
	mcptest.CheckTSResult(t, mcptest.RunTSClient(t, "http", ts.URL+"/mcp"), false)
	// The client ended its MCP session: its sandbox is closed.
	waitClosed(t, src)
}
