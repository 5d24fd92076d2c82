package tools

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CheckpointInput is checkpoint's arguments.
type CheckpointInput struct {
	Name string `json:"name,omitempty" jsonschema:"A short name to remember it by (optional)."`
}

//go:embed checkpoint.md
var checkpointMD string

var checkpointTool = define(spec{
	name:        CheckpointName,
	description: checkpointMD,
	annotations: func(*Config) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: "Checkpoint the session", DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}
	},
}, func(ctx context.Context, c *call, in CheckpointInput) (*Result, error) {
	cp, ok := c.sess.(Checkpointer)
	if !ok {
		return nil, errors.New("this session cannot take checkpoints")
	}
	if len(in.Name) > 100 {
		return nil, argErr("name", "name: at most 100 characters")
	}
	k, err := cp.Checkpoint(ctx, in.Name)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Checkpoint %s taken at execution %d: variables, imports and %s (%s) as they are now.",
		k.ID, k.ExecutionCount, plural(k.Files, "file"), formatBytes(k.FileBytes))
	fmt.Fprintf(&b, "\nGo back to it with undo {\"checkpoint\": %q}.", k.ID)
	if len(k.NotCarried) > 0 {
		b.WriteString("\nNot in the checkpoint (a restore will not bring these back):")
		for _, n := range k.NotCarried {
			b.WriteString("\n- " + n)
		}
	}
	return textResult(b.String()), nil
})
