package tools

import (
	"context"
	_ "embed"
	"errors"
)

// ResetInput is reset_session's arguments.
type ResetInput struct {
	ClearFiles bool `json:"clear_files,omitempty" jsonschema:"Also delete every file in /workspace. Default false: files are kept."`
}

//go:embed reset_session.md
var resetSessionMD string

var resetSession = define(spec{
	name:        ResetSession,
	description: resetSessionMD,
	annotations: fileHints("Reset the session", false, true),
}, func(ctx context.Context, c *call, in ResetInput) (*Result, error) {
	r, ok := c.sess.(Resetter)
	if !ok {
		return nil, errors.New("this session cannot be reset")
	}
	msg, err := r.Reset(ctx, in.ClearFiles)
	if err != nil {
		return nil, err
	}
	return textResult(msg), nil
})
