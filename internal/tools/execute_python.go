package tools

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandloop/sandloop/internal/kernel"
)

// ExecuteInput is execute_python's arguments.
type ExecuteInput struct {
	Code     string   `json:"code" jsonschema:"Python source to run, like a notebook cell. The value of the last expression is returned as the result. Lines starting with ! run as shell commands."`
	TimeoutS *float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit in seconds. When it passes the code is interrupted (variables are kept)."`
}

//go:embed execute_python.md
var executePythonMD string

var executePython = define(spec{
	name:        ExecutePython,
	description: executePythonMD,
	annotations: sandboxHints("Run Python"),
	schema:      timeoutRange,
	output:      mustSchema[kernel.Result](),
}, func(ctx context.Context, c *call, in ExecuteInput) (*Result, error) {
	if len(in.Code) > c.cfg.MaxCodeBytes {
		return nil, argErr("code", "code is %d bytes, more than the limit of %d bytes: put large data in a file with write_file, or generate it in code", len(in.Code), c.cfg.MaxCodeBytes)
	}
	timeout, err := c.timeout(in.TimeoutS)
	if err != nil {
		return nil, err
	}
	if !c.confirm(ctx, ExecutePython, in.Code) {
		return declined("run this"), nil
	}
	res, err := c.sess.Execute(ctx, kernel.Request{Code: in.Code, Timeout: timeout}, c.onEvent)
	if err != nil {
		return nil, err
	}
	return &Result{
		Text:       Render(res, timeout, c.cfg.MaxTextBytes),
		IsError:    res.Status != kernel.StatusOK,
		Images:     images(res),
		Structured: withoutImages(res),
		Exec:       res,
		Source:     in.Code,
	}, nil
})

// mustSchema is T's schema, for a tool's structured output.
func mustSchema[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %T: %v", *new(T), err))
	}
	return s
}
