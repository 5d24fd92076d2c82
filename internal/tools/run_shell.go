package tools

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/kernel"
)

// ShellInput is run_shell's arguments.
type ShellInput struct {
	Command  string   `json:"command" jsonschema:"A bash command line (pipes, redirections, && and several lines are fine). It runs in /workspace."`
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

// MaxCommandBytes caps run_shell's command: it travels as one argument of
// /bin/sh, and Linux refuses a single argument over 128 KiB.
const MaxCommandBytes = 64 << 10

//go:embed run_shell.md
var runShellMD string

var runShell = define(spec{
	name:        RunShell,
	description: runShellMD,
	annotations: sandboxHints("Run a shell command"),
	schema:      timeoutRange,
	output:      mustSchema[ShellOutput](),
}, func(ctx context.Context, c *call, in ShellInput) (*Result, error) {
	code, err := shellCode(in.Command)
	if err != nil {
		return nil, err
	}
	timeout, err := c.timeout(in.TimeoutS)
	if err != nil {
		return nil, err
	}
	if !c.confirm(ctx, RunShell, in.Command) {
		return declined("run this"), nil
	}
	var onEvent kernel.EventFunc
	if c.onEvent != nil {
		onEvent = func(ev kernel.Event) {
			if ev.Type == kernel.EventError {
				x := ShellError(&kernel.Exception{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback})
				ev.Name, ev.Value, ev.Traceback = x.Name, x.Value, x.Traceback
			}
			c.onEvent(ev)
		}
	}
	res, err := c.sess.Execute(ctx, kernel.Request{Code: code, Timeout: timeout}, onEvent)
	if err != nil {
		return nil, err
	}
	sh := shellOutput(res)
	return &Result{
		Text:       RenderShell(sh, res, timeout, c.cfg.MaxTextBytes),
		IsError:    sh.Status != string(kernel.StatusOK),
		Structured: sh,
		Exec:       shellResult(res),
		Source:     in.Command,
	}, nil
})

// ShellCode is the cell that runs command with bash, as run_shell does, so
// the harness's own commands run as the model's do. It fails on a command
// that cannot be run (empty, too long, a NUL byte).
func ShellCode(command string) (string, error) { return shellCode(command) }

// shellCode runs the command with bash through the kernel's shell helper
// (the one "!" lines use): output streams through the cell's stdout and
// stderr, stdin is /dev/null, a timeout or an interrupt kills the whole
// process group, and a non-zero exit raises CalledProcessError.
//
// bash, not sh: models write bash (`[[ ]]`, `set -o pipefail`, brace
// expansion, `source`), and bash is there in every jail, which shows the
// host's /usr read-only. The helper starts /bin/sh, which runs bash as a
// child and exits with its status, so a command killed by signal N
// reports 128+N as in any shell, rather than the helper's -N. The command
// travels single-quoted, so every byte but NUL reaches bash as given.
func shellCode(command string) (string, error) {
	switch {
	case strings.TrimSpace(command) == "":
		return "", argErr("command", "command is empty")
	case len(command) > MaxCommandBytes:
		return "", argErr("command", "command is %d bytes, more than the limit of %d bytes: write a script with write_file and run it", len(command), MaxCommandBytes)
	case strings.ContainsRune(command, 0):
		return "", argErr("command", "command contains a NUL byte")
	}
	sh := "bash -c " + ShellQuote(command) + "; exit $?"
	if len(sh) >= 128<<10 {
		return "", argErr("command", "command is %d bytes once quoted for the shell, more than Linux passes as one argument: write a script with write_file and run it", len(sh))
	}
	return "__sandloop_shell__(" + PyString(sh) + ")", nil
}

// ShellQuote quotes s for a POSIX shell (as is when that is safe).
func ShellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(c rune) bool {
		return !(c == '/' || c == '.' || c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// PyString is s as a Python string literal (a JSON string is one).
func PyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var (
	exitStatusRE = regexp.MustCompile(`returned non-zero exit status (-?\d+)`)
	signalRE     = regexp.MustCompile(`died with <Signals\.(SIG\w+): (\d+)>`)
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
			n, _ := strconv.Atoi(m[2])
			n = -n
			sh.ExitCode = &n
		}
	}
	return sh
}

// ShellError turns the kernel's error for a failed shell command (a
// CalledProcessError raised from its shell helper, with a traceback through
// the helper's call) into what happened to the command: its exit status.
// The command's own stderr already says what went wrong; the helper is
// ours and is never shown.
func ShellError(e *kernel.Exception) *kernel.Exception {
	if !strings.HasSuffix(e.Name, "CalledProcessError") {
		return e
	}
	out := *e
	out.Name = "CommandFailed"
	out.Traceback = ""
	switch m, s := exitStatusRE.FindStringSubmatch(e.Value), signalRE.FindStringSubmatch(e.Value); {
	case m != nil:
		out.Value = "the command exited with status " + m[1]
	case s != nil:
		out.Value = fmt.Sprintf("the command was killed by signal %s (%s)", s[2], s[1])
	default:
		out.Value = "the command failed"
	}
	return &out
}

// shellResult is res with a failed command's error told by ShellError.
func shellResult(res *kernel.Result) *kernel.Result {
	if res.Error == nil {
		return res
	}
	out := *res
	out.Error = ShellError(res.Error)
	return &out
}
