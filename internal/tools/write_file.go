package tools

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
)

// WriteInput is write_file's arguments.
type WriteInput struct {
	Path    string `json:"path" jsonschema:"File path relative to /workspace (or absolute under /workspace). Parent directories are created."`
	Content string `json:"content" jsonschema:"The file's new content (text, written as UTF-8)."`
}

// WriteOutput is write_file's structuredContent.
type WriteOutput struct {
	Path  string `json:"path" jsonschema:"the path written, relative to /workspace"`
	Bytes int64  `json:"bytes" jsonschema:"bytes written"`
}

//go:embed write_file.md
var writeFileMD string

var writeFile = define(spec{
	name:        WriteFile,
	description: writeFileMD,
	annotations: fileHints("Write a file", false, true),
	output:      mustSchema[WriteOutput](),
}, func(ctx context.Context, c *call, in WriteInput) (*Result, error) {
	rel, ws, err := c.open(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	if rel == "." {
		return nil, argErr("path", "path is empty: give a file name such as data.csv")
	}
	n, err := ws.Write(rel, strings.NewReader(in.Content))
	if err != nil {
		return nil, fileError(err, in.Path)
	}
	return &Result{
		Text:       fmt.Sprintf("Wrote %d bytes to /workspace/%s.", n, rel),
		Structured: &WriteOutput{Path: rel, Bytes: n},
		Changed:    []string{rel},
	}, nil
})
