package agent

import (
	"context"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/llm"
)

// EventLessons says which lessons of earlier runs the model was shown:
// Text is "start" (in the system prompt) or "seen_before" (appended to a
// failing tool result), Lessons lists them.
const EventLessons = "lessons"

// LessonRef names a lesson a run was shown or learned.
type LessonRef struct {
	ID    string `json:"id"`
	Scope string `json:"scope,omitempty"`
	Text  string `json:"text"`
}

// Execution is one finished execute_python or run_shell call.
type Execution struct {
	Step int
	Tool string
	// Code is the cell, or run_shell's command.
	Code   string
	Result *kernel.Result
	// Files returns the workspace's text files as they are now; it reads
	// the workspace, so it is called only when needed.
	Files func() map[string]string
}

// Lessons is a run's view of what earlier runs learned, and where it puts
// what this run learns (internal/lessons implements it).
type Lessons interface {
	// Recall returns the section of the system prompt holding the lessons
	// for this task, files and mode ("" for none), and those lessons.
	Recall(ctx context.Context, task string, mode Mode, files map[string][]byte) (prompt string, shown []LessonRef)
	// Executed sees every execution. For a failure whose error a lesson
	// was made for, it returns the note to append to the tool result and
	// that lesson.
	Executed(ctx context.Context, x Execution) (note string, shown []LessonRef)
	// Learn turns what the run learned into lessons and stores them, and
	// sets rep.LessonsUsed to the lessons shown that mattered. p is
	// the run's model for one small distilling call, or nil to skip it
	// (the budget is spent): a fallback then writes the lessons. usage is
	// the call's.
	Learn(ctx context.Context, p llm.Provider, rep *Report) (learned []LessonRef, usage llm.Usage)
}

// recallLessons puts the lessons for the task into the system prompt.
func (r *run) recallLessons(ctx context.Context, system string) string {
	if r.opts.Lessons == nil {
		return system
	}
	prompt, shown := r.opts.Lessons.Recall(ctx, r.opts.Task, r.opts.Mode, r.opts.Files)
	if prompt == "" {
		return system
	}
	r.used = append(r.used, shown...)
	r.emit(Event{Type: EventLessons, Text: "start", Lessons: shown})
	return system + "\n\n" + prompt
}

// seeExecution shows the lesson book an execution and appends what it
// recalls to a failing result.
func (r *run) seeExecution(ctx context.Context, call llm.ToolCall, src string, o outcome) outcome {
	if r.opts.Lessons == nil || o.Exec == nil {
		return o
	}
	note, shown := r.opts.Lessons.Executed(ctx, Execution{Step: r.step, Tool: call.Name, Code: src, Result: o.Exec, Files: r.snapshot})
	if note == "" {
		return o
	}
	r.used = append(r.used, shown...)
	r.emit(Event{Type: EventLessons, Text: "seen_before", ToolCallID: call.ID, Lessons: shown})
	o.Text += "\n\n" + note
	return o
}

// learnLessons distils the run's lessons into the report, counting the
// model call in the run's usage. The call is skipped (the fallback writes
// the lessons) once a budget is spent, or when the run was cancelled or
// ended because the model failed.
func (r *run) learnLessons(ctx context.Context, rep *Report) {
	seen := map[string]bool{}
	for _, l := range r.used {
		if !seen[l.ID] {
			seen[l.ID] = true
			rep.LessonsShown = append(rep.LessonsShown, l)
		}
	}
	if r.opts.Lessons == nil {
		return
	}
	p := r.opts.Provider
	switch {
	case r.overBudget() != "", ctx.Err() != nil:
		p = nil
	case rep.Status == StatusCancelled, rep.Status == StatusBudgetExceeded, rep.Status == StatusFailed: // the user stopped it, or the model is failing
		p = nil
	}
	learned, u := r.opts.Lessons.Learn(context.WithoutCancel(ctx), p, rep)
	rep.LessonsLearned = learned
	if u != (llm.Usage{}) {
		r.usage = r.usage.Add(u)
		r.emit(Event{Type: EventUsage, Usage: &u, Text: "lessons"})
	}
}
