package tools

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/kernel"
)

// MCPSessionFunc returns the session an MCP tool call runs in, and a sink
// for the live events of its executions (nil for none).
type MCPSessionFunc func(ctx context.Context, req *mcp.CallToolRequest) (Session, kernel.EventFunc, error)

// AddToMCP adds the set's tools to srv; open gives each call its session.
// The SDK checks a call's arguments against the tool's schema; a tool's
// error becomes a tool error result the model reads.
func (s *Set) AddToMCP(srv *mcp.Server, open MCPSessionFunc) {
	for _, t := range s.tools {
		mt := &mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, Annotations: t.Annotations}
		if t.OutputSchema != nil {
			mt.OutputSchema = t.OutputSchema
		}
		t.addMCP(srv, mt, open)
	}
}

// mcpResult is res as MCP content: its text (after the session's note, if
// it has one), then its images.
func mcpResult(sess Session, res *Result) (*mcp.CallToolResult, any, error) {
	text := res.Text
	if n, ok := sess.(Noter); ok {
		if note := n.Note(); note != "" {
			text = note + "\n" + text
		}
	}
	out := &mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	for _, img := range res.Images {
		out.Content = append(out.Content, &mcp.ImageContent{MIMEType: img.MIMEType, Data: img.Data})
	}
	return out, res.Structured, nil
}
