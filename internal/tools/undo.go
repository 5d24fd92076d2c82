package tools

import (
	"context"
	_ "embed"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// UndoInput is undo's arguments.
type UndoInput struct {
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"The id of a checkpoint to go back to (from checkpoint's result, e.g. cp2). Default: undo the last execution."`
}

//go:embed undo.md
var undoMD string

var undoTool = define(spec{
	name:        Undo,
	description: undoMD,
	annotations: func(*Config) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: "Undo", DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(false)}
	},
}, func(ctx context.Context, c *call, in UndoInput) (*Result, error) {
	cp, ok := c.sess.(Checkpointer)
	if !ok {
		return nil, errors.New("this session has no checkpoints to go back to")
	}
	r, err := cp.Restore(ctx, in.Checkpoint)
	if err != nil {
		return nil, err
	}
	return textResult(restoredText(r)), nil
})
