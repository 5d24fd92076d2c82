package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/kernel"
)

// A run that ends in the middle of a step (cancelled, out of time) still shows
// the tail of that step's output, which the view held back.
func TestTerminalViewFlushesTheTailAtTheEnd(t *testing.T) {
	var b strings.Builder
	v := newTerminalView(&b, false)
	v.event(agent.Event{Type: agent.EventToolCall, Step: 1, Tool: agent.ToolRunShell, Arguments: `{"command":"seq 1 100"}`})
	for i := 1; i <= 100; i++ {
		v.event(agent.Event{Type: agent.EventOutput, Exec: &kernel.Event{Type: kernel.EventStdout, Text: fmt.Sprintf("%d\n", i)}})
	}
	v.event(agent.Event{Type: agent.EventFinished, Report: &agent.Report{Status: agent.StatusCancelled, Steps: 1}})
	out := b.String()
	for _, want := range []string{"\n40\n", "… 50 more lines", "\n91\n", "\n100\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "\n100\n") > strings.Index(out, "══ cancelled") {
		t.Errorf("the tail comes after the report:\n%s", out)
	}
}
