package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// onTerminal runs `sandloop args...` with stdin, stdout and stderr on a
// pseudo-terminal, as a person at a terminal runs it, types input and
// returns the exit code and what the terminal showed: colours and the
// redrawn "waiting for the model" line removed, lines ended by "\n".
func onTerminal(t *testing.T, dir, input string, args ...string) (int, string) {
	t.Helper()
	master, tty := openPty(t)
	cmd := cliCommand(t.Context(), args...)
	cmd.Env = append(cmd.Env, "TERM=xterm")
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	out := readPty(master)
	if input != "" {
		master.Write([]byte(input))
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%v\n%s", err, out.String())
	}
	out.drained()
	return cmd.ProcessState.ExitCode(), screen(out.String())
}

var (
	reANSI    = regexp.MustCompile("\x1b\\[[0-9;?]*[A-Za-z]")
	reWaiting = regexp.MustCompile(`\r?waiting for the model · \d+s( · [^\r\n]*)?`)
)

// screen is what a terminal's output reads as text.
func screen(s string) string {
	s = reANSI.ReplaceAllString(s, "")
	s = reWaiting.ReplaceAllString(s, "")
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "")
}

// clip keeps a long text's first and last lines, for a failure message.
func clip(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) <= 80 {
		return s
	}
	return strings.Join(lines[:60], "\n") + fmt.Sprintf("\n[... %d lines ...]\n", len(lines)-80) + strings.Join(lines[len(lines)-20:], "\n")
}

// On a terminal an agent run shows no log lines (issue 31.8), a step's long
// output as its head and tail with where the rest is (31.9), and a run that
// left no files says so rather than where its files are (31.19).
func TestAgentOnATerminal(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("run_shell", `{"command":"seq 1 200000"}`)},
		{ToolCalls: tc("finish", `{"summary":"counted"}`)},
	})
	data := t.TempDir()
	code, out := onTerminal(t, t.TempDir(), "", "agent", "count to 200000", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, clip(out))
	}
	// slog's text and default handlers: "level=INFO msg=…", "2026/12/05 10:00:00 INFO …".
	if m := regexp.MustCompile(`(?m)level=|msg=|^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d |zygote`).FindString(out); m != "" {
		t.Errorf("a log line (%q) on the terminal:\n%s", m, clip(out))
	}
	if n := strings.Count(out, "\n"); n > 100 {
		t.Errorf("the terminal got %d lines, want the step's head and tail only:\n%s", n, clip(out))
	}
	for _, want := range []string{"── step 1 · run_shell", "$ seq 1 200000", "\n1\n2\n", "\n40\n", "… 199950 more lines (sandloop runs show --full has them)", "\n199991\n", "\n200000\n", "✓ ok", "══ done after 2 steps", "sandloop: the run left no files"} {
		if !strings.Contains(out, want) {
			t.Errorf("the terminal lacks %q:\n%s", want, clip(out))
		}
	}
	if strings.Contains(out, "\n41\n") || strings.Contains(out, "\n199990\n") {
		t.Errorf("lines beyond the head and tail:\n%s", clip(out))
	}
	if strings.Contains(out, "runs export") {
		t.Errorf("the footer points at files the run did not leave:\n%s", clip(out))
	}
	// The pointer holds: runs show --full has every line the terminal left
	// out, not only the head and tail the model read.
	_, ls, _ := sandloop(t, "", "runs", "ls", "--data-dir", data)
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	_, full, _ := sandloop(t, "", "runs", "show", "--full", id, "--data-dir", data)
	for _, n := range []string{"41", "100000", "199990"} {
		if !regexp.MustCompile(`(?m)^\s*` + n + `$`).MatchString(full) {
			t.Errorf("runs show --full lacks line %s, which the terminal left out:\n%s", n, clip(full))
		}
	}
}

// An agent run on a terminal in debug mode shows the crash it reproduced
// before the model's first step (issue 31.12), and a bad model is refused
// before anything starts, in one line (31.8).
func TestAgentOnATerminalDebugAndBadModel(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("edit_file", `{"path":"crash.py","old_text":"return a / b","new_text":"return a / b if b else 0.0"}`)},
		{ToolCalls: tc("finish", `{"summary":"guarded the division","root_cause":"ratio() divides by a zero count"}`)},
	})
	dir := t.TempDir()
	writeFile(t, dir, "crash.py", "def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n")
	code, out := onTerminal(t, dir, "", "agent", "--mode", "debug", "-f", "crash.py", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	crash, step1 := strings.Index(out, "ZeroDivisionError: division by zero"), strings.Index(out, "── step 1")
	if crash < 0 || step1 < 0 || crash > step1 || !strings.Contains(out[:step1], "── reproduce\n$ python3 crash.py") || !strings.Contains(out[:step1], "the crash to fix") {
		t.Errorf("the reproduced crash is not shown before step 1:\n%s", out)
	}
	if strings.Contains(out, "level=") {
		t.Errorf("log lines:\n%s", out)
	}

	code, out = onTerminal(t, dir, "", "agent", "t", "--model", "nosuch/x", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(out, `unknown model provider "nosuch"`) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("a bad model: exit %d, the terminal shows:\n%s", code, out)
	}
}

// The REPL on a terminal says on exit what it deletes, and with --out where
// it kept the workspace (issue 31.15).
func TestReplOnATerminalSaysWhatItDeletes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "notes.txt", "hello\n")
	code, out := onTerminal(t, dir, "open('a.py', 'w').write('x = 1\\n')\rexit()\r", "repl", "--history", "", "--with", "notes.txt")
	if code != 0 || !strings.Contains(out, "sandloop: deleting the workspace (2 file(s), 12 bytes: a.py, notes.txt); keep it next time with --out DIR") {
		t.Errorf("exit %d; the terminal does not say what is deleted:\n%s", code, out)
	}
	kept := filepath.Join(dir, "kept")
	code, out = onTerminal(t, dir, "open('a.py', 'w').write('x = 1\\n')\rexit()\r", "repl", "--history", "", "--out", kept)
	if code != 0 || !strings.Contains(out, "sandloop: copied the workspace (1 file(s)") || !strings.Contains(out, kept) {
		t.Errorf("exit %d; the terminal does not say where the workspace went:\n%s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(kept, "a.py")); err != nil || string(b) != "x = 1\n" {
		t.Errorf("--out: %q %v", b, err)
	}
}
