package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/workspace"
)

// workspacePath accepts paths as the code sees them: relative to the
// working directory /workspace, or absolute under it.
func workspacePath(p string) (string, error) {
	switch {
	case p == "/workspace":
		p = "."
	case strings.HasPrefix(p, "/workspace/"):
		p = strings.TrimPrefix(p, "/workspace/")
	case strings.HasPrefix(p, "/"):
		return "", argErr("path", "path %q is outside /workspace: give a path relative to /workspace", p)
	}
	rel, err := workspace.Clean(p)
	if err != nil {
		return "", &ArgumentError{"path", err}
	}
	return rel, nil
}

// open resolves a path the model gave and opens the workspace for one
// file call; the caller closes it.
func (c *call) open(ctx context.Context, p string) (string, Files, error) {
	rel, err := workspacePath(p)
	if err != nil {
		return "", nil, err
	}
	ws, err := c.sess.Files(ctx)
	if err != nil {
		return "", nil, err
	}
	return rel, ws, nil
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

// fileHints are the annotations of a file tool: it touches /workspace only.
func fileHints(title string, readOnly, idempotent bool) func(*Config) *mcp.ToolAnnotations {
	return func(*Config) *mcp.ToolAnnotations {
		a := &mcp.ToolAnnotations{Title: title, ReadOnlyHint: readOnly, IdempotentHint: idempotent, OpenWorldHint: boolPtr(false)}
		if !readOnly {
			a.DestructiveHint = boolPtr(true)
		}
		return a
	}
}

// minimum sets the least value of an integer argument in the schema.
func minimum(name string, v float64) func(*Config, *jsonschema.Schema) {
	return func(_ *Config, s *jsonschema.Schema) { s.Properties[name].Minimum = jsonschema.Ptr(v) }
}
