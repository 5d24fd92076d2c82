// Package tools defines the model-facing tools (execute_python, run_shell,
// the file and process tools) once, for both faces: the agent loop (ToLLM,
// Call) and the MCP server (AddToMCP).
package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/workspace"
)

// The tools' names, as the models see them.
const (
	ExecutePython   = "execute_python"
	RunShell        = "run_shell"
	WriteFile       = "write_file"
	ReadFile        = "read_file"
	EditFile        = "edit_file"
	ListFiles       = "list_files"
	StartProcess    = "start_process"
	ProcessOutput   = "process_output"
	StopProcess     = "stop_process"
	InstallPackages = "install_packages"
	ResetSession    = "reset_session"
	CheckpointName  = "checkpoint"
	Undo            = "undo"
	ForkSession     = "fork_session"
)

// Executor runs cells: the part of a Session that KernelCall needs.
type Executor interface {
	// Execute runs one cell. A failing program is a Result, not an error.
	Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error)
}

// Session is the sandbox session a tool call runs in: what the tools call.
type Session interface {
	Executor
	// Files opens the session's /workspace for one call; the tool closes it.
	Files(ctx context.Context) (Files, error)
}

// Files is the workspace as the file tools use it (*workspace.Workspace).
type Files interface {
	Write(path string, r io.Reader) (int64, error)
	ReadFile(path string, max int64) ([]byte, error)
	List(dir string) ([]workspace.Entry, error)
	Close() error
}

// Resetter is a Session that reset_session can restart (and empty).
type Resetter interface {
	Reset(ctx context.Context, clearFiles bool) (string, error)
}

// Noter is a Session with something to tell the model besides a call's
// result, such as "the kernel had died and was restarted". The MCP face puts
// it before the result's text.
type Noter interface {
	Note() string
}

// Config configures a Set. The zero value is ready to use.
type Config struct {
	// DefaultTimeout bounds an execution whose call gives no timeout_s.
	// If zero, 30 seconds.
	DefaultTimeout time.Duration
	// MaxTimeout is the largest timeout_s a call may ask for. If zero, 10
	// minutes.
	MaxTimeout time.Duration
	// MaxCodeBytes caps execute_python's code. If zero, 1 MiB.
	MaxCodeBytes int
	// MaxTextBytes caps each of stdout, stderr, results and the traceback
	// in the text a tool returns (their middle is cut). If zero, 16 KiB.
	MaxTextBytes int
	// MaxFileBytes caps a file read_file or edit_file reads. If zero, 4 MiB.
	MaxFileBytes int64
	// NumberLines makes read_file number the lines it shows, as an agent
	// that edits with edit_file wants. Without it a whole file comes back
	// as it is, unless the call pages with offset or limit.
	NumberLines bool
	// Network says sandboxed code can reach the network; Allow is the
	// allowlist in allow mode (through sandloop's proxy). Descriptions,
	// hints and install_packages follow them.
	Network bool
	Allow   []string
	// PackageIndex (a URL) and WheelDir (a path inside the sandbox) are
	// package sources for install_packages.
	PackageIndex, WheelDir string
	// Confirm, if set, is asked before code or a command runs; false
	// declines the call.
	Confirm func(ctx context.Context, tool, src string) bool
}

func (c Config) withDefaults() Config {
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = 30 * time.Second
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = 10 * time.Minute
	}
	c.DefaultTimeout = min(c.DefaultTimeout, c.MaxTimeout)
	if c.MaxCodeBytes <= 0 {
		c.MaxCodeBytes = 1 << 20
	}
	if c.MaxTextBytes <= 0 {
		c.MaxTextBytes = 16 << 10
	}
	if c.MaxFileBytes <= 0 {
		c.MaxFileBytes = 4 << 20
	}
	return c
}

// ArgumentError is a call whose arguments do not fit the tool: it says
// what to fix.
type ArgumentError struct {
	Name string // the argument, or "" for the arguments as a whole
	Err  error
}

func (e *ArgumentError) Error() string { return e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

func argErr(name, format string, a ...any) error {
	return &ArgumentError{name, fmt.Errorf(format, a...)}
}

// Image is an image a result carries.
type Image struct {
	MIMEType string
	Data     []byte
}

// Result is what a tool call produced, for either face.
type Result struct {
	Text    string
	IsError bool
	Images  []Image
	// Structured is MCP's structuredContent (nil for none).
	Structured any
	// Exec is the execution of execute_python and run_shell; Source is
	// the code or command it ran.
	Exec   *kernel.Result
	Source string
	// Changed lists the files written or edited.
	Changed []string
	// Declined: Config.Confirm said no; nothing ran, so nothing failed.
	Declined bool
}

func textResult(text string) *Result { return &Result{Text: text} }

// call is one tool call's context.
type call struct {
	cfg     *Config
	sess    Session
	onEvent kernel.EventFunc
}

// timeout turns timeout_s into a duration, within the limits.
func (c *call) timeout(ts *float64) (time.Duration, error) {
	if ts == nil {
		return c.cfg.DefaultTimeout, nil
	}
	max := c.cfg.MaxTimeout.Seconds()
	if math.IsNaN(*ts) || *ts <= 0 || *ts > max {
		return 0, argErr("timeout_s", "timeout_s must be more than 0 and at most %g (seconds), not %g", max, *ts)
	}
	return time.Duration(*ts * float64(time.Second)), nil
}

// confirm asks Config.Confirm, if set, whether src may run.
func (c *call) confirm(ctx context.Context, tool, src string) bool {
	return c.cfg.Confirm == nil || c.cfg.Confirm(ctx, tool, src)
}

func declined(what string) *Result {
	return &Result{Text: "the user declined to " + what + "; ask or try something else", IsError: true, Declined: true}
}

// Tool is one model-facing tool.
type Tool struct {
	Name         string
	Description  string
	InputSchema  *jsonschema.Schema
	OutputSchema *jsonschema.Schema // nil: no structured output
	Annotations  *mcp.ToolAnnotations

	resolved *jsonschema.Resolved
	run      func(ctx context.Context, c *call, args json.RawMessage) (*Result, error)
	addMCP   func(srv *mcp.Server, t *mcp.Tool, open MCPSessionFunc)
}

// spec is what one tool file declares.
type spec struct {
	name        string
	description string // a text/template over Config and the offered tools
	annotations func(cfg *Config) *mcp.ToolAnnotations
	schema      func(cfg *Config, s *jsonschema.Schema) // refines the input schema (ranges)
	output      *jsonschema.Schema
}

// define makes a tool whose arguments are In.
func define[In any](sp spec, h func(ctx context.Context, c *call, in In) (*Result, error)) func(cfg *Config) *Tool {
	return func(cfg *Config) *Tool {
		s, err := jsonschema.For[In](nil)
		if err != nil {
			panic(fmt.Sprintf("tool %s: %v", sp.name, err)) // the input types are fixed: a bug
		}
		if sp.schema != nil {
			sp.schema(cfg, s)
		}
		resolved, err := s.Resolve(nil)
		if err != nil {
			panic(fmt.Sprintf("tool %s: %v", sp.name, err))
		}
		t := &Tool{Name: sp.name, Description: sp.description, InputSchema: s, OutputSchema: sp.output, resolved: resolved}
		if sp.annotations != nil {
			t.Annotations = sp.annotations(cfg)
		}
		t.run = func(ctx context.Context, c *call, args json.RawMessage) (*Result, error) {
			var in In
			if err := decode(args, resolved, &in); err != nil {
				return nil, err
			}
			return h(ctx, c, in)
		}
		t.addMCP = func(srv *mcp.Server, mt *mcp.Tool, open MCPSessionFunc) {
			mcp.AddTool(srv, mt, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
				sess, onEvent, err := open(ctx, req)
				if err != nil {
					return nil, nil, err
				}
				res, err := h(ctx, &call{cfg: cfg, sess: sess, onEvent: onEvent}, in)
				if err != nil {
					return nil, nil, err
				}
				return mcpResult(sess, res)
			})
		}
		return t
	}
}

// DecodeArgs parses a tool call's arguments (a JSON object) into v
// strictly, naming what is wrong so the model can correct itself.
func DecodeArgs(args string, v any) error { return decode(json.RawMessage(args), nil, v) }

// decode parses a call's arguments strictly, naming what is wrong so the
// model can correct itself, then checks them against the tool's schema, if
// any (required arguments, ranges), as an MCP client's call is checked.
func decode(raw json.RawMessage, schema *jsonschema.Resolved, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if raw[0] != '{' || !json.Valid(raw) {
		return argErr("", "the arguments are not a valid JSON object: %.200q. Send a JSON object matching the tool's schema.", raw)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return argErr(te.Field, "argument %q must be %s", te.Field, te.Type)
		}
		return argErr("", "invalid arguments: %v", err)
	}
	if schema == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return argErr("", "invalid arguments: %v", err)
	}
	if err := schema.Validate(m); err != nil {
		return argErr("", "invalid arguments: %v", err)
	}
	return nil
}

// registry lists every tool, in the order faces show them.
var registry = []func(cfg *Config) *Tool{
	executePython, runShell, writeFile, readFile, editFile, listFiles,
	startProcess, processOutput, stopProcess, installPackages, resetSession,
	checkpointTool, undoTool, forkSession, snapshotTool,
}

// Names lists every tool this package defines.
func Names() []string {
	var cfg Config
	out := make([]string, 0, len(registry))
	for _, mk := range registry {
		out = append(out, mk(&cfg).Name)
	}
	return out
}

// Set is the tools one face offers, configured.
type Set struct {
	cfg   Config
	tools []*Tool
}

// New returns the named tools (in the order given) configured by cfg. It
// fails on an unknown name.
func New(cfg Config, names ...string) (*Set, error) {
	cfg = cfg.withDefaults()
	s := &Set{cfg: cfg}
	all := map[string]*Tool{}
	for _, mk := range registry {
		t := mk(&s.cfg)
		all[t.Name] = t
	}
	for _, n := range names {
		t := all[n]
		if t == nil {
			return nil, fmt.Errorf("unknown tool %q (the tools are %s)", n, strings.Join(Names(), ", "))
		}
		s.tools = append(s.tools, t)
	}
	data := struct {
		Config
		Network string
	}{s.cfg, networkSentence(&s.cfg)}
	funcs := template.FuncMap{"offered": func(name string) bool { return slices.Contains(names, name) }}
	for _, t := range s.tools {
		var b strings.Builder
		tmpl := template.Must(template.New(t.Name).Funcs(funcs).Parse(t.Description))
		if err := tmpl.Execute(&b, data); err != nil {
			panic(fmt.Sprintf("tool %s: description: %v", t.Name, err))
		}
		t.Description = strings.TrimSpace(b.String())
	}
	return s, nil
}

// Tools returns the set's tools.
func (s *Set) Tools() []*Tool { return s.tools }

// Names returns the names of the set's tools.
func (s *Set) Names() []string {
	out := make([]string, len(s.tools))
	for i, t := range s.tools {
		out[i] = t.Name
	}
	return out
}

// Has reports whether the set offers the named tool.
func (s *Set) Has(name string) bool { return s.tool(name) != nil }

func (s *Set) tool(name string) *Tool {
	for _, t := range s.tools {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Call runs one tool call whose arguments are JSON (as a model sends
// them). onEvent, if set, receives the live events of an execution. The
// error is bad input (*ArgumentError) or a failure of ours; a failing
// program is a Result with IsError.
func (s *Set) Call(ctx context.Context, sess Session, name, args string, onEvent kernel.EventFunc) (*Result, error) {
	t := s.tool(name)
	if t == nil {
		return nil, argErr("", "there is no tool %q; the tools are %s", name, strings.Join(s.Names(), ", "))
	}
	return t.run(ctx, &call{cfg: &s.cfg, sess: sess, onEvent: onEvent}, json.RawMessage(args))
}

func networkSentence(c *Config) string {
	switch {
	case c.Network:
		return "The sandbox can reach the network."
	case len(c.Allow) > 0:
		s := "The sandbox can reach only these hosts (through a proxy; pip and requests use it on their own): " + strings.Join(c.Allow, ", ") + "."
		if n := egress.HostNote(c.Allow); n != "" {
			s += " Note: " + n + "."
		}
		return s
	}
	return "The sandbox has no network access (only its own loopback)."
}

func boolPtr(b bool) *bool { return &b }

// sandboxHints are the annotations of a tool that runs code: code can do
// anything in the sandbox, delete files, reach the network when allowed.
func sandboxHints(title string) func(cfg *Config) *mcp.ToolAnnotations {
	return func(cfg *Config) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: title, DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(cfg.Network)}
	}
}

// timeoutRange bounds timeout_s in the schema.
func timeoutRange(cfg *Config, s *jsonschema.Schema) {
	t := s.Properties["timeout_s"]
	t.ExclusiveMinimum = jsonschema.Ptr(0.0)
	t.Maximum = jsonschema.Ptr(cfg.MaxTimeout.Seconds())
}
