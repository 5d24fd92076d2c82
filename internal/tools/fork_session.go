package tools

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ForkInput is fork_session's arguments.
type ForkInput struct {
	SwitchTo string `json:"switch_to,omitempty" jsonschema:"The id of a session you left by forking, to continue there instead. Default: fork the current session."`
}

//go:embed fork_session.md
var forkSessionMD string

var forkSession = define(spec{
	name:        ForkSession,
	description: forkSessionMD,
	annotations: func(*Config) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: "Fork the session", DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}
	},
}, func(ctx context.Context, c *call, in ForkInput) (*Result, error) {
	f, ok := c.sess.(Forker)
	if !ok {
		return nil, errors.New("this server cannot fork sessions; use checkpoint and undo to try an idea and come back")
	}
	if in.SwitchTo != "" {
		if err := f.SwitchTo(ctx, in.SwitchTo); err != nil {
			return nil, err
		}
		return textResult(fmt.Sprintf("You are now working in session %s again, as you left it.", in.SwitchTo)), nil
	}
	child, parent, r, err := f.Fork(ctx)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "You are now working in session %s, a copy of %s. Session %s is kept exactly as it was; go back to it with fork_session {\"switch_to\": %q}.\n", child, parent, parent, parent)
	b.WriteString(restoredText(r))
	return textResult(b.String()), nil
})
