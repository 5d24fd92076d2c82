package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Measurement is one run of a check command by the harness.
type Measurement struct {
	Command    string  `json:"command"`
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr,omitempty"`
	WallMS     float64 `json:"wall_ms"`      // median of the repeats
	PeakRSSKiB int64   `json:"peak_rss_kib"` // median of the repeats
}

// TestRun is the outcome of the project's tests.
type TestRun struct {
	Command string `json:"command"`
	Passed  bool   `json:"passed"`
	Summary string `json:"summary"` // pytest's last line
	Output  string `json:"output,omitempty"`
}

// RefactorMetrics compares the code before and after a refactor.
type RefactorMetrics struct {
	Before      []Measurement `json:"before"`
	After       []Measurement `json:"after,omitempty"`
	TestsBefore *TestRun      `json:"tests_before,omitempty"`
	TestsAfter  *TestRun      `json:"tests_after,omitempty"`
	LOCBefore   int           `json:"loc_before"`
	LOCAfter    int           `json:"loc_after"`
}

// measureScript runs a command in a fresh wrapper process, so the peak RSS
// is that command's alone, repeated to steady the timing.
const measureScript = `
import json, resource, statistics, subprocess, sys, time
cmd, reps = %s, %d
walls, rss, last = [], [], None
for _ in range(reps):
    w = subprocess.run([sys.executable, "-c", """
import resource, subprocess, sys, time, json
t = time.perf_counter()
p = subprocess.run(sys.argv[1], shell=True, capture_output=True)
wall = (time.perf_counter() - t) * 1000
print(json.dumps({"rc": p.returncode, "out": p.stdout.decode("utf-8", "replace"), "err": p.stderr.decode("utf-8", "replace"),
                  "wall": wall, "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""", cmd], capture_output=True, text=True)
    last = json.loads(w.stdout)
    walls.append(last["wall"]); rss.append(last["rss"])
print(json.dumps({"rc": last["rc"], "out": last["out"], "err": last["err"], "wall": statistics.median(walls), "rss": int(statistics.median(rss))}))
`

func (r *run) measure(ctx context.Context, command string) (Measurement, error) {
	var st struct {
		RC   int     `json:"rc"`
		Out  string  `json:"out"`
		Err  string  `json:"err"`
		Wall float64 `json:"wall"`
		RSS  int64   `json:"rss"`
	}
	if err := r.kernelCall(ctx, fmt.Sprintf(measureScript, tools.PyString(command), 3), &st); err != nil {
		return Measurement{}, fmt.Errorf("measure %q: %w", command, err)
	}
	return Measurement{Command: command, ExitCode: st.RC, Stdout: st.Out, Stderr: st.Err, WallMS: st.Wall, PeakRSSKiB: st.RSS}, nil
}

// hasTests reports whether the workspace holds pytest-style tests.
func (r *run) hasTests() bool {
	found := false
	r.walk(2000, func(e workspace.Entry) {
		n := e.Name
		if strings.HasSuffix(n, ".py") && (strings.HasPrefix(n, "test_") || strings.HasSuffix(n, "_test.py")) {
			found = true
		}
	})
	return found
}

// runTests runs pytest in the workspace.
func (r *run) runTests(ctx context.Context) (*TestRun, error) {
	var st struct {
		RC  int    `json:"rc"`
		Out string `json:"out"`
	}
	code := `import json, subprocess, sys
p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], capture_output=True, text=True)
print(json.dumps({"rc": p.returncode, "out": p.stdout + p.stderr}))`
	if err := r.kernelCall(ctx, code, &st); err != nil {
		return nil, fmt.Errorf("run the tests: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(st.Out), "\n")
	return &TestRun{Command: "python3 -m pytest -q", Passed: st.RC == 0, Summary: lines[len(lines)-1], Output: cutMiddle(st.Out, r.opts.MaxOutputBytes)}, nil
}

// linesOfCode counts non-blank, non-comment lines of the .py files that
// are not tests.
func linesOfCode(files map[string]string) int {
	n := 0
	for p, text := range files {
		base := p[strings.LastIndex(p, "/")+1:]
		if !strings.HasSuffix(p, ".py") || strings.HasPrefix(base, "test_") || strings.HasSuffix(base, "_test.py") {
			continue
		}
		for _, l := range strings.Split(text, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				n++
			}
		}
	}
	return n
}

// refactorChecks are the commands whose behaviour must not change.
func (r *run) refactorChecks() []string {
	if len(r.opts.Checks) > 0 {
		return r.opts.Checks
	}
	if r.opts.Entry != "" {
		return []string{"python3 " + tools.ShellQuote(r.opts.Entry)}
	}
	return nil
}

// baseline records the behaviour and cost of the original code.
func (r *run) baseline(ctx context.Context) (string, error) {
	m := &RefactorMetrics{LOCBefore: linesOfCode(r.before)}
	r.metrics = m
	var b strings.Builder
	for _, c := range r.refactorChecks() {
		x, err := r.measure(ctx, c)
		if err != nil {
			return "", err
		}
		m.Before = append(m.Before, x)
		fmt.Fprintf(&b, "\n$ %s  (exit %d, %.0f ms, peak %d KiB)\n%s", c, x.ExitCode, x.WallMS, x.PeakRSSKiB, cutMiddle(x.Stdout, 2000))
	}
	if r.hasTests() {
		t, err := r.runTests(ctx)
		if err != nil {
			return "", err
		}
		m.TestsBefore = t
		fmt.Fprintf(&b, "\ntests before: %s\n", t.Summary)
	}
	if len(m.Before) == 0 && m.TestsBefore == nil {
		return "", &ArgumentError{"refactor", errors.New("refactor mode needs a way to check behaviour: tests (test_*.py), a command (--check), or one .py program to run")}
	}
	return b.String(), nil
}

// verifyRefactor reruns every check: outputs must match exactly and the
// tests must pass.
func (r *run) verifyRefactor(ctx context.Context) (string, bool, error) {
	m := r.metrics
	m.After = nil
	var problems []string
	for i, c := range r.refactorChecks() {
		x, err := r.measure(ctx, c)
		if err != nil {
			return "", false, err
		}
		m.After = append(m.After, x)
		was := m.Before[i]
		if x.ExitCode != was.ExitCode {
			problems = append(problems, fmt.Sprintf("`%s` exited %d, the original exited %d\n%s", c, x.ExitCode, was.ExitCode, cutMiddle(x.Stderr, 2000)))
		}
		if x.Stdout != was.Stdout {
			d, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: difflib.SplitLines(was.Stdout), B: difflib.SplitLines(x.Stdout), FromFile: "original output", ToFile: "new output", Context: 2})
			problems = append(problems, fmt.Sprintf("`%s` prints something different now:\n%s", c, cutMiddle(d, 4000)))
		}
	}
	if m.TestsBefore != nil || r.hasTests() {
		t, err := r.runTests(ctx)
		if err != nil {
			return "", false, err
		}
		m.TestsAfter = t
		if !t.Passed {
			problems = append(problems, "the tests fail:\n"+t.Output)
		}
	}
	m.LOCAfter = linesOfCode(r.snapshot())
	if len(problems) > 0 {
		return "not finished: the behaviour changed.\n\n" + strings.Join(problems, "\n\n"), false, nil
	}
	return "", true, nil
}
