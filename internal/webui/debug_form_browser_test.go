package webui

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// TestBrowserDebugRunForm: a debug run without its program is refused by
// the form, next to the field, and no run is made (issue 31.16); with the
// program and no task, the run is titled after it ("debug crash.py") in the
// run list and on its page (31.12).
func TestBrowserDebugRunForm(t *testing.T) {
	ts := newServer(t, "", llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "edit_file", Arguments: `{"path":"crash.py","old_text":"return a / b","new_text":"return a / b if b else 0.0"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"guarded the division","root_cause":"ratio() divides by zero"}`}}},
	})
	runsStored := func() int {
		resp, err := http.Get(ts.URL + "/v1/runs")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct{ Runs []json.RawMessage }
		json.NewDecoder(resp.Body).Decode(&list)
		return len(list.Runs)
	}
	p := newPage(t, 1280, 900)
	p.do("debug without a program",
		chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
		chromedp.SetValue(chromedp.CSS("#run-mode"), "debug"),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.querySelector('#run-mode').dispatchEvent(new Event('change'))`))
			return err
		}),
		chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS("#run-entry-error")))
	if msg := p.text("#run-entry-error"); !strings.Contains(msg, "program to debug") {
		t.Errorf("the form says %q next to the program's field", msg)
	}
	if n := runsStored(); n != 0 {
		t.Errorf("a debug run without its program was made: %d runs", n)
	}

	src := filepath.Join(t.TempDir(), "crash.py")
	os.WriteFile(src, []byte("def ratio(a, b):\n    return a / b\n\nprint(ratio(1, 0))\n"), 0o644)
	p.do("debug crash.py",
		chromedp.SetUploadFiles(chromedp.CSS("#run-files"), []string{src}),
		chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)),
		chromedp.WaitVisible(chromedp.CSS("#run-list .run-item .run-task")))
	if got := p.text("#run-list .run-item .run-task"); got != "debug crash.py" {
		t.Errorf("the run list titles the debug run %q, want \"debug crash.py\"", got)
	}
	if got := p.text("#run-title"); !strings.Contains(got, "debug crash.py") {
		t.Errorf("the run's page is titled %q", got)
	}
	if n := runsStored(); n != 1 {
		t.Errorf("%d runs stored, want 1", n)
	}
	p.check(ts.URL)
}
