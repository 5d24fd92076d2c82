package tools

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
)

// The background processes of start_process live in the kernel's process
// table, their output in a log file each (a file, not a pipe: nothing
// waits on a reader).
const (
	processLogDir = "/tmp/.sandloop/proc"
	// processStartupSeconds is how long start_process waits for first output.
	processStartupSeconds = 1.5
	// processGraceSeconds is how long stop_process waits after SIGTERM
	// before it kills the process group, so a process that ignores SIGTERM
	// is gone within a second.
	processGraceSeconds = 0.5
)

// StartInput is start_process's arguments.
type StartInput struct {
	Name    string `json:"name" jsonschema:"a short name to refer to it, e.g. \"server\""`
	Command string `json:"command" jsonschema:"the bash command line to run in the background, in /workspace"`
}

// OutputInput is process_output's arguments.
type OutputInput struct {
	Name  string `json:"name" jsonschema:"the name given to start_process"`
	Lines int    `json:"lines,omitempty" jsonschema:"how many last lines (default 50)"`
}

// StopInput is stop_process's arguments.
type StopInput struct {
	Name string `json:"name" jsonschema:"the name given to start_process"`
}

var (
	//go:embed start_process.md
	startProcessMD string
	//go:embed process_output.md
	processOutputMD string
	//go:embed stop_process.md
	stopProcessMD string
)

var procName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,40}$`)

func checkProcName(name string) error {
	if !procName.MatchString(name) {
		return argErr("name", `"name" must be 1-40 letters, digits, "_", "." or "-"`)
	}
	return nil
}

// procHelpers defines the process table in the kernel.
const procHelpers = `
import os as _o, subprocess as _sp, signal as _sig, json as _j, time as _t
_P = globals().setdefault("__sandloop_procs__", {})
def __sandloop_tail__(name, n):
    p = _P[name]
    with open(p["log"], "rb") as f:
        data = f.read()[-65536:].decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-n:])
`

// procState is what the process tools' code prints.
type procState struct {
	Error   string `json:"error"`
	Pid     int    `json:"pid"`
	Running bool   `json:"running"`
	Code    *int   `json:"code"`
	Output  string `json:"output"`
	Killed  bool   `json:"killed"`
}

var startProcess = define(spec{
	name:        StartProcess,
	description: startProcessMD,
	annotations: sandboxHints("Start a background process"),
}, func(ctx context.Context, c *call, in StartInput) (*Result, error) {
	if err := checkProcName(in.Name); err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, argErr("command", `"command" is required`)
	}
	if !c.confirm(ctx, StartProcess, in.Command) {
		return declined("start this"), nil
	}
	code := procHelpers + fmt.Sprintf(`
name, cmd = %s, %s
old = _P.get(name)
if old and old["p"].poll() is None:
    print(_j.dumps({"error": "a process named %%s is already running (pid %%d); stop it first or pick another name" %% (name, old["p"].pid)}))
else:
    _o.makedirs(%s, exist_ok=True)
    log = %s + "/" + name + ".log"
    p = _sp.Popen(["bash", "-c", cmd], stdin=_sp.DEVNULL, stdout=open(log, "wb"), stderr=_sp.STDOUT, start_new_session=True, env=dict(_o.environ, PYTHONUNBUFFERED="1"))
    _P[name] = {"p": p, "log": log, "cmd": cmd}
    _t.sleep(%g)
    print(_j.dumps({"pid": p.pid, "running": p.poll() is None, "code": p.returncode, "output": __sandloop_tail__(name, 40)}))
`, PyString(in.Name), PyString(in.Command), PyString(processLogDir), PyString(processLogDir), processStartupSeconds)
	st, err := procCall(ctx, c, code)
	if err != nil {
		return nil, err
	}
	if st.Error != "" {
		return &Result{Text: "error: " + st.Error, IsError: true}, nil
	}
	res := procResult(c, in.Name, st, describeState(in.Name, st))
	res.IsError = !st.Running && (st.Code == nil || *st.Code != 0)
	return res, nil
})

var processOutput = define(spec{
	name:        ProcessOutput,
	description: processOutputMD,
	annotations: fileHints("Show a background process's output", true, false),
}, func(ctx context.Context, c *call, in OutputInput) (*Result, error) {
	if err := checkProcName(in.Name); err != nil {
		return nil, err
	}
	if in.Lines <= 0 {
		in.Lines = 50
	}
	code := procHelpers + fmt.Sprintf(`
name = %s
if name not in _P:
    print(_j.dumps({"error": "no process named %%s; running: %%s" %% (name, ", ".join(_P) or "none")}))
else:
    p = _P[name]["p"]
    print(_j.dumps({"pid": p.pid, "running": p.poll() is None, "code": p.returncode, "output": __sandloop_tail__(name, %d)}))
`, PyString(in.Name), in.Lines)
	st, err := procCall(ctx, c, code)
	if err != nil {
		return nil, err
	}
	if st.Error != "" {
		return &Result{Text: "error: " + st.Error, IsError: true}, nil
	}
	return procResult(c, in.Name, st, describeState(in.Name, st)), nil
})

var stopProcess = define(spec{
	name:        StopProcess,
	description: stopProcessMD,
	annotations: sandboxHints("Stop a background process"),
}, func(ctx context.Context, c *call, in StopInput) (*Result, error) {
	if err := checkProcName(in.Name); err != nil {
		return nil, err
	}
	// SIGTERM to the process group, SIGKILL after the grace period; the
	// waits are bounded, so a process that ignores signals or a child
	// stuck in the kernel cannot hold the call up.
	code := procHelpers + fmt.Sprintf(`
name = %s
if name not in _P:
    print(_j.dumps({"error": "no process named %%s" %% name}))
else:
    p, killed = _P.pop(name)["p"], False
    if p.poll() is None:
        try: _o.killpg(p.pid, _sig.SIGTERM)
        except OSError: pass
        try:
            p.wait(timeout=%g)
        except _sp.TimeoutExpired:
            killed = True
        try: _o.killpg(p.pid, _sig.SIGKILL)
        except OSError: pass
        try: p.wait(timeout=0.4)
        except _sp.TimeoutExpired: pass
    print(_j.dumps({"pid": p.pid, "running": p.poll() is None, "code": p.returncode, "output": "", "killed": killed}))
`, PyString(in.Name), processGraceSeconds)
	st, err := procCall(ctx, c, code)
	if err != nil {
		return nil, err
	}
	if st.Error != "" {
		return &Result{Text: "error: " + st.Error, IsError: true}, nil
	}
	text := fmt.Sprintf("process %q stopped", in.Name)
	switch {
	case st.Running:
		text = fmt.Sprintf("process %q (pid %d) was sent SIGKILL but has not exited yet", in.Name, st.Pid)
	case st.Killed:
		text += fmt.Sprintf(" (it ignored SIGTERM for %gs and was killed)", processGraceSeconds)
	}
	return &Result{Text: text, IsError: st.Running}, nil
})

func describeState(name string, st *procState) string {
	state := "running"
	if !st.Running {
		state = "exited"
		if st.Code != nil {
			state = fmt.Sprintf("exited with code %d", *st.Code)
		}
	}
	return fmt.Sprintf("process %q (pid %d): %s", name, st.Pid, state)
}

func procResult(c *call, name string, st *procState, text string) *Result {
	if st.Output != "" {
		text += "\n--- output ---\n" + CutMiddle(st.Output, c.cfg.MaxTextBytes)
	}
	return &Result{Text: text}
}

// procCall runs a process tool's code, which prints one JSON object.
func procCall(ctx context.Context, c *call, code string) (*procState, error) {
	var st procState
	if err := KernelCall(ctx, c.sess, code, c.cfg.DefaultTimeout, &st); err != nil {
		return nil, fmt.Errorf("the process tool failed in the sandbox: %w", err)
	}
	return &st, nil
}

// KernelCall runs harness code in the session and decodes the last line
// of its stdout, one JSON object, into v.
func KernelCall(ctx context.Context, sess Executor, code string, timeout time.Duration, v any) error {
	res, err := sess.Execute(ctx, kernel.Request{Code: code, Timeout: timeout}, nil)
	if err != nil {
		return err
	}
	if res.Status != kernel.StatusOK {
		msg := res.Stderr
		if res.Error != nil {
			msg += res.Error.Name + ": " + res.Error.Value
		}
		return fmt.Errorf("%s", strings.TrimSpace(msg))
	}
	out := strings.TrimSpace(res.Stdout)
	if i := strings.LastIndex(out, "\n"); i >= 0 {
		out = out[i+1:]
	}
	return json.Unmarshal([]byte(out), v)
}
