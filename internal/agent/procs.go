package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
)

// Tools for long-running processes (a web server under test) and packages.
const (
	ToolStartProcess      = "start_process"
	ToolProcessOutput     = "process_output"
	ToolStopProcess       = "stop_process"
	ToolInstallPackages   = "install_packages"
	processLogDir         = "/tmp/.sandloop/proc"
	processStartupSeconds = 1.5
)

func processToolDefs() []llm.Tool {
	return []llm.Tool{
		{Name: ToolStartProcess, Description: "Start a long-running command in the background in the sandbox (e.g. `python3 app.py` for a web server), then check it with HTTP requests from execute_python (the sandbox's loopback works: http://127.0.0.1:PORT). Returns its first output after a short wait.",
			Parameters: schema(`{"type":"object","properties":{"name":{"type":"string","description":"a short name to refer to it, e.g. \"server\""},"command":{"type":"string"}},"required":["name","command"]}`)},
		{Name: ToolProcessOutput, Description: "Show a background process's recent output and whether it is still running.",
			Parameters: schema(`{"type":"object","properties":{"name":{"type":"string"},"lines":{"type":"integer","description":"how many last lines (default 50)"}},"required":["name"]}`)},
		{Name: ToolStopProcess, Description: "Stop a background process (and its children).",
			Parameters: schema(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`)},
		{Name: ToolInstallPackages, Description: "Make Python packages available. Reports which are already installed; installs the others with pip if the sandbox's network policy or a configured package source allows it, and says clearly when it cannot.",
			Parameters: schema(`{"type":"object","properties":{"names":{"type":"array","items":{"type":"string"},"description":"distribution names, e.g. [\"flask\", \"requests\"]"}},"required":["names"]}`)},
	}
}

var procName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,40}$`)

// pyString is a Python string literal (a JSON string is one).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// kernelCall runs harness code in the session and returns its stdout; the
// code prints one JSON object.
func (r *run) kernelCall(ctx context.Context, code string, v any) error {
	res, err := r.opts.Session.Execute(ctx, kernel.Request{Code: code, Timeout: r.opts.ExecTimeout}, nil)
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

// procHelpers defines the harness's process table in the kernel once.
const procHelpers = `
import os as _o, subprocess as _sp, signal as _sig, json as _j, time as _t
_P = globals().setdefault("__sandloop_procs__", {})
def __sandloop_tail__(name, n):
    p = _P[name]
    with open(p["log"], "rb") as f:
        data = f.read()[-65536:].decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-n:])
`

func (r *run) processTool(ctx context.Context, call llm.ToolCall) outcome {
	var a struct {
		Name    string `json:"name"`
		Command string `json:"command"`
		Lines   int    `json:"lines"`
	}
	if err := decodeArgs(call, &a); err != nil {
		return errOutcome(err)
	}
	if !procName.MatchString(a.Name) {
		return errOutcome(&ArgumentError{call.Name, `"name" must be 1-40 letters, digits, "_", "." or "-"`})
	}
	if a.Lines <= 0 {
		a.Lines = 50
	}
	var code string
	switch call.Name {
	case ToolStartProcess:
		if strings.TrimSpace(a.Command) == "" {
			return errOutcome(&ArgumentError{call.Name, `"command" is required`})
		}
		if r.opts.Confirm != nil && !r.opts.Confirm(ctx, call.Name, a.Command) {
			return outcome{Text: "the user declined to start this", IsError: true, Declined: true}
		}
		code = procHelpers + fmt.Sprintf(`
name, cmd = %s, %s
old = _P.get(name)
if old and old["p"].poll() is None:
    print(_j.dumps({"error": "a process named %%s is already running (pid %%d); stop it first or pick another name" %% (name, old["p"].pid)}))
else:
    _o.makedirs(%s, exist_ok=True)
    log = %s + "/" + name + ".log"
    p = _sp.Popen(cmd, shell=True, stdin=_sp.DEVNULL, stdout=open(log, "wb"), stderr=_sp.STDOUT, start_new_session=True, env=dict(_o.environ, PYTHONUNBUFFERED="1"))
    _P[name] = {"p": p, "log": log, "cmd": cmd}
    _t.sleep(%g)
    print(_j.dumps({"pid": p.pid, "running": p.poll() is None, "code": p.returncode, "output": __sandloop_tail__(name, 40)}))
`, pyString(a.Name), pyString(a.Command), pyString(processLogDir), pyString(processLogDir), processStartupSeconds)
	case ToolProcessOutput:
		code = procHelpers + fmt.Sprintf(`
name = %s
if name not in _P:
    print(_j.dumps({"error": "no process named %%s; running: %%s" %% (name, ", ".join(_P) or "none")}))
else:
    p = _P[name]["p"]
    print(_j.dumps({"pid": p.pid, "running": p.poll() is None, "code": p.returncode, "output": __sandloop_tail__(name, %d)}))
`, pyString(a.Name), a.Lines)
	case ToolStopProcess:
		code = procHelpers + fmt.Sprintf(`
name = %s
if name not in _P:
    print(_j.dumps({"error": "no process named %%s" %% name}))
else:
    p = _P.pop(name)["p"]
    if p.poll() is None:
        try:
            _o.killpg(p.pid, _sig.SIGTERM)
            p.wait(timeout=5)
        except Exception:
            try: _o.killpg(p.pid, _sig.SIGKILL)
            except OSError: pass
            p.wait()
    print(_j.dumps({"pid": p.pid, "running": False, "code": p.returncode, "output": ""}))
`, pyString(a.Name))
	}
	var st struct {
		Error   string `json:"error"`
		Pid     int    `json:"pid"`
		Running bool   `json:"running"`
		Code    *int   `json:"code"`
		Output  string `json:"output"`
	}
	if err := r.kernelCall(ctx, code, &st); err != nil {
		return errOutcome(fmt.Errorf("%s failed in the sandbox: %v", call.Name, err))
	}
	if st.Error != "" {
		return outcome{Text: "error: " + st.Error, IsError: true}
	}
	state := "running"
	if !st.Running {
		state = "exited"
		if st.Code != nil {
			state = fmt.Sprintf("exited with code %d", *st.Code)
		}
	}
	text := fmt.Sprintf("process %q (pid %d): %s", a.Name, st.Pid, state)
	if call.Name == ToolStopProcess {
		text = fmt.Sprintf("process %q stopped", a.Name)
	}
	if st.Output != "" {
		text += "\n--- output ---\n" + cutMiddle(st.Output, r.opts.MaxOutputBytes)
	}
	isErr := call.Name == ToolStartProcess && !st.Running && (st.Code == nil || *st.Code != 0)
	return outcome{Text: text, IsError: isErr}
}

// indexAllowed reports whether the sandbox's allowlist includes the
// Python package index's hosts (the pypi preset), so pip can install
// through the egress proxy.
func (r *run) indexAllowed() bool {
	allow := r.allowlist()
	for _, h := range egress.Presets["pypi"] {
		if !slices.Contains(allow, h) {
			return false
		}
	}
	return true
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

// installPackages reports what is installed and installs what is allowed.
func (r *run) installPackages(ctx context.Context, call llm.ToolCall) outcome {
	var a struct {
		Names []string `json:"names"`
	}
	if err := decodeArgs(call, &a); err != nil {
		return errOutcome(err)
	}
	valid := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!_-]+)?$`)
	if len(a.Names) == 0 {
		return errOutcome(&ArgumentError{call.Name, `"names" must list at least one package`})
	}
	for _, n := range a.Names {
		if !valid.MatchString(n) {
			return errOutcome(&ArgumentError{call.Name, fmt.Sprintf("%q is not a package name", n)})
		}
	}
	names, _ := json.Marshal(a.Names)
	var st struct {
		Present map[string]string `json:"present"`
		Missing []string          `json:"missing"`
	}
	code := fmt.Sprintf(`
import json, re, importlib.metadata as md
present, missing = {}, []
for spec in %s:
    name = re.split(r"[<>=!~\[]", spec)[0]
    try:
        present[spec] = md.version(name)
    except md.PackageNotFoundError:
        missing.append(spec)
print(json.dumps({"present": present, "missing": missing}))
`, names)
	if err := r.kernelCall(ctx, code, &st); err != nil {
		return errOutcome(fmt.Errorf("could not check the installed packages: %v", err))
	}
	var b strings.Builder
	for _, n := range a.Names {
		if v, ok := st.Present[n]; ok {
			fmt.Fprintf(&b, "%s: already installed (version %s)\n", n, v)
		}
	}
	if len(st.Missing) == 0 {
		return outcome{Text: strings.TrimRight(b.String(), "\n")}
	}
	if !r.opts.Network && !r.indexAllowed() && r.opts.PackageIndex == "" && r.opts.WheelDir == "" {
		why := "this sandbox has no network access and no package source is configured"
		if allow := r.allowlist(); len(allow) > 0 {
			why = "this sandbox may reach only " + strings.Join(allow, ", ") + ", which does not include the package index (the pypi preset), and no package source is configured"
		}
		fmt.Fprintf(&b, "%s: NOT installed, and it cannot be: %s. "+
			"Do not retry. Use what is installed instead (the standard library, numpy, pandas, matplotlib, flask, requests, pytest and PIL are), "+
			"or write the needed code yourself.", strings.Join(st.Missing, ", "), why)
		return outcome{Text: b.String(), IsError: true}
	}
	args := []string{"-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--target", "/workspace/.sandloop/site-packages"}
	if r.opts.WheelDir != "" {
		args = append(args, "--no-index", "--find-links", r.opts.WheelDir)
	} else if r.opts.PackageIndex != "" {
		args = append(args, "--index-url", r.opts.PackageIndex)
	}
	cmd := "python3"
	for _, x := range append(args, st.Missing...) {
		cmd += " " + shellQuote(x)
	}
	res, err := r.opts.Session.Execute(ctx, kernel.Request{Code: shellCode(cmd) + "\nimport site; site.addsitedir('/workspace/.sandloop/site-packages')", Timeout: r.opts.MaxExecTimeout}, nil)
	if err != nil {
		return errOutcome(err)
	}
	if res.Status != kernel.StatusOK {
		fmt.Fprintf(&b, "pip could not install %s:\n%s", strings.Join(st.Missing, ", "), cutMiddle(res.Stdout+res.Stderr, r.opts.MaxOutputBytes))
		return outcome{Text: b.String(), IsError: true}
	}
	fmt.Fprintf(&b, "installed %s into /workspace/.sandloop/site-packages (on sys.path now; for scripts run with run_shell, set PYTHONPATH=/workspace/.sandloop/site-packages)", strings.Join(st.Missing, ", "))
	return outcome{Text: b.String()}
}
