package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

// ExecuteInput is execute_python's arguments.
type ExecuteInput struct {
	Code     string   `json:"code" jsonschema:"Python source to run, like a notebook cell. The value of the last expression is returned as the result. Lines starting with ! run as shell commands."`
	TimeoutS *float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit in seconds. When it passes the code is interrupted (variables are kept)."`
}

// ShellInput is run_shell's arguments.
type ShellInput struct {
	Command  string   `json:"command" jsonschema:"A /bin/sh command line (pipes, redirections, && and several lines are fine). It runs in /workspace."`
	TimeoutS *float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit in seconds. When it passes the command and everything it started are killed."`
}

// ShellOutput is run_shell's structuredContent.
type ShellOutput struct {
	// Status is ok (exit code 0), error (non-zero exit or killed by a
	// signal), timeout, interrupted or killed (the sandbox died).
	Status string `json:"status" jsonschema:"ok, error (non-zero exit), timeout, interrupted, or killed (the sandbox died)"`
	// ExitCode is the command's exit status; -N means killed by signal N.
	// Null when it did not finish.
	ExitCode   *int    `json:"exit_code" jsonschema:"exit status; -N means killed by signal N; null if the command did not finish"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated" jsonschema:"stdout or stderr exceeded the capture limit and its middle was dropped"`
	DurationMS float64 `json:"duration_ms"`
}

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

// ReadInput is read_file's arguments.
type ReadInput struct {
	Path string `json:"path" jsonschema:"File path relative to /workspace (or absolute under /workspace)."`
}

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

// ResetInput is reset_session's arguments.
type ResetInput struct {
	ClearFiles bool `json:"clear_files,omitempty" jsonschema:"Also delete every file in /workspace. Default false: files are kept."`
}

func boolPtr(b bool) *bool { return &b }

// inputSchema derives T's schema and lets edit refine it (ranges).
func inputSchema[T any](edit func(*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(err) // the input types above are fixed: a failure is a bug
	}
	if edit != nil {
		edit(s)
	}
	return s
}

func (s *Server) addTools() {
	o := s.opts
	maxT := o.MaxTimeout.Seconds()
	timeoutRange := func(sc *jsonschema.Schema) {
		t := sc.Properties["timeout_s"]
		t.ExclusiveMinimum = jsonschema.Ptr(0.0)
		t.Maximum = jsonschema.Ptr(maxT)
	}
	network := "The sandbox has no network access (only its own loopback)."
	switch {
	case o.Network:
		network = "The sandbox can reach the network."
	case len(o.Allow) > 0:
		network = "The sandbox can reach only these hosts (through a proxy; pip and requests use it on their own): " + strings.Join(o.Allow, ", ") + "."
	}
	// Code can do anything in the sandbox: delete files, reach the network
	// when allowed.
	sandboxHints := func(title string) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: title, DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(o.Network)}
	}
	enabled := func(name string) bool { return slices.Contains(o.Tools, name) }

	if enabled(ToolExecutePython) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name: ToolExecutePython,
			Description: fmt.Sprintf(`Run Python 3 code in a sandboxed, stateful kernel, like a Jupyter notebook cell. Variables, imports and functions persist between calls of this connection until reset_session. The working directory is /workspace, shared with the file tools and run_shell.

Returns the status, stdout and stderr, the value of the last expression, and the error with its traceback; a Python exception is reported as a tool error so you can fix the code and call again. Matplotlib figures come back as PNG images without saving them; pandas DataFrames as text. numpy, pandas, matplotlib and the standard library are available when installed on the host. %s

Timeout: %s by default, timeout_s up to %s; a timed-out cell is interrupted and the kernel keeps its state. Code is limited to %d bytes: put large data in files with write_file.`,
				network, o.DefaultTimeout, o.MaxTimeout, o.MaxCodeBytes),
			InputSchema: inputSchema[ExecuteInput](timeoutRange),
			Annotations: sandboxHints("Run Python"),
		}, s.executePython)
	}
	if enabled(ToolRunShell) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name: ToolRunShell,
			Description: fmt.Sprintf(`Run a shell command (/bin/sh) in the same sandbox and /workspace as execute_python, e.g. "ls -la", "python3 script.py", "pytest -q". Returns the exit code, stdout and stderr; a non-zero exit is reported as a tool error. Nothing is read from stdin. %s Timeout: %s by default, timeout_s up to %s. The command is limited to %d bytes.`,
				network, o.DefaultTimeout, o.MaxTimeout, maxCommandBytes),
			InputSchema: inputSchema[ShellInput](timeoutRange),
			Annotations: sandboxHints("Run a shell command"),
		}, s.runShell)
	}
	if enabled(ToolWriteFile) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name: ToolWriteFile,
			Description: fmt.Sprintf(`Create or replace a text file in the sandbox's /workspace, creating parent directories. The code run by execute_python and run_shell sees it at once (the working directory is /workspace). Files are limited to %d bytes.`,
				o.MaxFileBytes),
			InputSchema: inputSchema[WriteInput](nil),
			Annotations: &mcp.ToolAnnotations{Title: "Write a file", DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, s.writeFile)
	}
	if enabled(ToolReadFile) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name: ToolReadFile,
			Description: fmt.Sprintf(`Read a file from the sandbox's /workspace, for example one written by code. Text comes back as text, PNG/JPEG/GIF/WebP files as images; other binary files are described, not shown. Files over %d bytes are refused: read parts of them with execute_python.`,
				o.MaxFileBytes),
			InputSchema: inputSchema[ReadInput](nil),
			Annotations: &mcp.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, s.readFile)
	}
	if enabled(ToolListFiles) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name:        ToolListFiles,
			Description: `List a directory of the sandbox's /workspace (default: /workspace itself): names, types and sizes, one level deep.`,
			InputSchema: inputSchema[ListInput](nil),
			Annotations: &mcp.ToolAnnotations{Title: "List files", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, s.listFiles)
	}
	if enabled(ToolResetSession) {
		mcp.AddTool(s.mcp, &mcp.Tool{
			Name:        ToolResetSession,
			Description: `Restart the Python kernel: every variable, import and running process is gone; files in /workspace are kept unless clear_files is true, which deletes them all. Use it when the state is broken or after the sandbox was killed (out of memory).`,
			InputSchema: inputSchema[ResetInput](nil),
			Annotations: &mcp.ToolAnnotations{Title: "Reset the session", DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
		}, s.resetSession)
	}
}

// timeout turns timeout_s into a duration, within the limits.
func (s *Server) timeout(ts *float64) (time.Duration, error) {
	if ts == nil {
		return s.opts.DefaultTimeout, nil
	}
	max := s.opts.MaxTimeout.Seconds()
	if math.IsNaN(*ts) || *ts <= 0 || *ts > max {
		return 0, fmt.Errorf("timeout_s must be more than 0 and at most %g (seconds), not %g", max, *ts)
	}
	return time.Duration(*ts * float64(time.Second)), nil
}

// execute runs code in the connection's session. It restarts a kernel that
// died and replaces a session that was closed under it (by an idle reaper),
// saying so in the returned note.
func (s *Server) execute(ctx context.Context, req *mcp.CallToolRequest, code string, timeout time.Duration) (*kernel.Result, string, error) {
	sess, err := s.session(ctx, req.Session)
	if err != nil {
		return nil, "", err
	}
	kreq := kernel.Request{Code: code, Timeout: timeout}
	onEvent := s.progress(ctx, req)
	res, err := sess.Execute(ctx, kreq, onEvent)
	var note string
	switch {
	case errors.Is(err, session.ErrRestartRequired):
		note = fmt.Sprintf("note: the previous kernel had died (%v); a fresh one was started for this call: Python variables are gone, files are kept", err)
		if err := sess.Restart(ctx); err != nil {
			return nil, "", fmt.Errorf("restart the sandbox session: %w", err)
		}
		res, err = sess.Execute(ctx, kreq, onEvent)
	case errors.Is(err, session.ErrClosed):
		note = "note: the previous sandbox session had been closed; a new one was started for this call: Python variables and files are gone"
		s.replace(req.Session, sess)
		sess, err = s.session(ctx, req.Session)
		if err != nil {
			return nil, "", err
		}
		res, err = sess.Execute(ctx, kreq, onEvent)
	}
	if err != nil {
		return nil, "", fmt.Errorf("execute: %w", err)
	}
	return res, note, nil
}

// progress returns an event func that reports output as progress
// notifications when the client asked for them (a progress token), at
// most twice a second, so a client can show it and keep a long call alive.
func (s *Server) progress(ctx context.Context, req *mcp.CallToolRequest) kernel.EventFunc {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	var n float64
	var last time.Time
	return func(ev kernel.Event) {
		if ev.Type != kernel.EventStdout && ev.Type != kernel.EventStderr {
			return
		}
		if now := time.Now(); now.Sub(last) >= 500*time.Millisecond {
			last = now
			n++
			msg := lastLine(ev.Text)
			if len(msg) > 200 {
				msg = cutUTF8(msg, 200) + "…"
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg}); err != nil {
				s.log.Debug("progress notification", "err", err)
			}
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func (s *Server) executePython(ctx context.Context, req *mcp.CallToolRequest, in ExecuteInput) (*mcp.CallToolResult, *kernel.Result, error) {
	if len(in.Code) > s.opts.MaxCodeBytes {
		return nil, nil, fmt.Errorf("code is %d bytes, more than the limit of %d bytes: put large data in a file with write_file, or generate it in code", len(in.Code), s.opts.MaxCodeBytes)
	}
	timeout, err := s.timeout(in.TimeoutS)
	if err != nil {
		return nil, nil, err
	}
	res, note, err := s.execute(ctx, req, in.Code, timeout)
	if err != nil {
		return nil, nil, err
	}
	out := &mcp.CallToolResult{IsError: res.Status != kernel.StatusOK}
	text := renderExecution(res, timeout, s.opts.MaxTextBytes)
	if note != "" {
		text = note + "\n" + text
	}
	out.Content = append(out.Content, &mcp.TextContent{Text: text})
	for _, img := range images(res) {
		out.Content = append(out.Content, img)
	}
	return out, withoutImages(res), nil
}

// withoutImages is res for structuredContent: images travel once, as image
// content, not a second time as base64 inside the structured result.
func withoutImages(res *kernel.Result) *kernel.Result {
	out := *res
	out.Results = make([]kernel.Output, 0, len(res.Results))
	for _, o := range res.Results {
		if _, ok := o.Data["image/png"]; ok {
			d := make(map[string]string, len(o.Data))
			for k, v := range o.Data {
				if k != "image/png" {
					d[k] = v
				}
			}
			o.Data = d
		}
		out.Results = append(out.Results, o)
	}
	return &out
}

// runShell runs the command with the kernel's documented "!" lines. The
// command goes base64-encoded, so quotes, newlines and any other byte
// reach /bin/sh exactly as given.
func (s *Server) runShell(ctx context.Context, req *mcp.CallToolRequest, in ShellInput) (*mcp.CallToolResult, *ShellOutput, error) {
	if len(in.Command) > maxCommandBytes {
		return nil, nil, fmt.Errorf("command is %d bytes, more than the limit of %d bytes: write a script with write_file and run it", len(in.Command), maxCommandBytes)
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, nil, errors.New("command is empty")
	}
	if strings.ContainsRune(in.Command, 0) {
		return nil, nil, errors.New("command contains a NUL byte")
	}
	timeout, err := s.timeout(in.TimeoutS)
	if err != nil {
		return nil, nil, err
	}
	code := fmt.Sprintf(`!sh -c "$(echo %s | base64 -d)"`, base64.StdEncoding.EncodeToString([]byte(in.Command)))
	res, note, err := s.execute(ctx, req, code, timeout)
	if err != nil {
		return nil, nil, err
	}
	sh := shellOutput(res)
	text := renderShell(sh, res, timeout, s.opts.MaxTextBytes)
	if note != "" {
		text = note + "\n" + text
	}
	return &mcp.CallToolResult{IsError: sh.Status != string(kernel.StatusOK), Content: []mcp.Content{&mcp.TextContent{Text: text}}}, sh, nil
}

var (
	exitStatusRE = regexp.MustCompile(`returned non-zero exit status (-?\d+)`)
	signalRE     = regexp.MustCompile(`died with <Signals\.\w+: (\d+)>`)
)

// shellOutput reads a shell command's outcome from its cell's result: the
// kernel raises CalledProcessError for a non-zero exit.
func shellOutput(res *kernel.Result) *ShellOutput {
	sh := &ShellOutput{Status: string(res.Status), Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated, DurationMS: res.DurationMS}
	switch {
	case res.Status == kernel.StatusOK:
		sh.ExitCode = new(int)
	case res.Status == kernel.StatusError && res.Error != nil && strings.HasSuffix(res.Error.Name, "CalledProcessError"):
		if m := exitStatusRE.FindStringSubmatch(res.Error.Value); m != nil {
			n, _ := strconv.Atoi(m[1])
			sh.ExitCode = &n
		} else if m := signalRE.FindStringSubmatch(res.Error.Value); m != nil {
			n, _ := strconv.Atoi(m[1])
			n = -n
			sh.ExitCode = &n
		}
	}
	return sh
}

func (s *Server) resetSession(ctx context.Context, req *mcp.CallToolRequest, in ResetInput) (*mcp.CallToolResult, any, error) {
	sess := s.existing(req.Session)
	if sess == nil {
		// Nothing ran yet: the next call starts a fresh session anyway.
		return textResult("The session is fresh: no code has run in it yet, and /workspace is empty."), nil, nil
	}
	msg := "The Python kernel was restarted: all variables and imports are gone; files in /workspace are kept."
	if err := sess.Restart(ctx); errors.Is(err, session.ErrClosed) {
		s.replace(req.Session, sess)
		return textResult("The sandbox session had already been closed; the next call starts a new one with an empty /workspace."), nil, nil
	} else if err != nil {
		return nil, nil, fmt.Errorf("restart: %w", err)
	}
	if in.ClearFiles {
		ws, err := s.workspace(sess)
		if err != nil {
			return nil, nil, err
		}
		defer ws.Close()
		if err := ws.Clear(); err != nil {
			return nil, nil, fmt.Errorf("clear /workspace: %w", err)
		}
		msg = "The Python kernel was restarted and /workspace was emptied: all variables, imports and files are gone."
	}
	return textResult(msg), nil, nil
}

func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
