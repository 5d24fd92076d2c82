package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// TestAgentFiguresWrittenAndShown: the plots a run's executions made are
// written as PNG files under the data dir, and their paths are printed at the
// end of `sandloop agent` and by `runs show` (which writes them again if
// they were removed: the history keeps them). Through the built binary.
func TestAgentFiguresWrittenAndShown(t *testing.T) {
	plot := func(label string) string {
		return `{"code":"import matplotlib.pyplot as plt\nplt.plot([1, 3, 2], label='` + label + `')\nplt.show()"}`
	}
	useModel(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: plot("a")}, {Name: "execute_python", Arguments: plot("b")}}},
		{ToolCalls: tc("execute_python", `{"code":"print('no figure here')"}`)},
		{ToolCalls: tc("execute_python", plot("c"))},
		{ToolCalls: tc("finish", `{"summary":"plotted three lines"}`)},
	})
	work, data := t.TempDir(), "data" // relative: the printed paths are absolute all the same
	code, stdout, stderr := binary(t, work, "", "agent", "plot", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	_, ls, _ := binary(t, work, "", "runs", "ls", "--data-dir", data)
	id := strings.Fields(strings.Split(ls, "\n")[1])[0]
	dir := filepath.Join(work, data, "figures", id)
	want := []string{"step-1-1.png", "step-1-2.png", "step-3-1.png"}
	if !strings.Contains(stderr, "figures of the run's executions, written to "+dir+":\n") {
		t.Errorf("sandloop agent does not say where the figures are (%s):\n%s", dir, stderr)
	}
	for _, name := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s: not a PNG (%v)", name, err)
		}
		if !strings.Contains(stderr, "  "+name+" (step ") {
			t.Errorf("sandloop agent does not list %s:\n%s", name, stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != len(want) {
		t.Errorf("%d files in %s, want %d", len(entries), dir, len(want))
	}
	// runs show gives each figure's path with its step, writing the files
	// again if they are gone.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	code, show, stderr := binary(t, work, "", "runs", "show", id, "--data-dir", data)
	if code != 0 {
		t.Fatalf("runs show: exit %d %s", code, stderr)
	}
	for _, name := range want {
		p := filepath.Join(dir, name)
		if !strings.Contains(show, "    figure: "+p+"\n") {
			t.Errorf("runs show lacks the figure %s:\n%s", p, show)
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("runs show did not write %s again: %v", p, err)
		}
	}
	// Each figure is shown under the execution that made it.
	if i, j := strings.Index(show, "step-3-1.png"), strings.Index(show, "no figure here"); j < 0 || i < j {
		t.Errorf("step 3's figure comes before step 2's output:\n%s", show)
	}
}
