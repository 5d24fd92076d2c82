package tools

import (
	"context"
	_ "embed"
	"fmt"
	"path"
	"strings"
)

// ListInput is list_files's arguments.
type ListInput struct {
	Path string `json:"path,omitempty" jsonschema:"Directory relative to /workspace (or absolute under /workspace). Default: /workspace itself."`
}

// ListOutput is list_files's structuredContent.
type ListOutput struct {
	Path    string      `json:"path" jsonschema:"the directory listed, relative to /workspace"`
	Entries []FileEntry `json:"entries"`
}

// FileEntry is one entry of a listing.
type FileEntry struct {
	Path string `json:"path" jsonschema:"relative to /workspace"`
	Name string `json:"name"`
	Type string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size int64  `json:"size" jsonschema:"bytes"`
}

//go:embed list_files.md
var listFilesMD string

var listFiles = define(spec{
	name:        ListFiles,
	description: listFilesMD,
	annotations: fileHints("List files", true, true),
	output:      mustSchema[ListOutput](),
}, func(ctx context.Context, c *call, in ListInput) (*Result, error) {
	rel, ws, err := c.open(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	entries, err := ws.List(rel)
	if err != nil {
		return nil, fileError(err, in.Path)
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
	return &Result{Text: strings.TrimRight(b.String(), "\n"), Structured: out}, nil
})
