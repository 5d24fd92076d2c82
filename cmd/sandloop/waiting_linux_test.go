package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// slowModel is a model server that is rate limited once, then takes 4s to
// answer its first step: the indicator's "2s" has about two seconds to be
// drawn (a redraw every 250 ms), however late a loaded machine wakes it.
func slowModel(t *testing.T) {
	useModel(t, llmtest.Script{
		{Status: 429, RetryAfter: "1"},
		{Delay: 4 * time.Second, ToolCalls: tc("execute_python", `{"code":"print(6*7)"}`)},
		{ToolCalls: tc("finish", `{"summary":"printed 42"}`)},
	})
}

const retrySentence = "rate limited by the model server, retrying in 1s (attempt 2/4)"

// TestAgentWaitIndicatorOnTerminal: on a terminal, the wait for the model
// shows a live indicator with the elapsed time, redrawn in place and cleared
// when output arrives; the retry says why.
func TestAgentWaitIndicatorOnTerminal(t *testing.T) {
	slowModel(t)
	master, tty := openPty(t)
	cmd := cliCommand(t.Context(), "agent", "t", "--data-dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = tty, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	out := readPty(master)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	out.drained()
	out.waitFor(t, "sandloop: run ", 1)
	s := out.String()
	if !strings.Contains(s, "↻ "+retrySentence) {
		t.Errorf("no retry sentence:\n%q", s)
	}
	// Redrawn in place: each drawing starts by going back to the line's start
	// and erasing it; the seconds count up; after the retry the attempt is said.
	for _, want := range []string{"\r\x1b[K\x1b[2mwaiting for the model · 0s · attempt 2/4\x1b[0m", "waiting for the model · 1s · attempt 2/4", "waiting for the model · 2s · attempt 2/4"} {
		if !strings.Contains(s, want) {
			t.Errorf("the terminal lacks %q:\n%q", want, s)
		}
	}
	// The indicator is gone before the next output: the last drawing is
	// erased before the step's output begins.
	last := strings.LastIndex(s, "waiting for the model")
	step := strings.Index(s, "── step 1 · execute_python")
	if step < last || !strings.Contains(s[last:step], "\r\x1b[K") {
		t.Errorf("the indicator was not cleared before the output:\n%q", s[max(last-20, 0):])
	}
}

// TestAgentWaitPlain: without a terminal only the retry's sentence is added.
func TestAgentWaitPlain(t *testing.T) {
	slowModel(t)
	code, stdout, stderr := sandloop(t, "", "agent", "t", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "↻ "+retrySentence+"\n") {
		t.Errorf("no retry sentence:\n%s", stdout)
	}
	if strings.Contains(stdout+stderr, "waiting for the model") || strings.Contains(stdout+stderr, "\r") {
		t.Errorf("an indicator without a terminal:\n%q\n%q", stdout, stderr)
	}
}
