package tools

import (
	"context"
	"fmt"
	"strings"
)

// Checkpoint is a checkpoint as the lifecycle tools tell the model of it.
type Checkpoint struct {
	ID             string
	Name           string
	ExecutionCount int
	MemoryBytes    int64
	FileBytes      int64
	Files          int
	NotCarried     []string
}

// Restored is what came back at a restore, an undo or a fork.
type Restored struct {
	From           string
	Files          int
	Variables      []string
	NotRestored    []string
	ExecutionCount int
	// Lost says what else did not come back: what was done after the
	// snapshot a session lost with its processes came back from.
	Lost string
}

// Checkpointer is a Session that checkpoint and undo work on.
type Checkpointer interface {
	// Checkpoint takes a checkpoint named name (which may be empty).
	Checkpoint(ctx context.Context, name string) (*Checkpoint, error)
	// Restore puts the session back at checkpoint id; "" undoes the last
	// execution (the newest automatic checkpoint).
	Restore(ctx context.Context, id string) (*Restored, error)
}

// Forker is a Session that fork_session works on: the call continues in
// a copy of the session, the session it leaves is kept.
type Forker interface {
	// Fork makes a copy of the session and makes it the current one; it
	// returns the copy's id and the id of the session left.
	Fork(ctx context.Context) (child, parent string, r *Restored, err error)
	// SwitchTo makes the kept session id the current one again.
	SwitchTo(ctx context.Context, id string) error
}

// restoredText tells the model what came back and, above all, what did not.
func restoredText(r *Restored) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Restored from %s: %s in /workspace, execution count %d.", r.From, plural(r.Files, "file"), r.ExecutionCount)
	if len(r.Variables) > 0 {
		fmt.Fprintf(&b, "\nVariables back: %s.", strings.Join(r.Variables, ", "))
	}
	if len(r.NotRestored) > 0 {
		b.WriteString("\nNOT restored (recreate them if you need them):")
		for _, n := range r.NotRestored {
			b.WriteString("\n- " + n)
		}
	}
	if r.Lost != "" {
		b.WriteString("\nLost (redo it if you need it): " + r.Lost + ".")
	}
	return b.String()
}

// WokeNote tells the model that the session it works in had been put to
// sleep on a snapshot and was woken for its call, and what came back.
func WokeNote(r *Restored) string {
	return "note: this sandbox session had been put to sleep on a snapshot (idle too long, or its processes were lost) and was woken for this call. " + restoredText(r)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
