package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Tool names: internal/tools defines the tools; finish is the agent's own.
const (
	ToolExecutePython   = tools.ExecutePython
	ToolRunShell        = tools.RunShell
	ToolWriteFile       = tools.WriteFile
	ToolReadFile        = tools.ReadFile
	ToolEditFile        = tools.EditFile
	ToolListFiles       = tools.ListFiles
	ToolStartProcess    = tools.StartProcess
	ToolProcessOutput   = tools.ProcessOutput
	ToolStopProcess     = tools.StopProcess
	ToolInstallPackages = tools.InstallPackages
	ToolFinish          = "finish"
)

// agentTools are the shared tools the agent offers, besides finish.
var agentTools = []string{
	ToolExecutePython, ToolRunShell, ToolWriteFile, ToolReadFile, ToolEditFile, ToolListFiles,
	ToolStartProcess, ToolProcessOutput, ToolStopProcess, ToolInstallPackages,
}

// newToolSet configures the shared tools for this run.
func (r *run) newToolSet() (*tools.Set, error) {
	o := r.opts
	return tools.New(tools.Config{
		DefaultTimeout: o.ExecTimeout,
		MaxTimeout:     o.MaxExecTimeout,
		MaxTextBytes:   o.MaxOutputBytes,
		MaxFileBytes:   16 << 20,
		NumberLines:    true,
		Network:        o.Network,
		Allow:          r.allowlist(),
		PackageIndex:   o.PackageIndex,
		WheelDir:       o.WheelDir,
		Confirm:        o.Confirm,
	}, agentTools...)
}

// finishArgs are finish's arguments; debug mode requires root_cause.
type finishArgs struct {
	Summary   string `json:"summary" jsonschema:"what was done and how it was verified"`
	RootCause string `json:"root_cause,omitempty" jsonschema:"the root cause of the crash, in one or two sentences"`
}

// finishTool is finish as the model sees it in mode m.
func finishTool(m Mode) llm.Tool {
	s, err := jsonschema.For[finishArgs](nil)
	if err != nil {
		panic(err) // a fixed type: a bug
	}
	if m == ModeDebug {
		s.Properties["summary"].Description = "what was fixed and how it was verified"
		s.Required = []string{"summary", "root_cause"}
	} else {
		delete(s.Properties, "root_cause")
	}
	b, err := s.MarshalJSON()
	if err != nil {
		panic(err)
	}
	return llm.Tool{Name: ToolFinish, Description: "Call when the task is complete and verified by running the code. Give a short summary.", Parameters: b}
}

// toolDefs are the tools the model may call.
func (r *run) toolDefs() []llm.Tool {
	return append(r.tools.ToLLM(), finishTool(r.opts.Mode))
}

// outcome is what a tool call produced.
type outcome struct {
	Text    string
	IsError bool
	Images  []llm.Image
	Exec    *kernel.Result // for execute_python and run_shell
	// finish: the arguments of an accepted finish call
	Finish *finishArgs
	// changed lists files written or edited.
	Changed []string
	// Declined: the user said no; nothing ran, so nothing failed.
	Declined bool
}

// ArgumentError is a tool call or option that does not fit.
type ArgumentError struct {
	Name string // the tool, option or field that is wrong
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// runTool runs one call: finish here, the rest through the shared tools,
// then the agent's own bookkeeping of executions (the finish rule's state,
// a dead kernel restarted, lessons).
func (r *run) runTool(ctx context.Context, call llm.ToolCall) outcome {
	if call.Name == ToolFinish {
		var a finishArgs
		if err := tools.DecodeArgs(call.Arguments, &a); err != nil {
			return errOutcome(&ArgumentError{call.Name, err})
		}
		return r.finish(ctx, a)
	}
	if !r.tools.Has(call.Name) {
		names := append(slices.Clone(r.tools.Names()), ToolFinish)
		return errOutcome(&ArgumentError{call.Name, fmt.Errorf("there is no tool %q; the tools are %s and %s", call.Name, strings.Join(names[:len(names)-1], ", "), ToolFinish)})
	}
	res, err := r.tools.Call(ctx, toolSession{r}, call.Name, call.Arguments, func(e kernel.Event) {
		r.emit(Event{Type: EventOutput, Exec: &e, ToolCallID: call.ID})
	})
	if err != nil {
		if ctx.Err() != nil {
			return outcome{Text: "cancelled", IsError: true}
		}
		if ae := (*tools.ArgumentError)(nil); errors.As(err, &ae) {
			return errOutcome(&ArgumentError{call.Name, err})
		}
		return errOutcome(err)
	}
	o := outcome{Text: res.Text, IsError: res.IsError, Images: res.LLMImages(), Exec: res.Exec, Changed: res.Changed, Declined: res.Declined}
	if res.Exec == nil {
		return o
	}
	r.executed, r.ranOK = true, res.Exec.Status == kernel.StatusOK
	if res.Exec.Status == kernel.StatusKilled {
		_ = r.opts.Session.Restart(ctx)
	}
	if call.Name == ToolRunShell {
		o.Text = "$ " + res.Source + "\n" + o.Text
	}
	return r.seeExecution(ctx, call, res.Source, o)
}

func errOutcome(err error) outcome { return outcome{Text: "error: " + err.Error(), IsError: true} }

// toolSession is the run's session as the shared tools use it.
type toolSession struct{ r *run }

// Execute runs a cell; a kernel that died before it is restarted, and the
// model is told to run the code again.
func (s toolSession) Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error) {
	sess := s.r.opts.Session
	res, err := sess.Execute(ctx, req, onEvent)
	if err == nil || ctx.Err() != nil {
		return res, err
	}
	if rerr := sess.Restart(ctx); rerr != nil {
		return nil, fmt.Errorf("the Python session could not run the code (%v) and could not be restarted (%v)", err, rerr)
	}
	s.r.executed, s.r.ranOK = true, false
	return nil, fmt.Errorf("the Python session had died (%v); it was restarted with empty state (files are kept). Run the code again", err)
}

// Files is the run's workspace, which the run keeps open.
func (s toolSession) Files(context.Context) (tools.Files, error) { return keptOpen{s.r.ws}, nil }

type keptOpen struct{ *workspace.Workspace }

func (keptOpen) Close() error { return nil }

// kernelCall runs harness code in the session and decodes the JSON object
// it prints.
func (r *run) kernelCall(ctx context.Context, code string, v any) error {
	return tools.KernelCall(ctx, r.opts.Session, code, r.opts.ExecTimeout, v)
}

// allowlist is the sandbox's allowlist: Options.Allow, or the session's own.
func (r *run) allowlist() []string {
	if len(r.opts.Allow) > 0 {
		return r.opts.Allow
	}
	if nl, ok := r.opts.Session.(networkLogger); ok {
		if l := nl.NetworkLog(); l != nil {
			return l.Allow
		}
	}
	return nil
}
