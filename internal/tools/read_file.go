package tools

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
)

// ReadInput is read_file's arguments.
type ReadInput struct {
	Path   string `json:"path" jsonschema:"File path relative to /workspace (or absolute under /workspace)."`
	Offset int    `json:"offset,omitempty" jsonschema:"First line to show, from 1. Given with or without limit, the lines come numbered."`
	Limit  int    `json:"limit,omitempty" jsonschema:"Number of lines to show (default 400 when paging)."`
}

//go:embed read_file.md
var readFileMD string

var readFile = define(spec{
	name:        ReadFile,
	description: readFileMD,
	annotations: fileHints("Read a file", true, true),
	schema: func(cfg *Config, s *jsonschema.Schema) {
		minimum("offset", 0)(cfg, s)
		minimum("limit", 0)(cfg, s)
	},
}, func(ctx context.Context, c *call, in ReadInput) (*Result, error) {
	rel, ws, err := c.open(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	b, err := ws.ReadFile(rel, c.cfg.MaxFileBytes)
	if err != nil {
		return nil, fileError(err, in.Path)
	}
	switch ct := http.DetectContentType(b); ct {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return &Result{
			Text:   fmt.Sprintf("/workspace/%s: %s, %d bytes", rel, ct, len(b)),
			Images: []Image{{MIMEType: ct, Data: b}},
		}, nil
	default:
		if !utf8.Valid(b) || strings.ContainsRune(string(b), 0) {
			return textResult(fmt.Sprintf("/workspace/%s is a binary file (%s, %d bytes), not shown. Inspect it with execute_python.", rel, ct, len(b))), nil
		}
	}
	if len(b) == 0 {
		return textResult(fmt.Sprintf("/workspace/%s is empty (0 bytes).", rel)), nil
	}
	if !c.cfg.NumberLines && in.Offset == 0 && in.Limit == 0 {
		return textResult(string(b)), nil
	}
	return textResult(NumberLines(string(b), in.Offset, in.Limit)), nil
})

// NumberLines shows lines [offset, offset+limit) of s with their numbers
// (offset from 1; limit 400 if not positive), and how to see the rest.
func NumberLines(s string, offset, limit int) string {
	if offset < 1 {
		offset = 1
	}
	if limit <= 0 {
		limit = 400
	}
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) == 0 {
		return "(empty file)"
	}
	var b strings.Builder
	end := min(len(lines), offset-1+limit)
	for i := offset - 1; i < end; i++ {
		fmt.Fprintf(&b, "%5d| %s", i+1, strings.TrimRight(lines[i], "\n")+"\n")
	}
	if end < len(lines) {
		fmt.Fprintf(&b, "... (%d more lines; use offset=%d)\n", len(lines)-end, end+1)
	}
	return strings.TrimRight(b.String(), "\n")
}
