package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Tool names.
const (
	ToolExecutePython = "execute_python"
	ToolRunShell      = "run_shell"
	ToolWriteFile     = "write_file"
	ToolReadFile      = "read_file"
	ToolEditFile      = "edit_file"
	ToolListFiles     = "list_files"
	ToolFinish        = "finish"
)

func schema(s string) json.RawMessage { return json.RawMessage(s) }

// toolDefs are the tools the model may call.
func toolDefs(mode Mode) []llm.Tool {
	finish := `{"type":"object","properties":{"summary":{"type":"string","description":"what was done and how it was verified"}},"required":["summary"]}`
	if mode == ModeDebug {
		finish = `{"type":"object","properties":{"summary":{"type":"string","description":"what was fixed and how it was verified"},"root_cause":{"type":"string","description":"the root cause of the crash, in one or two sentences"}},"required":["summary","root_cause"]}`
	}
	return append([]llm.Tool{
		{Name: ToolExecutePython, Description: "Run Python code in a persistent, sandboxed Jupyter-like session (variables and imports persist between calls; the working directory is /workspace). The value of the last expression is shown; matplotlib figures come back as images. Lines starting with ! run shell commands. Returns status, stdout, stderr, the result and any traceback.",
			Parameters: schema(`{"type":"object","properties":{"code":{"type":"string","description":"Python source to run"},"timeout_s":{"type":"number","description":"time limit in seconds (default 120)"}},"required":["code"]}`)},
		{Name: ToolRunShell, Description: "Run a shell command (bash) in the sandbox, in /workspace, e.g. `python3 app.py`, `pytest -q`, `ls -la`. Returns its output; a non-zero exit is an error.",
			Parameters: schema(`{"type":"object","properties":{"command":{"type":"string"},"timeout_s":{"type":"number","description":"time limit in seconds (default 120)"}},"required":["command"]}`)},
		{Name: ToolWriteFile, Description: "Create or overwrite a file in /workspace (parent directories are created).",
			Parameters: schema(`{"type":"object","properties":{"path":{"type":"string","description":"path relative to /workspace"},"content":{"type":"string"}},"required":["path","content"]}`)},
		{Name: ToolReadFile, Description: "Read a text file from /workspace, with line numbers.",
			Parameters: schema(`{"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer","description":"first line to show, from 1"},"limit":{"type":"integer","description":"number of lines to show (default 400)"}},"required":["path"]}`)},
		{Name: ToolEditFile, Description: "Replace one exact, unique occurrence of old_text with new_text in a file. Fails if old_text is not found or occurs more than once (then include more surrounding lines).",
			Parameters: schema(`{"type":"object","properties":{"path":{"type":"string"},"old_text":{"type":"string"},"new_text":{"type":"string"}},"required":["path","old_text","new_text"]}`)},
		{Name: ToolListFiles, Description: "List a directory of /workspace (default: the workspace itself) with sizes.",
			Parameters: schema(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
		{Name: ToolFinish, Description: "Call when the task is complete and verified by running the code. Give a short summary.",
			Parameters: schema(finish)},
	}, processToolDefs()...)
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

type finishArgs struct {
	Summary   string `json:"summary"`
	RootCause string `json:"root_cause"`
}

// ArgumentError is a tool call whose arguments do not fit the tool.
type ArgumentError struct {
	Tool string
	Msg  string
}

func (e *ArgumentError) Error() string { return e.Tool + ": " + e.Msg }

// decodeArgs parses a tool call's arguments strictly, naming what is wrong
// so the model can correct itself.
func decodeArgs(call llm.ToolCall, v any) error {
	raw := strings.TrimSpace(call.Arguments)
	if raw == "" {
		raw = "{}"
	}
	if !strings.HasPrefix(raw, "{") || !json.Valid([]byte(raw)) {
		return &ArgumentError{call.Name, fmt.Sprintf("the arguments are not a valid JSON object: %.200q. Send a JSON object matching the tool's schema.", call.Arguments)}
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return &ArgumentError{call.Name, fmt.Sprintf("argument %q must be %s", te.Field, te.Type)}
		}
		return &ArgumentError{call.Name, "invalid arguments: " + err.Error()}
	}
	return nil
}

func (r *run) runTool(ctx context.Context, call llm.ToolCall) outcome {
	switch call.Name {
	case ToolExecutePython:
		var a struct {
			Code     *string  `json:"code"`
			TimeoutS *float64 `json:"timeout_s"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		if a.Code == nil {
			return errOutcome(&ArgumentError{call.Name, `"code" is required`})
		}
		return r.execute(ctx, call, *a.Code, a.TimeoutS)
	case ToolRunShell:
		var a struct {
			Command  *string  `json:"command"`
			TimeoutS *float64 `json:"timeout_s"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		if a.Command == nil || strings.TrimSpace(*a.Command) == "" {
			return errOutcome(&ArgumentError{call.Name, `"command" is required`})
		}
		return r.execute(ctx, call, *a.Command, a.TimeoutS)
	case ToolWriteFile:
		var a struct {
			Path    *string `json:"path"`
			Content *string `json:"content"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		if a.Path == nil || a.Content == nil {
			return errOutcome(&ArgumentError{call.Name, `"path" and "content" are required`})
		}
		n, err := r.ws.Write(*a.Path, strings.NewReader(*a.Content))
		if err != nil {
			return errOutcome(err)
		}
		p, _ := workspace.Clean(*a.Path)
		return outcome{Text: fmt.Sprintf("wrote %s (%d bytes)", p, n), Changed: []string{p}}
	case ToolReadFile:
		var a struct {
			Path   *string `json:"path"`
			Offset int     `json:"offset"`
			Limit  int     `json:"limit"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		if a.Path == nil {
			return errOutcome(&ArgumentError{call.Name, `"path" is required`})
		}
		b, err := r.ws.ReadFile(*a.Path, 4<<20)
		if err != nil {
			return errOutcome(err)
		}
		return outcome{Text: numberLines(string(b), a.Offset, a.Limit)}
	case ToolEditFile:
		var a struct {
			Path    *string `json:"path"`
			OldText *string `json:"old_text"`
			NewText *string `json:"new_text"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		if a.Path == nil || a.OldText == nil || a.NewText == nil {
			return errOutcome(&ArgumentError{call.Name, `"path", "old_text" and "new_text" are required`})
		}
		return r.edit(*a.Path, *a.OldText, *a.NewText)
	case ToolListFiles:
		var a struct {
			Path string `json:"path"`
		}
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		list, err := r.ws.List(a.Path)
		if err != nil {
			return errOutcome(err)
		}
		var b strings.Builder
		for _, e := range list {
			switch e.Type {
			case "dir":
				fmt.Fprintf(&b, "%s/\n", e.Path)
			default:
				fmt.Fprintf(&b, "%s  %d bytes\n", e.Path, e.Size)
			}
		}
		if b.Len() == 0 {
			return outcome{Text: "(empty)"}
		}
		return outcome{Text: strings.TrimRight(b.String(), "\n")}
	case ToolStartProcess, ToolProcessOutput, ToolStopProcess:
		return r.processTool(ctx, call)
	case ToolInstallPackages:
		return r.installPackages(ctx, call)
	case ToolFinish:
		var a finishArgs
		if err := decodeArgs(call, &a); err != nil {
			return errOutcome(err)
		}
		return r.finish(ctx, a)
	}
	return errOutcome(&ArgumentError{call.Name, fmt.Sprintf("there is no tool %q; the tools are execute_python, run_shell, write_file, read_file, edit_file, list_files, start_process, process_output, stop_process, install_packages and finish", call.Name)})
}

func errOutcome(err error) outcome { return outcome{Text: "error: " + err.Error(), IsError: true} }

// shellCode runs command with bash through the kernel's shell support, so
// output streams and a non-zero exit becomes an error.
func shellCode(command string) string {
	q, _ := json.Marshal(command) // a JSON string is a valid Python string literal
	return fmt.Sprintf("__sandloop_shell__(%s)", q)
}

// execute runs src: Python code, or for run_shell a shell command.
func (r *run) execute(ctx context.Context, call llm.ToolCall, src string, timeoutS *float64) outcome {
	timeout := r.opts.ExecTimeout
	if timeoutS != nil {
		if *timeoutS <= 0 {
			return errOutcome(&ArgumentError{call.Name, "timeout_s must be above 0"})
		}
		timeout = min(time.Duration(*timeoutS*float64(time.Second)), r.opts.MaxExecTimeout)
	}
	if r.opts.Confirm != nil && !r.opts.Confirm(ctx, call.Name, src) {
		return outcome{Text: "the user declined to run this; ask or try something else", IsError: true, Declined: true}
	}
	code := src
	if call.Name == ToolRunShell {
		code = shellCode(src)
	}
	res, err := r.opts.Session.Execute(ctx, kernel.Request{Code: code, Timeout: timeout}, func(e kernel.Event) {
		ev := e
		if call.Name == ToolRunShell && ev.Type == kernel.EventError {
			x := shellError(&kernel.Exception{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback})
			ev.Name, ev.Value, ev.Traceback = x.Name, x.Value, x.Traceback
		}
		r.emit(Event{Type: EventOutput, Exec: &ev, ToolCallID: call.ID})
	})
	if err != nil {
		if ctx.Err() != nil {
			return outcome{Text: "cancelled", IsError: true}
		}
		// The kernel died before this call: restart it and say so.
		if rerr := r.opts.Session.Restart(ctx); rerr != nil {
			return errOutcome(fmt.Errorf("the Python session could not run the code (%v) and could not be restarted (%v)", err, rerr))
		}
		r.executed, r.ranOK = true, false
		return outcome{Text: "error: the Python session had died (" + err.Error() + "); it was restarted with empty state (files are kept). Run the code again.", IsError: true}
	}
	r.executed, r.ranOK = true, res.Status == kernel.StatusOK
	if call.Name == ToolRunShell {
		res = shellResult(res)
	}
	if res.Status == kernel.StatusKilled {
		_ = r.opts.Session.Restart(ctx)
	}
	text := renderResult(res, r.opts.MaxOutputBytes)
	if call.Name == ToolRunShell {
		text = "$ " + src + "\n" + text
	}
	o := outcome{Text: text, Exec: res, IsError: res.Status != kernel.StatusOK}
	for _, p := range PNGs(res) {
		o.Images = append(o.Images, llm.Image{MediaType: "image/png", Data: p})
	}
	return r.seeExecution(ctx, call, src, o)
}

func (r *run) edit(path, oldText, newText string) outcome {
	b, err := r.ws.ReadFile(path, 16<<20)
	if err != nil {
		return errOutcome(err)
	}
	s := string(b)
	if oldText == "" {
		return errOutcome(&ArgumentError{ToolEditFile, "old_text is empty: give the exact text to replace (use write_file to create a file)"})
	}
	switch n := strings.Count(s, oldText); n {
	case 0:
		return errOutcome(&ArgumentError{ToolEditFile, fmt.Sprintf("old_text was not found in %s: it must match the file exactly, whitespace and indentation included (read_file shows the current text)", path)})
	case 1:
	default:
		return errOutcome(&ArgumentError{ToolEditFile, fmt.Sprintf("old_text occurs %d times in %s: include more surrounding lines so it is unique", n, path)})
	}
	s = strings.Replace(s, oldText, newText, 1)
	if _, err := r.ws.Write(path, strings.NewReader(s)); err != nil {
		return errOutcome(err)
	}
	p, _ := workspace.Clean(path)
	return outcome{Text: "edited " + p, Changed: []string{p}}
}

// numberLines shows lines [offset, offset+limit) with their numbers.
func numberLines(s string, offset, limit int) string {
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
	var b strings.Builder
	end := min(len(lines), offset-1+limit)
	for i := offset - 1; i < end; i++ {
		fmt.Fprintf(&b, "%5d| %s", i+1, strings.TrimRight(lines[i], "\n")+"\n")
	}
	if end < len(lines) {
		fmt.Fprintf(&b, "... (%d more lines; use offset=%d)\n", len(lines)-end, end+1)
	}
	if len(lines) == 0 {
		return "(empty file)"
	}
	return strings.TrimRight(b.String(), "\n")
}

var (
	exitStatus = regexp.MustCompile(`returned non-zero exit status (\d+)`)
	diedSignal = regexp.MustCompile(`died with <Signals\.(SIG\w+): (\d+)>`)
)

// shellError turns the kernel's error for a failed shell command (a
// CalledProcessError raised from its shell helper, with a traceback through
// the helper's call) into what happened to the command: its exit status. The
// command's own stderr already says what went wrong; the helper is ours and
// is never shown.
func shellError(e *kernel.Exception) *kernel.Exception {
	if !strings.HasSuffix(e.Name, "CalledProcessError") {
		return e
	}
	out := *e
	out.Name = "CommandFailed"
	out.Traceback = ""
	switch m, s := exitStatus.FindStringSubmatch(e.Value), diedSignal.FindStringSubmatch(e.Value); {
	case m != nil:
		out.Value = "the command exited with status " + m[1]
	case s != nil:
		out.Value = fmt.Sprintf("the command was killed by signal %s (%s)", s[2], s[1])
	default:
		out.Value = "the command failed"
	}
	return &out
}

// shellResult is res with a failed command's error told by shellError.
func shellResult(res *kernel.Result) *kernel.Result {
	if res.Error == nil {
		return res
	}
	out := *res
	out.Error = shellError(res.Error)
	return &out
}
