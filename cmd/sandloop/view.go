package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/kernel"
)

// terminalView prints a run's progress for a person: each step's code, its
// output, errors set off; colored on a terminal, plain otherwise.
type terminalView struct {
	mu     sync.Mutex
	w      io.Writer
	color  bool
	inText bool
	// wait, if set, shows that the run waits for the model (a terminal only).
	wait *waitIndicator
	// retry is the last retry's "attempt 2/4" and its step, said while waiting again.
	retry     string
	retryStep int
	out       clippedOutput
}

// outHead and outTail are how many lines of a step's output the view prints
// from its start and its end; the rest is in the run's history.
const outHead, outTail = 40, 10

// clippedOutput prints the head of a step's output as it comes and holds back
// the tail, so a program that prints 200,000 lines shows 50 of them.
type clippedOutput struct {
	shown   int      // lines printed as they came
	dropped int      // lines neither printed nor kept
	tail    []string // the last lines held back, painted
	partial string   // a held-back line not yet ended
}

// write prints text as the head allows and holds back the rest.
func (o *clippedOutput) write(w io.Writer, text string, paint func(string) string) {
	for _, seg := range strings.SplitAfter(text, "\n") {
		if seg == "" {
			continue
		}
		if o.shown < outHead && o.partial == "" && len(o.tail) == 0 {
			fmt.Fprint(w, paint(seg))
			if strings.HasSuffix(seg, "\n") {
				o.shown++
			}
			continue
		}
		o.partial += seg
		if strings.HasSuffix(seg, "\n") {
			o.hold(paint(o.partial))
			o.partial = ""
		}
	}
}

func (o *clippedOutput) hold(line string) {
	o.tail = append(o.tail, line)
	if len(o.tail) > outTail {
		o.tail = o.tail[1:]
		o.dropped++
	}
}

// flush prints what was held back, saying how many lines were left out, and
// starts over for the next step.
func (o *clippedOutput) flush(w io.Writer, paint func(string, string) string) {
	if o.partial != "" {
		o.hold(o.partial + "\n")
	}
	if o.dropped > 0 {
		fmt.Fprintln(w, paint(cDim, fmt.Sprintf("… %d more lines (sandloop runs show --full has them)", o.dropped)))
	}
	for _, l := range o.tail {
		fmt.Fprint(w, l)
	}
	*o = clippedOutput{}
}

func newTerminalView(w io.Writer, color bool) *terminalView { return &terminalView{w: w, color: color} }

// showWaiting makes the view show the wait for the model on w, a terminal.
func (v *terminalView) showWaiting(w io.Writer, color bool) {
	v.wait = &waitIndicator{w: w, color: color}
}

// close removes what is still drawn.
func (v *terminalView) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.wait != nil {
		v.wait.clear()
	}
}

const (
	cReset  = "\x1b[0m"
	cBold   = "\x1b[1m"
	cDim    = "\x1b[2m"
	cRed    = "\x1b[31m"
	cGreen  = "\x1b[32m"
	cYellow = "\x1b[33m"
	cCyan   = "\x1b[36m"
)

func (v *terminalView) paint(c, s string) string {
	if !v.color || s == "" {
		return s
	}
	return c + s + cReset
}

func (v *terminalView) endText() {
	if v.inText {
		fmt.Fprintln(v.w)
		v.inText = false
	}
}

func (v *terminalView) event(e agent.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.wait != nil {
		v.wait.clear() // whatever comes next is printed on a clean line
	}
	switch e.Type {
	case agent.EventModelWait:
		if v.wait != nil {
			note := ""
			if v.retryStep == e.Step {
				note = v.retry
			}
			v.wait.start(e.Time, note)
		}
	case agent.EventModelRetry:
		v.endText()
		fmt.Fprintf(v.w, "%s\n", v.paint(cYellow, "↻ "+e.Text))
		if e.Retry != nil {
			v.retry, v.retryStep = fmt.Sprintf("attempt %d/%d", e.Retry.Attempt, e.Retry.MaxAttempts), e.Step
		}
	case agent.EventStarted:
		if e.Text != "" {
			fmt.Fprintf(v.w, "%s %s\n", v.paint(cBold, "task:"), e.Text)
		}
	case agent.EventText:
		if !v.inText {
			fmt.Fprint(v.w, v.paint(cDim, "│ "))
			v.inText = true
		}
		fmt.Fprint(v.w, v.paint(cDim, strings.ReplaceAll(e.Text, "\n", "\n│ ")))
	case agent.EventAssistant:
		v.endText()
	case agent.EventToolCall:
		v.endText()
		fmt.Fprintf(v.w, "%s\n", v.paint(cCyan+cBold, fmt.Sprintf("── step %d · %s", e.Step, e.Tool)))
		v.showCall(e.Tool, e.Arguments, false)
	case agent.EventOutput:
		if e.Exec == nil {
			return
		}
		switch e.Exec.Type {
		case kernel.EventStdout:
			v.out.write(v.w, e.Exec.Text, func(s string) string { return s })
		case kernel.EventStderr:
			v.out.write(v.w, e.Exec.Text, func(s string) string { return v.paint(cRed, s) })
		}
	case agent.EventToolResult:
		v.out.flush(v.w, v.paint)
		v.showResult(e)
	case agent.EventNotice:
		v.endText()
		fmt.Fprintf(v.w, "%s\n", v.paint(cYellow, "! "+e.Text))
	case agent.EventNetwork:
		v.endText()
		for _, n := range e.Network {
			if n.Allowed {
				fmt.Fprintf(v.w, "%s\n", v.paint(cDim, fmt.Sprintf("network: %s %s:%d, %d bytes out, %d in", n.Method, n.Host, n.Port, n.BytesOut, n.BytesIn)))
			} else {
				fmt.Fprintf(v.w, "%s\n", v.paint(cYellow, fmt.Sprintf("network: refused %s %s:%d (%s)", n.Method, n.Host, n.Port, n.Reason)))
			}
		}
	case agent.EventLessons:
		v.endText()
		head := "lessons recalled:"
		if e.Text == "seen_before" {
			head = "seen before:"
		}
		for _, l := range e.Lessons {
			fmt.Fprintf(v.w, "%s %s %s\n", v.paint(cYellow+cBold, head), l.Text, v.paint(cDim, "("+l.ID+")"))
		}
	case agent.EventReproduced:
		v.endText()
		v.showReproduced(e.Check)
	case agent.EventFinished:
		v.endText()
		v.out.flush(v.w, v.paint) // a run cut short mid-step still shows the output's tail
		v.showReport(e.Report)
	}
}

// showReproduced prints how the program ended when debug mode ran it before
// the model's first step, so that the crash the run is about comes first.
func (v *terminalView) showReproduced(c *agent.Check) {
	if c == nil {
		return
	}
	fmt.Fprintf(v.w, "%s\n", v.paint(cCyan+cBold, "── reproduce"))
	fmt.Fprintf(v.w, "%s %s\n", v.paint(cDim, "$"), c.Command)
	if c.Output != "" {
		v.out.write(v.w, c.Output+"\n", func(s string) string { return s })
		v.out.flush(v.w, v.paint)
	}
	if c.Status == string(kernel.StatusOK) {
		fmt.Fprintln(v.w, v.paint(cYellow, "✓ ok: it did not crash this time"))
	} else {
		fmt.Fprintln(v.w, v.paint(cRed, "✗ "+c.Status+": the crash to fix"))
	}
}

// showCall prints a tool call: the code, the command, the edit; with whole,
// a written file's content too (runs show --full).
func (v *terminalView) showCall(tool, args string, whole bool) {
	var a map[string]any
	_ = json.Unmarshal([]byte(args), &a)
	str := func(k string) string { s, _ := a[k].(string); return s }
	switch tool {
	case agent.ToolExecutePython:
		for _, line := range strings.Split(strings.TrimRight(str("code"), "\n"), "\n") {
			fmt.Fprintf(v.w, "%s %s\n", v.paint(cDim, ">"), line)
		}
	case agent.ToolRunShell:
		fmt.Fprintf(v.w, "%s %s\n", v.paint(cDim, "$"), str("command"))
	case agent.ToolWriteFile:
		fmt.Fprintf(v.w, "write %s (%d bytes)\n", str("path"), len(str("content")))
		if whole {
			for _, line := range strings.Split(strings.TrimRight(str("content"), "\n"), "\n") {
				fmt.Fprintf(v.w, "%s %s\n", v.paint(cDim, "|"), line)
			}
		}
	case agent.ToolEditFile:
		fmt.Fprintf(v.w, "edit %s\n", str("path"))
		for _, l := range strings.Split(str("old_text"), "\n") {
			fmt.Fprintln(v.w, v.paint(cRed, "- "+l))
		}
		for _, l := range strings.Split(str("new_text"), "\n") {
			fmt.Fprintln(v.w, v.paint(cGreen, "+ "+l))
		}
	case agent.ToolFinish:
		fmt.Fprintln(v.w, str("summary"))
	default:
		if args != "" && args != "{}" {
			fmt.Fprintln(v.w, args)
		}
	}
}

func (v *terminalView) showResult(e agent.Event) {
	if r := e.Result; r != nil {
		mark, c := "✓ "+string(r.Status), cGreen
		if r.Status != kernel.StatusOK {
			mark, c = "✗ "+string(r.Status), cRed
		}
		fmt.Fprintf(v.w, "%s %s\n", v.paint(c, mark), v.paint(cDim, fmt.Sprintf("%.0f ms", r.DurationMS)))
		if m := r.MainResult(); m != nil {
			if t := m["text/plain"]; t != "" {
				fmt.Fprintf(v.w, "%s %s\n", v.paint(cDim, "="), t)
			}
		}
		if e.Images > 0 {
			fmt.Fprintf(v.w, "%s\n", v.paint(cDim, fmt.Sprintf("[%d image(s)]", e.Images)))
		}
		switch {
		case r.Error == nil:
		case r.Error.Traceback != "" && !strings.Contains(r.Stderr, r.Error.Name):
			fmt.Fprint(v.w, v.paint(cRed, strings.TrimRight(r.Error.Traceback, "\n")+"\n"))
		case r.Error.Traceback == "":
			fmt.Fprintln(v.w, v.paint(cRed, r.Error.Value))
		}
		return
	}
	first, _, _ := strings.Cut(e.Text, "\n")
	if e.IsError {
		fmt.Fprintln(v.w, v.paint(cRed, "✗ "+e.Text))
	} else if e.Tool != agent.ToolReadFile && e.Tool != agent.ToolListFiles {
		fmt.Fprintln(v.w, v.paint(cDim, first))
	} else {
		fmt.Fprintln(v.w, v.paint(cDim, fmt.Sprintf("(%d lines)", strings.Count(e.Text, "\n")+1)))
	}
}

func (v *terminalView) showReport(r *agent.Report) {
	if r == nil {
		return
	}
	c := cGreen
	if r.Status != agent.StatusDone {
		c = cRed
	}
	fmt.Fprintf(v.w, "\n%s\n", v.paint(c+cBold, fmt.Sprintf("══ %s after %d steps", r.Status, r.Steps)))
	if r.Summary != "" {
		fmt.Fprintf(v.w, "%s %s\n", v.paint(cBold, "summary:"), r.Summary)
	}
	if r.RootCause != "" {
		fmt.Fprintf(v.w, "%s %s\n", v.paint(cBold, "root cause:"), r.RootCause)
	}
	if r.Error != "" {
		fmt.Fprintf(v.w, "%s %s\n", v.paint(cRed, "why:"), r.Error)
	}
	cost := formatCost(r.Usage.Cost, r.Usage.CostUnknown)
	fmt.Fprintf(v.w, "%s\n", v.paint(cDim, fmt.Sprintf("%s · %d tokens in, %d out · %s · %s", r.Model, r.Usage.InputTokens, r.Usage.OutputTokens, cost, r.Duration.Round(1e6))))
	if m := r.Refactor; m != nil {
		fmt.Fprintf(v.w, "lines of code: %d → %d\n", m.LOCBefore, m.LOCAfter)
		for i, b := range m.Before {
			if i < len(m.After) {
				a := m.After[i]
				fmt.Fprintf(v.w, "$ %s: time %.0f ms → %.0f ms, peak memory %.1f MiB → %.1f MiB\n", b.Command, b.WallMS, a.WallMS, float64(b.PeakRSSKiB)/1024, float64(a.PeakRSSKiB)/1024)
			}
		}
		if m.TestsAfter != nil {
			fmt.Fprintf(v.w, "tests: %s\n", m.TestsAfter.Summary)
		}
	}
	if r.Tests != nil {
		fmt.Fprintf(v.w, "tests: %s\n", r.Tests.Summary)
	}
	for _, p := range r.Previews {
		fmt.Fprintf(v.w, "%s %s %s\n", v.paint(cBold, fmt.Sprintf("preview (port %d):", p.Port)), p.URL,
			v.paint(cDim, "(open until "+p.ExpiresAt.Local().Format("15:04")+")"))
	}
	used := map[string]bool{}
	for _, l := range r.LessonsUsed {
		used[l.ID] = true
		fmt.Fprintf(v.w, "%s %s %s\n", v.paint(cBold, "lesson used:"), l.Text, v.paint(cDim, "("+l.ID+")"))
	}
	for _, l := range r.LessonsShown {
		if !used[l.ID] {
			fmt.Fprintf(v.w, "%s %s %s\n", v.paint(cDim, "lesson shown:"), l.Text, v.paint(cDim, "("+l.ID+")"))
		}
	}
	for _, l := range r.LessonsLearned {
		fmt.Fprintf(v.w, "%s %s %s\n", v.paint(cBold, "lesson learned:"), l.Text, v.paint(cDim, "("+l.ID+")"))
	}
	if r.Diff != "" {
		fmt.Fprintln(v.w)
		for _, l := range strings.Split(strings.TrimRight(r.Diff, "\n"), "\n") {
			switch {
			case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
				fmt.Fprintln(v.w, v.paint(cBold, l))
			case strings.HasPrefix(l, "+"):
				fmt.Fprintln(v.w, v.paint(cGreen, l))
			case strings.HasPrefix(l, "-"):
				fmt.Fprintln(v.w, v.paint(cRed, l))
			default:
				fmt.Fprintln(v.w, l)
			}
		}
	}
}
