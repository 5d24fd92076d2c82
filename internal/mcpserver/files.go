package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/workspace"
)

// workspace opens the session's workspace. Writes as root give the files
// to the sandbox user, so code in the sandbox can change them.
func (s *Server) workspace(sess Session) (*workspace.Workspace, error) {
	opts := workspace.Options{MaxFileBytes: s.opts.MaxFileBytes, MaxTotalBytes: s.opts.MaxWorkspaceBytes}
	if os.Geteuid() == 0 {
		opts.OwnerSet = true
		opts.UID, opts.GID = sandboxHostID(), sandboxHostID()
	}
	return workspace.Open(sess.Workspace(), opts)
}

// sessionWorkspace opens the connection's workspace, starting its session
// if needed (a file written before any code runs is there when it does).
func (s *Server) sessionWorkspace(ctx context.Context, req *mcp.CallToolRequest) (*workspace.Workspace, error) {
	sess, err := s.session(ctx, req.Session)
	if err != nil {
		return nil, err
	}
	return s.workspace(sess)
}

// workspacePath accepts paths as the code sees them: relative to the
// working directory /workspace, or absolute under it.
func workspacePath(p string) (string, error) {
	switch {
	case p == "/workspace":
		p = "."
	case strings.HasPrefix(p, "/workspace/"):
		p = strings.TrimPrefix(p, "/workspace/")
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("path %q is outside /workspace: give a path relative to /workspace", p)
	}
	return workspace.Clean(p)
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, *WriteOutput, error) {
	rel, err := workspacePath(in.Path)
	if err != nil {
		return nil, nil, err
	}
	if rel == "." {
		return nil, nil, errors.New("path is empty: give a file name such as data.csv")
	}
	ws, err := s.sessionWorkspace(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer ws.Close()
	n, err := ws.Write(rel, strings.NewReader(in.Content))
	if err != nil {
		return nil, nil, fileError(err, in.Path)
	}
	return textResult(fmt.Sprintf("Wrote %d bytes to /workspace/%s.", n, rel)), &WriteOutput{Path: rel, Bytes: n}, nil
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, any, error) {
	rel, err := workspacePath(in.Path)
	if err != nil {
		return nil, nil, err
	}
	ws, err := s.sessionWorkspace(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer ws.Close()
	b, err := ws.ReadFile(rel, s.opts.MaxFileBytes)
	if err != nil {
		return nil, nil, fileError(err, in.Path)
	}
	switch ct := http.DetectContentType(b); ct {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: fmt.Sprintf("/workspace/%s: %s, %d bytes", rel, ct, len(b))},
			&mcp.ImageContent{MIMEType: ct, Data: b},
		}}, nil, nil
	default:
		if !utf8.Valid(b) || strings.ContainsRune(string(b), 0) {
			return textResult(fmt.Sprintf("/workspace/%s is a binary file (%s, %d bytes), not shown. Inspect it with execute_python.", rel, ct, len(b))), nil, nil
		}
	}
	if len(b) == 0 {
		return textResult(fmt.Sprintf("/workspace/%s is empty (0 bytes).", rel)), nil, nil
	}
	return textResult(string(b)), nil, nil
}

func (s *Server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, *ListOutput, error) {
	rel, err := workspacePath(in.Path)
	if err != nil {
		return nil, nil, err
	}
	ws, err := s.sessionWorkspace(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer ws.Close()
	entries, err := ws.List(rel)
	if err != nil {
		return nil, nil, fileError(err, in.Path)
	}
	out := &ListOutput{Path: rel, Entries: make([]FileEntry, 0, len(entries))}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d entries\n", path.Join("/workspace", rel), len(entries))
	for _, e := range entries {
		out.Entries = append(out.Entries, FileEntry{Path: e.Path, Name: e.Name, Type: e.Type, Size: e.Size})
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "%s/\n", e.Name)
		case "file":
			fmt.Fprintf(&b, "%s  (%d bytes)\n", e.Name, e.Size)
		default:
			fmt.Fprintf(&b, "%s  (%s)\n", e.Name, e.Type)
		}
	}
	return textResult(strings.TrimRight(b.String(), "\n")), out, nil
}

// fileError says what went wrong with a path in the model's terms.
func fileError(err error, p string) error {
	var le *workspace.LimitError
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return fmt.Errorf("%s: no such file or directory in /workspace (list_files shows what is there)", p)
	case errors.As(err, &le):
		return fmt.Errorf("%s: the %s limit of %d bytes would be exceeded", p, le.What, le.Limit)
	case errors.Is(err, workspace.ErrNotRegular):
		return fmt.Errorf("%s: not a regular file (a directory? use list_files)", p)
	}
	return err
}
