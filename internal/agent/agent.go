// Package agent drives the write-run-fix loop: a model writes Python, the
// sandbox runs it, the model reads what happened and fixes it, until the
// task is done and verified.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Mode is the kind of job.
type Mode string

const (
	ModeGenerate Mode = "generate"
	ModeDebug    Mode = "debug"
	ModeRefactor Mode = "refactor"
	ModeApp      Mode = "app"
)

// ParseMode reads a --mode value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeGenerate:
		return ModeGenerate, nil
	case ModeDebug, ModeRefactor, ModeApp:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q (use generate, debug, refactor or app)", s)
}

// RefactorTask is a refactor run's task when none is given.
const RefactorTask = "Refactor these files without changing their behaviour."

// NeedsTask says whether a run in mode m needs a task: a debug run's task
// is its program's crash, a refactor run's is [RefactorTask].
func NeedsTask(m Mode) bool { return m != ModeDebug && m != ModeRefactor }

// Status is how a run ended.
type Status string

const (
	StatusRunning        Status = "running"
	StatusDone           Status = "done"
	StatusBudgetExceeded Status = "budget_exceeded" // steps, tokens or cost
	StatusTimeout        Status = "timeout"         // the wall-clock limit
	StatusStuck          Status = "stuck"           // the same failing action, again and again
	StatusCancelled      Status = "cancelled"
	StatusFailed         Status = "failed" // the model or the sandbox failed (see Error)
)

// Session is what the agent needs of a sandbox session.
type Session interface {
	Execute(ctx context.Context, req kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error)
	Restart(ctx context.Context) error
	Workspace() string
}

// Options configure one run.
type Options struct {
	Task     string
	Mode     Mode
	Provider llm.Provider
	Session  Session
	// Files are put into the workspace before the run (path → content).
	Files map[string][]byte
	// Entry is the program debug mode runs (a path in the workspace, with
	// Args). If empty in debug mode, the only .py file among Files.
	Entry string
	Args  []string
	// Checks are commands whose output must not change (refactor mode).
	// If empty, the entry program (if any) is the check.
	Checks []string
	// Network says the sandbox may reach the network (so pip may run);
	// PackageIndex and WheelDir (a path inside the sandbox) are package
	// sources for install_packages.
	Network bool
	// Allow is the sandbox's allowlist in allow mode (its egress proxy):
	// install_packages uses pip's default index when it lists the index.
	Allow        []string
	PackageIndex string
	WheelDir     string
	// MaxSteps caps model calls. If zero, 25.
	MaxSteps int
	// MaxTokens caps input+output tokens of the run; MaxCost its cost in
	// US dollars. Zero means no cap.
	MaxTokens int64
	MaxCost   float64
	// Timeout caps the run's wall-clock time. If zero, 30 minutes.
	Timeout time.Duration
	// ExecTimeout is an execution's default time limit. If zero, 120s;
	// MaxExecTimeout caps what the model may ask for (default 10 minutes).
	ExecTimeout, MaxExecTimeout time.Duration
	// MaxOutputBytes is how much of stdout/stderr the model reads per
	// call (the middle is cut). If zero, 8000.
	MaxOutputBytes int
	// OnEvent receives the run's events as they happen.
	OnEvent func(Event)
	// Lessons, if set, recalls what earlier runs learned and keeps what
	// this one learns (nil: --no-lessons).
	Lessons Lessons
	// Confirm, if set, is asked before each execution; false skips it.
	Confirm func(ctx context.Context, tool, code string) bool
	// Previews, if set, is asked as an app run ends (before
	// run_finished) for the servers the agent left listening in the
	// sandbox, reachable after the run (Report.Previews).
	Previews func(ctx context.Context) []Preview
	Logger   *slog.Logger
}

// Preview is a server an app run left listening in its sandbox, opened
// after the run by URL (a signed, expiring preview URL) until ExpiresAt,
// when the sandbox is closed.
type Preview struct {
	Port      int       `json:"port"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Event types.
const (
	EventStarted    = "run_started"
	EventText       = "text"      // a streamed delta of the model's words
	EventAssistant  = "assistant" // the model's whole message of a step
	EventToolCall   = "tool_call"
	EventOutput     = "output" // live output of an execution (Exec)
	EventToolResult = "tool_result"
	EventNetwork    = "network" // connections through the sandbox's egress proxy
	EventUsage      = "usage"
	EventNotice     = "notice" // a note from the harness to the model (nudges, checks)
	// EventReproduced: debug mode ran the program before the model's first
	// step; Check is how it ended (the crash, or that it did not crash).
	EventReproduced = "reproduced"
	EventFinished   = "run_finished"
	// EventModelWait: the harness starts waiting for the model's answer for a
	// step (sent just before each request; Time is when waiting began). The
	// wait ends at the next text, assistant, tool_call, model_retry or
	// run_finished event.
	EventModelWait = "model_wait"
	// EventModelRetry: a model call failed and will be tried again; Text is
	// the sentence for a person, Retry the details. A new model_wait follows
	// after the delay.
	EventModelRetry = "model_retry"
)

// RetryInfo details an EventModelRetry.
type RetryInfo struct {
	// Attempt is the attempt about to be made (2 for the first retry).
	Attempt     int   `json:"attempt"`
	MaxAttempts int   `json:"max_attempts"`
	DelayMS     int64 `json:"delay_ms"`
	// Reason is rate_limited, server_error, timeout or connection.
	Reason string `json:"reason"`
	// Status is the HTTP status that failed, 0 if none.
	Status int `json:"status"`
}

// Event is one thing that happened in a run.
type Event struct {
	Type string `json:"type"`
	// RunID is the run's id where runs are kept (set by internal/runs).
	RunID      string         `json:"run_id,omitempty"`
	Step       int            `json:"step"`
	Time       time.Time      `json:"time"`
	Text       string         `json:"text,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Tool       string         `json:"tool,omitempty"`
	Arguments  string         `json:"arguments,omitempty"`
	IsError    bool           `json:"is_error,omitempty"`
	Exec       *kernel.Event  `json:"exec,omitempty"`
	Result     *kernel.Result `json:"result,omitempty"` // the full result of an execution
	Images     int            `json:"images,omitempty"`
	Changed    []string       `json:"changed,omitempty"`
	Usage      *llm.Usage     `json:"usage,omitempty"`
	Report     *Report        `json:"report,omitempty"`
	Network    []egress.Entry `json:"network,omitempty"` // EventNetwork
	Lessons    []LessonRef    `json:"lessons,omitempty"`
	Retry      *RetryInfo     `json:"retry,omitempty"` // EventModelRetry
	Check      *Check         `json:"check,omitempty"` // EventReproduced
}

// Report is the outcome of a run.
type Report struct {
	Status    Status        `json:"status"`
	Summary   string        `json:"summary,omitempty"`
	RootCause string        `json:"root_cause,omitempty"`
	Error     string        `json:"error,omitempty"`
	Steps     int           `json:"steps"`
	Usage     llm.Usage     `json:"usage"`
	Model     string        `json:"model"`
	Mode      Mode          `json:"mode"`
	Duration  time.Duration `json:"duration_ns"`
	// Diff is a unified diff of the workspace's text files from the start
	// of the run to its end.
	Diff string `json:"diff,omitempty"`
	// Files are the workspace's files at the end.
	Files []string `json:"files,omitempty"`
	// Verification is the harness's own final check (debug mode).
	Verification *Check `json:"verification,omitempty"`
	// Reproduction is the failure observed before the model began (debug).
	Reproduction *Check `json:"reproduction,omitempty"`
	// Refactor compares behaviour, speed, memory and size before and after.
	Refactor *RefactorMetrics `json:"refactor,omitempty"`
	// Tests is the harness's final test run (app mode).
	Tests *TestRun `json:"tests,omitempty"`
	// Previews are the servers an app run left listening, to open after
	// it (Options.Previews).
	Previews []Preview `json:"previews,omitempty"`
	// LessonsShown are the lessons of earlier runs the model was shown;
	// LessonsUsed those of them that mattered (the run did what they say,
	// or their error came and did not come back after they were shown);
	// LessonsLearned those this run taught.
	LessonsShown   []LessonRef `json:"lessons_shown,omitempty"`
	LessonsUsed    []LessonRef `json:"lessons_used,omitempty"`
	LessonsLearned []LessonRef `json:"lessons_learned,omitempty"`
}

// Check is one run of a program by the harness.
type Check struct {
	Command  string `json:"command"`
	Status   string `json:"status"`
	Output   string `json:"output"`
	ErrorSig string `json:"error,omitempty"`
}

// run is the state of one Run.
type run struct {
	opts     Options
	log      *slog.Logger
	ws       *workspace.Workspace
	step     int
	usage    llm.Usage
	start    time.Time
	before   map[string]string // text files at the start
	ranOK    bool              // the last execution succeeded
	executed bool
	repro    *Check
	verified *Check
	failures map[string]int // identical failing actions
	metrics  *RefactorMetrics
	tests    *TestRun
	netSeen  int         // egress log entries already recorded (dropped ones included)
	used     []LessonRef // lessons shown
	tools    *tools.Set
}

// Run runs the loop to its end and returns the report. The error is for a
// run that could not start (bad options, no workspace); everything that
// happens after (the model failing, budgets, cancellation) is in the
// report's status.
func Run(ctx context.Context, o *Options) (*Report, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.Provider == nil || opts.Session == nil {
		return nil, errors.New("agent: a provider and a session are required")
	}
	if strings.TrimSpace(opts.Task) == "" && NeedsTask(opts.Mode) {
		return nil, &ArgumentError{"task", errors.New("describe the task")}
	}
	if strings.TrimSpace(opts.Task) == "" && opts.Mode == ModeRefactor {
		opts.Task = RefactorTask
	}
	if opts.MaxSteps == 0 {
		opts.MaxSteps = 25
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Minute
	}
	if opts.ExecTimeout == 0 {
		opts.ExecTimeout = 120 * time.Second
	}
	if opts.MaxExecTimeout == 0 {
		opts.MaxExecTimeout = 10 * time.Minute
	}
	if opts.MaxOutputBytes == 0 {
		opts.MaxOutputBytes = 8000
	}
	if opts.Mode == "" {
		opts.Mode = ModeGenerate
	}
	r := &run{opts: opts, log: opts.Logger, start: time.Now(), failures: map[string]int{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	ws, err := openWorkspace(opts.Session.Workspace())
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	r.ws = ws
	if r.tools, err = r.newToolSet(); err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(opts.Files))
	for p := range opts.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if _, err := ws.Write(p, strings.NewReader(string(opts.Files[p]))); err != nil {
			return nil, fmt.Errorf("put %s into the workspace: %w", p, err)
		}
	}
	switch opts.Mode {
	case ModeDebug:
		if err := r.pickEntry(paths); err != nil {
			return nil, err
		}
	case ModeRefactor:
		if len(opts.Checks) == 0 && opts.Entry == "" {
			_ = r.pickEntry(paths) // one .py file is the program to compare; tests may do instead
		} else if opts.Entry != "" {
			if err := r.pickEntry(paths); err != nil {
				return nil, err
			}
		}
	}
	r.before = r.snapshot()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	r.emit(Event{Type: EventStarted, Text: opts.Task})
	if pk, ok := opts.Provider.(interface{ PriceKnown() bool }); ok && opts.MaxCost > 0 && !pk.PriceKnown() {
		// Said at the start: otherwise the budget the user set would silently never end the run.
		r.emit(Event{Type: EventNotice, Text: fmt.Sprintf("the cost budget ($%.2f) is not enforced: no price is known for %s; bound the run with --max-tokens (max_tokens), or give its price with --prices FILE", opts.MaxCost, opts.Provider.Info())})
	}
	rep := r.loop(ctx)
	r.learnLessons(ctx, rep)
	rep.Steps, rep.Usage, rep.Model, rep.Mode = r.step, r.usage, opts.Provider.Info().String(), opts.Mode
	rep.Duration = time.Since(r.start)
	rep.Reproduction, rep.Verification, rep.Refactor, rep.Tests = r.repro, r.verified, r.metrics, r.tests
	after := r.snapshot()
	rep.Diff = diffSnapshots(r.before, after)
	rep.Files = r.fileList()
	if opts.Mode == ModeApp && opts.Previews != nil {
		// Asked even after the run's deadline: its servers still listen.
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		rep.Previews = opts.Previews(pctx)
		pcancel()
	}
	r.emit(Event{Type: EventFinished, Report: rep})
	return rep, nil
}

// networkLogger is a session with an egress allowlist (session.Session).
type networkLogger interface{ NetworkLog() *egress.Log }

// emitNetwork records the connections the sandbox made through its egress
// proxy since the last call (the run's history keeps them).
func (r *run) emitNetwork() {
	nl, ok := r.opts.Session.(networkLogger)
	if !ok {
		return
	}
	l := nl.NetworkLog()
	if l == nil {
		return
	}
	seen := r.netSeen - l.Dropped
	if seen < 0 {
		seen = 0
	}
	if seen >= len(l.Entries) {
		return
	}
	r.netSeen = l.Dropped + len(l.Entries)
	r.emit(Event{Type: EventNetwork, Network: l.Entries[seen:]})
}

func (r *run) emit(e Event) {
	if r.opts.OnEvent == nil {
		return
	}
	e.Step = r.step
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	r.opts.OnEvent(e)
}

func (r *run) loop(ctx context.Context) *Report {
	msgs := []llm.Message{{Role: llm.RoleSystem, Text: r.recallLessons(ctx, systemPrompt(r.opts.Mode)+environmentPrompt(r.opts.Session))}}
	first, err := r.firstMessage(ctx)
	if err != nil {
		return r.ended(ctx, err)
	}
	msgs = append(msgs, llm.Message{Role: llm.RoleUser, Text: first})
	defs := r.toolDefs()
	textOnly := 0
	for {
		if err := ctx.Err(); err != nil {
			return r.ended(ctx, err)
		}
		if r.step >= r.opts.MaxSteps {
			return &Report{Status: StatusBudgetExceeded, Error: fmt.Sprintf("the step limit (%d) was reached before the task was finished", r.opts.MaxSteps)}
		}
		r.step++
		resp, err := r.opts.Provider.Complete(ctx, llm.Request{Messages: msgs, Tools: defs,
			OnText:    func(d string) { r.emit(Event{Type: EventText, Text: d}) },
			OnAttempt: func(int) { r.emit(Event{Type: EventModelWait}) },
			OnRetry: func(rt llm.Retry) {
				r.emit(Event{Type: EventModelRetry, Text: rt.String(), Retry: &RetryInfo{
					Attempt: rt.Attempt, MaxAttempts: rt.MaxAttempts, DelayMS: rt.Delay.Milliseconds(),
					Reason: string(rt.Reason), Status: rt.Status,
				}})
			},
		})
		if err != nil {
			return r.ended(ctx, err)
		}
		r.usage = r.usage.Add(resp.Usage)
		u := resp.Usage
		r.emit(Event{Type: EventUsage, Usage: &u})
		msg := resp.Message
		msg.Role = llm.RoleAssistant
		msgs = append(msgs, msg)
		r.emit(Event{Type: EventAssistant, Text: msg.Text})
		if over := r.overBudget(); over != "" {
			return &Report{Status: StatusBudgetExceeded, Error: over}
		}
		if len(msg.ToolCalls) == 0 {
			textOnly++
			if textOnly >= 3 {
				return &Report{Status: StatusStuck, Error: "the model kept answering without calling a tool or finish"}
			}
			note := "Continue by calling a tool. When the task is complete and verified, call finish with a summary."
			r.emit(Event{Type: EventNotice, Text: note})
			msgs = append(msgs, llm.Message{Role: llm.RoleUser, Text: note})
			continue
		}
		textOnly = 0
		var done *Report
		for _, call := range msg.ToolCalls {
			r.emit(Event{Type: EventToolCall, ToolCallID: call.ID, Tool: call.Name, Arguments: call.Arguments})
			var o outcome
			if done != nil {
				o = outcome{Text: "not run: the run already finished", IsError: true}
			} else {
				o = r.runTool(ctx, call)
			}
			if err := ctx.Err(); err != nil {
				return r.ended(ctx, err)
			}
			if note, stuck := r.checkStuck(call, o); stuck {
				return &Report{Status: StatusStuck, Error: note}
			} else if note != "" {
				o.Text += "\n\n" + note
				r.emit(Event{Type: EventNotice, Text: note})
			}
			r.emit(Event{Type: EventToolResult, ToolCallID: call.ID, Tool: call.Name, Text: o.Text, IsError: o.IsError, Result: o.Exec, Images: len(o.Images), Changed: o.Changed})
			r.emitNetwork()
			msgs = append(msgs, llm.Message{Role: llm.RoleTool, ToolCallID: call.ID, Text: o.Text, Images: o.Images, IsError: o.IsError})
			if o.Finish != nil && done == nil {
				done = &Report{Status: StatusDone, Summary: o.Finish.Summary, RootCause: o.Finish.RootCause}
			}
		}
		if done != nil {
			return done
		}
	}
}

// ended turns the error that stopped the loop into a report.
func (r *run) ended(ctx context.Context, err error) *Report {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return &Report{Status: StatusTimeout, Error: fmt.Sprintf("the run's time limit (%s) passed", r.opts.Timeout)}
	case errors.Is(err, context.Canceled):
		return &Report{Status: StatusCancelled, Error: "the run was cancelled"}
	}
	return &Report{Status: StatusFailed, Error: err.Error()}
}

func (r *run) overBudget() string {
	if r.opts.MaxTokens > 0 && r.usage.InputTokens+r.usage.OutputTokens > r.opts.MaxTokens {
		return fmt.Sprintf("the token budget (%d) was used up", r.opts.MaxTokens)
	}
	if r.opts.MaxCost > 0 && r.usage.Cost > r.opts.MaxCost {
		return fmt.Sprintf("the cost budget ($%.4f) was used up", r.opts.MaxCost)
	}
	return ""
}

// checkStuck counts identical failing actions, refused finish calls
// included: the second time it nudges the model to change approach; the
// third time the run stops. A finish call counts with the refusal's text,
// so one refused again for the same reason is the same action, while one
// refused after the work changed (another failure shown) is not.
func (r *run) checkStuck(call llm.ToolCall, o outcome) (string, bool) {
	if !o.IsError || o.Declined {
		return "", false
	}
	key := call.Name + "\x00" + canonicalJSON(call.Arguments)
	if call.Name == ToolFinish {
		key += "\x00" + o.Text
	}
	r.failures[key]++
	what := "failing " + call.Name
	if call.Name == ToolFinish {
		what = "refused finish"
	}
	switch n := r.failures[key]; {
	case n >= 3:
		return fmt.Sprintf("the model repeated the same %s call %d times", what, n), true
	case n == 2:
		return "NOTE: you made exactly this call before and it failed the same way. Repeating it will not help: read the error, change your approach (different code, inspect the data or files, or simplify), then try again.", false
	}
	return "", false
}

func canonicalJSON(s string) string {
	var v any
	if json.Unmarshal([]byte(s), &v) != nil {
		return strings.TrimSpace(s)
	}
	b, _ := json.Marshal(v) // map keys come out sorted
	return string(b)
}
