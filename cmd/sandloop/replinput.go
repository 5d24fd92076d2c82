package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/peterh/liner"
)

// errInterrupted is Ctrl-C at the prompt: the cell being typed is dropped.
var errInterrupted = errors.New("interrupted")

// lineSource gives the REPL its input one line at a time.
type lineSource interface {
	// line shows prompt and returns the next line, errInterrupted, or an
	// error at the end of input.
	line(ctx context.Context, prompt string) (string, error)
	// remember adds a complete cell to the history.
	remember(cell string)
}

// pipeLines reads lines from a pipe or file, as python3 does when its
// stdin is not a terminal.
type pipeLines struct {
	out        io.Writer
	lines      chan string
	interrupts <-chan os.Signal
}

func newPipeLines(ctx context.Context, in io.Reader, out io.Writer, interrupts <-chan os.Signal) *pipeLines {
	p := &pipeLines{out: out, lines: make(chan string), interrupts: interrupts}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return p
}

func (p *pipeLines) line(ctx context.Context, prompt string) (string, error) {
	fmt.Fprint(p.out, prompt)
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", io.EOF
		}
		return l, nil
	case <-p.interrupts:
		return "", errInterrupted
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (p *pipeLines) remember(string) {}

// termLines edits lines on a terminal: arrow keys, history (kept in a
// file across sessions), Ctrl-R to search it.
type termLines struct {
	st      *liner.State
	history string
}

func newTermLines(history string) *termLines {
	t := &termLines{st: liner.NewLiner(), history: history}
	t.st.SetCtrlCAborts(true)
	t.st.SetMultiLineMode(true)
	t.st.SetTabCompletionStyle(liner.TabPrints)
	if history != "" {
		if f, err := os.Open(history); err == nil {
			_, _ = t.st.ReadHistory(f)
			f.Close()
		}
	}
	return t
}

func (t *termLines) line(ctx context.Context, prompt string) (string, error) {
	l, err := t.st.Prompt(prompt)
	if errors.Is(err, liner.ErrPromptAborted) {
		return "", errInterrupted
	}
	return l, err
}

func (t *termLines) remember(cell string) { t.st.AppendHistory(cell) }

// close restores the terminal and saves the history.
func (t *termLines) close() {
	if t.history != "" {
		if err := os.MkdirAll(filepath.Dir(t.history), 0o700); err == nil {
			if f, err := os.OpenFile(t.history, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err == nil {
				_, _ = t.st.WriteHistory(f)
				f.Close()
			}
		}
	}
	t.st.Close()
}
