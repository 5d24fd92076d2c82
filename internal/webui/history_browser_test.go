package webui

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/session"
)

// TestBrowserHistory: the notebook's History panel lists what happened
// to the session (how it was created, a pause and resume made over the
// API, a kernel that died in a cell, its restart), and once the session
// is deleted elsewhere, the notebook says it is gone, when, and why.
func TestBrowserHistory(t *testing.T) {
	mgr := session.NewManager(&session.ManagerOptions{})
	t.Cleanup(func() { mgr.Close() })
	ts := serve(t, "", mgr, nil, nil)
	p := newPage(t, 1366, 900)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.CSS("#ev-panel")))
	id := strings.TrimPrefix(eval[string](p, "location.hash"), "#/notebook/")
	p.until("the creation listed", `document.querySelector('#ev-list li[data-type=created]')?.textContent.includes('Created')`)

	for _, verb := range []string{"pause", "resume"} {
		resp, err := http.Post(ts.URL+"/v1/sessions/"+id+"/"+verb, "application/json", nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", verb, resp, err)
		}
		resp.Body.Close()
	}
	p.until("the pause and the resume listed", `[...document.querySelectorAll('#ev-list li')].map(e => e.dataset.type).join() == 'created,paused,resumed'`)
	// A pause made elsewhere shows in the checkpoint strip's state too.
	resp, err := http.Post(ts.URL+"/v1/sessions/"+id+"/pause", "application/json", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("pause: %v %v", resp, err)
	}
	resp.Body.Close()
	p.until("the strip says paused", `document.getElementById('ck-state').textContent == 'paused'`)
	if got := p.text("#ev-list li[data-type=paused]"); !strings.Contains(got, "Paused") || !strings.Contains(got, "asked for") {
		t.Errorf("the pause's line: %q", got)
	}

	sel := chromedp.CSS(".cell:nth-child(1) textarea")
	p.do("a cell that kills its kernel", chromedp.SetValue(sel, "import os\nos._exit(3)"), chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(".cell:nth-child(1) .cell-status .badge")))
	p.until("the kernel's death listed", `document.querySelector('#ev-list li[data-type=kernel_died]')?.textContent.includes('exited with status 3')`)
	p.do("restart", chromedp.Click(chromedp.CSS("#nb-restart")))
	p.until("the restart listed", `!!document.querySelector('#ev-list li[data-type=kernel_restarted]')`)

	req, _ := http.NewRequest("DELETE", ts.URL+"/v1/sessions/"+id, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	p.do("refresh the files", chromedp.Click(chromedp.CSS("#files-refresh")))
	p.until("gone, saying why", `!document.getElementById('nb-gone').hidden && document.getElementById('nb-gone-why').textContent.includes('deleted by its owner')`)
	if got := eval[string](p, `document.getElementById('ck-state').textContent`); got != "closed" {
		t.Errorf("the strip's state after the close: %q", got)
	}
	p.shot("history")

	// A gateway says when a session deleted through it closed in words of
	// its own, without the host's "(its events: ...)": both are read.
	for msg, want := range map[string]string{
		"session a1 was closed at 2026-12-07T10:04:11Z: idle past the server's limit (its events: GET /v1/sessions/a1/events)": `{"at":"2026-12-07T10:04:11Z","reason":"idle past the server's limit"}`,
		"session a1 was closed at 2026-12-07T10:04:11Z: deleted by its owner":                                                  `{"at":"2026-12-07T10:04:11Z","reason":"deleted by its owner"}`,
		"session a1: not found": `null`,
	} {
		js := `import('/ui/js/history.js').then(m => JSON.stringify(m.closedInfo(` + strconv.Quote(msg) + `)))`
		got, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("closedInfo(%q) = %s, want %s", msg, got, want)
		}
	}
}
