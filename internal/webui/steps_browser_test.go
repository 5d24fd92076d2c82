package webui

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

// TestBrowserStepsWithLessons runs a two-step task that recalls a lesson
// first: the page counts the steps the run took (as the API and the run
// list do), not the lesson's place before the first step.
func TestBrowserStepsWithLessons(t *testing.T) {
	llmSrv := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "print(sum(range(10)))")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"The sum of 0..9 is 45."}`}}},
	})
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutLesson(context.Background(), store.Lesson{Text: "to sum a range of numbers use the builtin sum over range", Source: "user", Scope: "global"}); err != nil {
		t.Fatal(err)
	}
	mgr := session.NewManager(&session.ManagerOptions{})
	svc := runs.New(&runs.Options{Store: st, Lessons: st, NewSession: runs.ManagerSessions(mgr),
		Provider: func(ctx context.Context, model string) (llm.Provider, error) {
			return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: llmSrv.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
		}})

	t.Cleanup(func() {
		svc.Close()
		mgr.Close()
		st.Close()
	})
	ts := serve(t, "", mgr, svc, st)

	p := newPage(t, 1280, 900)
	p.do("start run", chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
		chromedp.SendKeys(chromedp.CSS("#run-task"), "sum the range of numbers 0 to 9"),
		chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)),
		chromedp.WaitVisible(chromedp.CSS(".callout-lesson")))
	id := strings.TrimPrefix(eval[string](p, "location.hash"), "#/runs/")
	resp, err := http.Get(ts.URL + "/v1/runs/" + id)
	if err != nil {
		t.Fatal(err)
	}
	var run struct {
		Steps int `json:"steps"`
	}
	json.NewDecoder(resp.Body).Decode(&run)
	resp.Body.Close()
	if run.Steps != 2 {
		t.Fatalf("the API says the run took %d steps, want 2", run.Steps)
	}
	stats := func() string {
		return eval[string](p, `[...document.querySelectorAll('dl.stats dt')].find(e => e.textContent === 'Steps').nextElementSibling.textContent`)
	}
	if got := stats(); got != "2" {
		t.Errorf("the run's header says %s steps, want 2", got)
	}
	p.do("list", chromedp.Poll[chromedp.Void](`document.querySelector('#run-list .run-item .run-steps')?.textContent === '2 steps'`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := eval[string](p, `document.querySelector('#timeline .step .step-label').textContent`); got != "Before the first step" {
		t.Errorf("the recalled lesson is filed under %q", got)
	}
	// Opened again (from the stored events, not live), the count is the same.
	p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)), chromedp.WaitVisible(chromedp.CSS(".callout-lesson")))
	if got := stats(); got != "2" {
		t.Errorf("reopened, the run's header says %s steps, want 2", got)
	}
	p.check(ts.URL)
}
