package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/sandloop/sandloop/internal/workspace"
)

const basePrompt = `You are sandloop's coding agent. You write Python and run it in a sandbox to get a job done, then verify it.

The sandbox: a Linux machine with Python 3 (numpy, pandas, matplotlib, flask, requests, pytest and the standard library are installed), working directory /workspace, no network except its own loopback. Tools:
- execute_python runs code in a persistent Jupyter-like session: variables and imports persist; the last expression's value is shown; matplotlib figures come back as images.
- run_shell runs a command (e.g. "python3 script.py", "pytest -q").
- write_file, read_file, edit_file and list_files work on /workspace.
- finish ends the run once the work is complete and verified.

Work in small steps: write code, run it, read the output or traceback, fix, rerun. Put lasting work in files. Never claim success you did not observe in a tool result.`

func systemPrompt(m Mode) string {
	switch m {
	case ModeRefactor:
		return basePrompt + `

This is a refactoring job: make the code cleaner (clear names, small functions, no duplication, idiomatic Python, faster where it is easy) WITHOUT changing its behaviour. The harness recorded the original behaviour (outputs, exit codes, tests, time and memory) — it is in the first message. Edit the files in place, run the checks yourself, and call finish. The harness reruns everything before accepting finish: outputs must match exactly and the tests must pass.`
	case ModeApp:
		return basePrompt + `

This is an application job: build a small multi-file project in /workspace. Write the app's files; start servers with start_process and check them with real HTTP requests from execute_python (e.g. requests.get("http://127.0.0.1:5000/...")); write tests (test_*.py, run with pytest — for a Flask app use its test client); write requirements.txt (the packages the app needs) and a short README.md (what it is, how to run it, how to test it). Use install_packages to check packages. When done, leave the app's own server running (start_process) so the user can open it: its preview URL is given to them after the run; stop any other processes you started. The harness runs pytest before accepting finish and requires requirements.txt and README.md.`
	case ModeDebug:
		return basePrompt + `

This is a debugging job. The program below crashed when the harness ran it; its output is in the first message. Find the root cause (read the code and the traceback, add prints or run parts of it if needed), fix it in the files with edit_file or write_file — fix the cause, not the symptom, and keep the program's intended behaviour — then run the program again to confirm the crash is gone. Call finish with a summary and the root_cause. The harness reruns the program itself before accepting finish.`
	}
	return basePrompt + `

When the code has run cleanly and the result is checked, call finish. finish is refused while your most recent execution failed.`
}

// firstMessage is the task, the files and, in debug mode, the reproduced failure.
func (r *run) firstMessage(ctx context.Context) (string, error) {
	var b strings.Builder
	if t := strings.TrimSpace(r.opts.Task); t != "" {
		b.WriteString("Task: " + t + "\n")
	}
	if files := r.fileList(); len(files) > 0 {
		b.WriteString("\nFiles in /workspace: " + strings.Join(files, ", ") + "\n")
	}
	switch r.opts.Mode {
	case ModeRefactor:
		base, err := r.baseline(ctx)
		if err != nil {
			return "", err
		}
		b.WriteString("\nThe harness recorded the original behaviour:" + base + "\n")
		for _, p := range sortedPaths(r.before) {
			if strings.HasSuffix(p, ".py") {
				fmt.Fprintf(&b, "\n%s:\n%s\n", p, tools.NumberLines(r.before[p], 1, 400))
			}
		}
		return b.String(), nil
	case ModeDebug:
	default:
		return b.String(), nil
	}
	c, err := r.runEntry(ctx)
	if err != nil {
		return "", err
	}
	r.repro = c
	r.emit(Event{Type: EventReproduced, Check: c})
	fmt.Fprintf(&b, "\nThe harness ran `%s`:\nstatus: %s\n%s\n", c.Command, c.Status, c.Output)
	if c.Status == string(kernel.StatusOK) {
		b.WriteString("\nIt did not crash this time. Look for the failure the task describes (inputs, edge cases) before changing code.\n")
	} else {
		b.WriteString("\nFind and fix the root cause of this failure.\n")
	}
	src, _ := r.ws.ReadFile(r.opts.Entry, 64<<10)
	if len(src) > 0 && utf8.Valid(src) {
		fmt.Fprintf(&b, "\n%s:\n%s\n", r.opts.Entry, tools.NumberLines(string(src), 1, 400))
	}
	return b.String(), nil
}

func (r *run) pickEntry(paths []string) error {
	if r.opts.Entry != "" {
		p, err := workspace.Clean(r.opts.Entry)
		if err != nil {
			return &ArgumentError{"entry", err}
		}
		if _, err := r.ws.Stat(p); err != nil {
			return &ArgumentError{"entry", fmt.Errorf("%s is not among the files given", r.opts.Entry)}
		}
		r.opts.Entry = p
		return nil
	}
	p, err := onePython(paths)
	if err != nil {
		return err
	}
	r.opts.Entry = p
	return nil
}

// onePython is the only .py file among paths, the program debug mode runs
// when no entry is named.
func onePython(paths []string) (string, error) {
	var py []string
	for _, p := range paths {
		if strings.HasSuffix(p, ".py") {
			py = append(py, p)
		}
	}
	switch {
	case len(py) == 0:
		return "", &ArgumentError{"entry", errors.New("debug mode needs the program to run: give its .py file")}
	case len(py) > 1:
		sort.Strings(py)
		return "", &ArgumentError{"entry", fmt.Errorf("debug mode needs the program to run: name it as the entry among the %d .py files given (%s)", len(py), strings.Join(py[:min(len(py), 5)], ", "))}
	}
	return py[0], nil
}

// DebugEntry says, before a run exists, which program a debug run given
// these files (their workspace paths) and entry runs: the named entry among
// the files, or the only .py file. Other modes run none ("", nil).
func DebugEntry(mode Mode, files []string, entry string) (string, error) {
	if mode != ModeDebug {
		return "", nil
	}
	if entry == "" {
		return onePython(files)
	}
	e, err := workspace.Clean(entry)
	if err != nil {
		return "", &ArgumentError{"entry", err}
	}
	for _, f := range files {
		if c, err := workspace.Clean(f); err == nil && c == e {
			return e, nil
		}
	}
	return "", &ArgumentError{"entry", fmt.Errorf("%s is not among the files given", entry)}
}

// runEntry runs the debug program as the user would, in the same sandbox.
func (r *run) runEntry(ctx context.Context) (*Check, error) {
	cmd := "python3 " + tools.ShellQuote(r.opts.Entry)
	for _, a := range r.opts.Args {
		cmd += " " + tools.ShellQuote(a)
	}
	code, err := tools.ShellCode(cmd)
	if err != nil {
		return nil, &ArgumentError{"entry", err}
	}
	res, err := r.opts.Session.Execute(ctx, kernel.Request{Code: code, Timeout: r.opts.ExecTimeout}, nil)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", r.opts.Entry, err)
	}
	c := &Check{Command: cmd, Status: string(res.Status), Output: cutMiddle(strings.TrimRight(res.Stdout+res.Stderr, "\n"), r.opts.MaxOutputBytes)}
	if res.Status != kernel.StatusOK {
		c.ErrorSig = errorSignature(res.Stderr)
		if c.ErrorSig == "" && res.Error != nil {
			c.ErrorSig = res.Error.Name
		}
	}
	return c, nil
}

var excLine = regexp.MustCompile(`(?m)^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|[A-Z]\w*Error)\b:?`)

// errorSignature is the exception type of the last Python traceback in
// stderr, e.g. "ZeroDivisionError".
func errorSignature(stderr string) string {
	m := excLine.FindAllStringSubmatch(stderr, -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}

// finish accepts or refuses the model's finish call.
func (r *run) finish(ctx context.Context, a finishArgs) outcome {
	if strings.TrimSpace(a.Summary) == "" {
		return errOutcome(&ArgumentError{ToolFinish, errors.New("give a summary")})
	}
	switch r.opts.Mode {
	case ModeDebug:
		if strings.TrimSpace(a.RootCause) == "" {
			return errOutcome(&ArgumentError{ToolFinish, errors.New("name the root_cause of the crash")})
		}
		c, err := r.runEntry(ctx)
		if err != nil {
			return errOutcome(err)
		}
		r.verified = c
		if c.Status != string(kernel.StatusOK) {
			msg := fmt.Sprintf("not finished: the harness reran `%s` and it still fails (status %s):\n%s", c.Command, c.Status, c.Output)
			if r.repro != nil && r.repro.ErrorSig != "" && c.ErrorSig == r.repro.ErrorSig {
				msg += "\nIt is the same " + c.ErrorSig + " as before."
			}
			return outcome{Text: msg, IsError: true}
		}
	case ModeRefactor:
		msg, ok, err := r.verifyRefactor(ctx)
		if err != nil {
			return errOutcome(err)
		}
		if !ok {
			return outcome{Text: msg, IsError: true}
		}
	case ModeApp:
		var missing []string
		for _, f := range []string{"requirements.txt", "README.md"} {
			if _, err := r.ws.Stat(f); err != nil {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			return outcome{Text: "not finished: write " + strings.Join(missing, " and ") + " first.", IsError: true}
		}
		if !r.hasTests() {
			return outcome{Text: "not finished: the app has no tests (test_*.py). Write them and run them with pytest.", IsError: true}
		}
		t, err := r.runTests(ctx)
		if err != nil {
			return errOutcome(err)
		}
		r.tests = t
		if !t.Passed {
			return outcome{Text: "not finished: the harness ran the tests and they fail:\n" + t.Output, IsError: true}
		}
	default:
		if !r.executed {
			return outcome{Text: "not finished: nothing was run yet. Run the code (execute_python or run_shell) and check its output first.", IsError: true}
		}
		if !r.ranOK {
			return outcome{Text: "not finished: your most recent execution failed. Fix it and run it successfully first.", IsError: true}
		}
	}
	return outcome{Text: "finished", Finish: &a}
}

func openWorkspace(dir string) (*workspace.Workspace, error) {
	return session.OpenWorkspace(dir, workspace.Options{})
}

// walk visits the workspace's files, skipping caches and hidden
// directories, up to max files.
func (r *run) walk(max int, fn func(e workspace.Entry)) {
	n := 0
	skip := func(e workspace.Entry) bool { return strings.HasPrefix(e.Name, ".") || e.Name == "__pycache__" }
	_ = r.ws.Walk(".", skip, func(e workspace.Entry) error {
		if n >= max {
			return fs.SkipAll
		}
		n++
		fn(e)
		return nil
	})
}

// snapshot reads the workspace's small text files, for the diff.
func (r *run) snapshot() map[string]string {
	out := map[string]string{}
	r.walk(500, func(e workspace.Entry) {
		if e.Size > 256<<10 {
			return
		}
		if b, err := r.ws.ReadFile(e.Path, 256<<10); err == nil && utf8.Valid(b) {
			out[e.Path] = string(b)
		}
	})
	return out
}

// fileList lists the workspace's files (not directories).
func (r *run) fileList() []string {
	var out []string
	r.walk(2000, func(e workspace.Entry) { out = append(out, e.Path) })
	sort.Strings(out)
	return out
}

func sortedPaths(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// diffSnapshots is a unified diff between two snapshots.
func diffSnapshots(before, after map[string]string) string {
	names := map[string]bool{}
	for p := range before {
		names[p] = true
	}
	for p := range after {
		names[p] = true
	}
	sorted := make([]string, 0, len(names))
	for p := range names {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	var b strings.Builder
	for _, p := range sorted {
		a, inA := before[p]
		z, inZ := after[p]
		if a == z && inA == inZ {
			continue
		}
		from, to := "a/"+p, "b/"+p
		var la, lz []string
		if inA {
			la = difflib.SplitLines(a)
		} else {
			from = "/dev/null"
		}
		if inZ {
			lz = difflib.SplitLines(z)
		} else {
			to = "/dev/null"
		}
		d, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: la, B: lz, FromFile: from, ToFile: to, Context: 3})
		b.WriteString(d)
	}
	return b.String()
}

// environmenter is a session that can say what its Python has
// (session.Session, and so session.Managed).
type environmenter interface {
	Environment() session.Environment
}

// maxEnvironmentPrompt bounds the list of a template's packages in the
// system prompt (a template may hold hundreds of distributions).
const maxEnvironmentPrompt = 1500

// environmentPrompt tells the model the session's Python version and, in
// a template's session, the packages the template installed, so that it
// does not pip install what is there. Empty for a session that cannot say.
func environmentPrompt(s Session) string {
	es, ok := s.(environmenter)
	if !ok {
		return ""
	}
	env := es.Environment()
	if env.Template == "" {
		return "\n\nThe sandbox's Python is " + env.Python + "."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n\nThe sandbox's Python is %s, in the environment of the template %q (active: python3 and pip are its own). ", env.Python, env.Template)
	if len(env.Packages) == 0 {
		b.WriteString("The template installed no packages of its own.")
		return b.String()
	}
	b.WriteString("Besides the system's packages above, it has installed (do not pip install these again): ")
	for i, p := range env.Packages {
		item := p.Name + " " + p.Version
		if b.Len()+len(item) > maxEnvironmentPrompt {
			fmt.Fprintf(&b, "... and %d more (pip list shows them all)", len(env.Packages)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(item)
	}
	b.WriteString(".")
	return b.String()
}
