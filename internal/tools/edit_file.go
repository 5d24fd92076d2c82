package tools

import (
	"context"
	_ "embed"
	"strings"
)

// EditInput is edit_file's arguments.
type EditInput struct {
	Path    string `json:"path" jsonschema:"File path relative to /workspace (or absolute under /workspace)."`
	OldText string `json:"old_text" jsonschema:"The exact text to replace: it must occur once in the file, whitespace and indentation included."`
	NewText string `json:"new_text" jsonschema:"The text to put in its place."`
}

//go:embed edit_file.md
var editFileMD string

var editFile = define(spec{
	name:        EditFile,
	description: editFileMD,
	annotations: fileHints("Edit a file", false, false),
}, func(ctx context.Context, c *call, in EditInput) (*Result, error) {
	if in.OldText == "" {
		return nil, argErr("old_text", "old_text is empty: give the exact text to replace (use write_file to create a file)")
	}
	rel, ws, err := c.open(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	b, err := ws.ReadFile(rel, c.cfg.MaxFileBytes)
	if err != nil {
		return nil, fileError(err, in.Path)
	}
	s := string(b)
	switch n := strings.Count(s, in.OldText); n {
	case 0:
		return nil, argErr("old_text", "old_text was not found in %s: it must match the file exactly, whitespace and indentation included (read_file shows the current text)", rel)
	case 1:
	default:
		return nil, argErr("old_text", "old_text occurs %d times in %s: include more surrounding lines so it is unique", n, rel)
	}
	if _, err := ws.Write(rel, strings.NewReader(strings.Replace(s, in.OldText, in.NewText, 1))); err != nil {
		return nil, fileError(err, in.Path)
	}
	return &Result{Text: "edited " + rel, Changed: []string{rel}}, nil
})
