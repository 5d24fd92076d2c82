package webui

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// shown is a JS function telling whether the element sel selects is on
// the page and displayed (not hidden, nor inside something hidden).
const shown = `(sel => { const e = document.querySelector(sel); return !!e && e.getClientRects().length > 0; })`

// until waits for the JS expression js to be true.
func (p *page) until(what, js string) {
	p.t.Helper()
	p.do(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(30*time.Second)))
}

func (p *page) shown(sel string) bool {
	p.t.Helper()
	return eval[bool](p, shown+"("+jsString(sel)+")")
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowserServerInfo: the run form names the model before a task is
// typed (or says how to configure one), and "Set token" is offered only
// where the server wants a token.
func TestBrowserServerInfo(t *testing.T) {
	t.Run("token and model", func(t *testing.T) {
		ts := newServer(t, testToken, nil)
		p := newPage(t, 1280, 900)
		p.do("open", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))
		p.until("model named", `document.getElementById('run-model-note').textContent.includes('openai-compatible/gpt-4o-mini')`)
		if got := eval[string](p, `document.getElementById('run-task').value`); got != "" {
			t.Errorf("task %q: the model should be named before any is typed", got)
		}
		p.until("server asked", `document.getElementById('token-button').dataset.required !== undefined`)
		if !p.shown("#token-button") {
			t.Error("a server with tokens: the token button is hidden")
		}
		if got := p.text("#token-button"); got != "Token ✓" {
			t.Errorf("token button %q", got)
		}
		p.check(ts.URL)
	})
	t.Run("no token, no model", func(t *testing.T) {
		ts := newServerWithModel(t, "", func(context.Context, string) (llm.Provider, error) { return nil, &llm.NoModelError{} })
		p := newPage(t, 1280, 900)
		p.do("open", chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))
		p.until("no model said", `document.getElementById('run-model-note').textContent.includes('no model configured: set SANDLOOP_MODEL or --model')`)
		if !p.shown("#run-model-note") {
			t.Error("the note on the model is not shown")
		}
		p.until("server asked", `document.getElementById('token-button').dataset.required !== undefined`)
		if p.shown("#token-button") {
			t.Errorf("a server without tokens: the page offers %q", p.text("#token-button"))
		}
		p.check(ts.URL)
	})
}

// TestBrowserNoDownloadWithoutFiles: "Download files" is offered only for
// a run that left files, and "Download workspace" only for a session
// workspace with files in it.
func TestBrowserNoDownloadWithoutFiles(t *testing.T) {
	ts := newServer(t, "", llmtest.Script{
		// Run 1 writes nothing.
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "print(6 * 7)")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"printed 42"}`}}},
		// Run 2 writes a file.
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "open('answer.txt', 'w').write('42')")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"wrote answer.txt"}`}}},
	})
	p := newPage(t, 1280, 900)
	start := func(task string) {
		t.Helper()
		p.do("start "+task, chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
			chromedp.SendKeys(chromedp.CSS("#run-task"), task), chromedp.Click(chromedp.CSS("#run-start")),
			chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
	}
	start("print 6*7")
	// Reloaded too: the button follows the recorded report.
	for _, how := range []string{"live", "reloaded"} {
		if how == "reloaded" {
			p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
			p.until("report replayed", `!document.getElementById('report').hidden`)
		}
		if p.shown("#run-download") {
			t.Errorf("%s: a run without files offers to download them", how)
		}
	}
	start("write the answer")
	p.until("download offered", shown+`('#run-download')`)

	// A new session's workspace is empty: nothing to download until a file is there.
	p.do("notebook", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")), chromedp.WaitVisible(chromedp.CSS("#file-list .empty")))
	if p.shown("#files-archive") {
		t.Error("an empty workspace offers to download it")
	}
	sel := chromedp.CSS(".cell textarea")
	p.do("write a file", chromedp.SetValue(sel, "open('a.txt', 'w').write('hi')"), chromedp.Focus(sel),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.WaitVisible(chromedp.Search(`//ul[@id="file-list"]//span[text()="a.txt"]`)))
	if !p.shown("#files-archive") {
		t.Error("a workspace with a file does not offer to download it")
	}
	p.check(ts.URL)
}

// TestBrowserSessionGone: the notebook of a session that no longer exists
// says so and shows none of the controls that cannot work.
func TestBrowserSessionGone(t *testing.T) {
	ts := newServer(t, "", nil)
	p := newPage(t, 1280, 900)
	controls := []string{"#nb-run-all", "#nb-interrupt", "#nb-restart", "#nb-close", "#nb-add", ".cell .cell-run", "#file-upload"}
	p.do("new session", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")))
	for _, c := range controls {
		if !p.shown(c) {
			t.Errorf("a live session: %s is hidden", c)
		}
	}
	id := eval[string](p, `decodeURIComponent(location.hash.split('/')[2])`)
	del := func() {
		t.Helper()
		req, _ := http.NewRequest("DELETE", ts.URL+"/v1/sessions/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode/100 != 2 {
			t.Fatalf("delete the session: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	check := func(how string) {
		t.Helper()
		p.until(how+": gone said", shown+`('#nb-gone')`)
		if got := p.text("#nb-gone"); !strings.Contains(got, "This session no longer exists") {
			t.Errorf("%s: note %q", how, got)
		}
		for _, c := range controls {
			if p.shown(c) {
				t.Errorf("%s: the ended session still shows %s", how, c)
			}
		}
	}
	// Ended while the page is open: the next cell finds out.
	del()
	sel := chromedp.CSS(".cell textarea")
	p.do("run a cell", chromedp.SetValue(sel, "1 + 1"), chromedp.Focus(sel),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)))
	check("while open")
	// Opened afterwards (a bookmark, the history).
	p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#nb-title")))
	check("reopened")
	p.check(ts.URL)
}
