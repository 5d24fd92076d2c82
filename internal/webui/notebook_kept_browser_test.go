package webui

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/server"
)

// TestBrowserNotebookKept runs cells, then leaves for Runs and comes back
// through "Open sessions", reloads, and opens a second tab: each time the
// cells are there with their code, outputs and counts. When a save fails
// the page warns before a reload or a switch would lose the input; an
// exported .ipynb imports back.
func TestBrowserNotebookKept(t *testing.T) {
	rs := runstest.New(t, nil)
	srv, err := server.New(&server.Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Keepalive: time.Second, PublicMounts: Mounts()})
	if err != nil {
		t.Fatal(err)
	}
	// refuse makes the server refuse saves of the notebook, as a server
	// that cannot be reached would.
	var refuse atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() && r.Method == "PUT" && strings.HasSuffix(r.URL.Path, "/notebook") {
			server.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the server is unavailable", 0)
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})

	p := newPage(t, 1366, 900)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")))
	id := strings.TrimPrefix(eval[string](p, "location.hash"), "#/notebook/")
	cell := func(i int) string { return ".cell:nth-child(" + string(rune('0'+i)) + ")" }
	run := func(i int, code string) {
		t.Helper()
		sel := chromedp.CSS(cell(i) + " textarea")
		p.do("cell "+string(rune('0'+i)), chromedp.WaitVisible(sel), chromedp.SetValue(sel, code), chromedp.Focus(sel),
			chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
			chromedp.WaitVisible(chromedp.CSS(cell(i)+" .cell-status .badge")))
	}
	run(1, "x = 6 * 7\nprint('x is', x)")
	run(2, "import pandas as pd\npd.DataFrame({'city': ['Lyon', 'Oslo']})")
	// (chromedp's Enter sends its character apart, which lands in the cell
	// Shift+Enter moved to: clear it first.)
	clear := func(i int) { eval[any](p, `document.querySelector('`+cell(i)+` textarea').value = ''`) }
	clear(3)
	p.do("draft", chromedp.SendKeys(chromedp.CSS(cell(3)+" textarea"), "x + 1  # not run yet"))
	saved := chromedp.Poll[chromedp.Void](`document.querySelector('#nb-saved')?.dataset.state === 'saved'`, chromedp.WithPollingTimeout(15*time.Second))
	p.do("saved", saved)

	// What the notebook shows, cell by cell: code, prompt, output text.
	type shown struct{ Code, Prompt, Out string }
	read := func(pg *page) []shown {
		t.Helper()
		return eval[[]shown](pg, `[...document.querySelectorAll('.cell')].map(c => ({Code: c.querySelector('textarea').value, Prompt: c.querySelector('.prompt').textContent, Out: c.querySelector('.output').textContent}))`)
	}
	want := read(p)
	if len(want) != 3 || want[0].Prompt != "[1]" || !strings.Contains(want[0].Out, "x is 42") || want[1].Prompt != "[2]" ||
		!strings.Contains(want[1].Out, "Oslo") || want[2].Code != "x + 1  # not run yet" || want[2].Prompt != "[ ]" {
		t.Fatalf("the notebook before leaving: %+v", want)
	}
	same := func(how string, pg *page) {
		t.Helper()
		if got := read(pg); !slices.Equal(got, want) {
			t.Errorf("%s, the notebook shows %+v, want %+v", how, got, want)
		}
	}

	p.do("to Runs and back", chromedp.Click(chromedp.CSS("#nav-runs")), chromedp.WaitVisible(chromedp.CSS("#run-task")),
		chromedp.Click(chromedp.CSS("#nav-notebook")),
		chromedp.Click(chromedp.CSS(`#session-list a[href="#/notebook/`+id+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(cell(2)+" .html-output table")))
	same("back from Runs through Open sessions", p)
	p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(cell(2)+" .html-output table")))
	same("reloaded", p)
	// The kernel's state goes on where the kept cells left it.
	run(3, "x + 1")
	if got := p.text(cell(3) + " pre.result"); got != "43" {
		t.Errorf("x + 1 after the reload: %q", got)
	}
	p.do("saved again", saved)
	want = read(p)

	tab, cancel := chromedp.NewContext(p.ctx)
	t.Cleanup(cancel)
	p2 := &page{ctx: tab, t: t}
	p2.do("second tab", chromedp.Navigate(ts.URL+"/#/notebook/"+id), chromedp.WaitVisible(chromedp.CSS(cell(3)+" pre.result")))
	same("in a second tab", p2)
	cancel()

	// A save that fails: the page says so, and asks before a reload or a
	// switch to Runs loses the input.
	refuse.Store(true)
	clear(4)
	p.do("edit while saves fail", chromedp.SendKeys(chromedp.CSS(cell(4)+" textarea"), "y = 'unsaved'"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#nb-saved').dataset.state === 'error'`, chromedp.WithPollingTimeout(15*time.Second)))
	if got := p.text("#nb-saved"); !strings.Contains(got, "Not saved") {
		t.Errorf("save state %q", got)
	}
	// dialog does what and answers the dialog it opens with Cancel.
	dialog := func(what string) cdppage.EventJavascriptDialogOpening { return p.dialog(what, false) }
	if ev := dialog(`location.hash = '#/runs'`); ev.Type != cdppage.DialogTypeConfirm || !strings.Contains(ev.Message, "not saved") {
		t.Errorf("switching to Runs asked %s %q", ev.Type, ev.Message)
	}
	if ev := dialog(`location.reload()`); ev.Type != cdppage.DialogTypeBeforeunload {
		t.Errorf("reloading asked %s %q, want beforeunload", ev.Type, ev.Message)
	}
	if got := eval[string](p, `document.querySelector('.cell:nth-child(4) textarea').value`); got != "y = 'unsaved'" || !strings.HasPrefix(eval[string](p, "location.hash"), "#/notebook/") {
		t.Errorf("after staying, cell 4 holds %q", got)
	}
	// The server is back: the retry saves it, and a reload shows it.
	refuse.Store(false)
	p.do("saved at last", saved)
	p.do("reload after saving", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(cell(4)+" textarea")))
	if got := eval[string](p, `document.querySelector('.cell:nth-child(4) textarea').value`); got != "y = 'unsaved'" {
		t.Errorf("after the retry and a reload, cell 4 holds %q", got)
	}
	want = read(p)

	// Export, then import into a fresh session: the same cells.
	resp, err := http.Get(ts.URL + "/v1/sessions/" + id + "/notebook.ipynb")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		NBFormat int `json:"nbformat"`
		Cells    []json.RawMessage
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	json.Unmarshal(b, &doc)
	if doc.NBFormat != 4 || len(doc.Cells) != 4 {
		t.Fatalf("export: nbformat %d, %d cells", doc.NBFormat, len(doc.Cells))
	}
	file := filepath.Join(t.TempDir(), "kept.ipynb")
	os.WriteFile(file, b, 0o644)
	p.do("import into a new session", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.SetUploadFiles(chromedp.CSS("#nb-import-file"), []string{file}),
		chromedp.WaitVisible(chromedp.CSS(cell(2)+" .html-output table")))
	same("imported into a new session", p)
	p.check(ts.URL)
}
