package webui

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/gateway/restoretest"
)

// TestBrowserNotebookRestoredUnderNewID: the notebook of a session whose
// host is lost, served by a real gateway (PostgreSQL, two hosts): its
// next cell reaches the session the gateway restored from its snapshot
// (307, followed by the browser), and the notebook moves to the new id,
// says so beside the snapshot's "restored" notice, keeps its cells (saved
// to the new session: the lost host held them) and runs the next cell
// there.
func TestBrowserNotebookRestoredUnderNewID(t *testing.T) {
	cell := restoretest.New(t, Mounts())
	p := newPage(t, 1366, 900)
	sel := chromedp.CSS(".cell:nth-child(1) textarea")
	p.do("open the session's notebook", chromedp.Navigate(cell.URL+"/?token="+cell.Token+"#/notebook/"+cell.Session),
		chromedp.WaitVisible(sel))
	cell.Lose(t)
	p.do("run a cell after the loss", chromedp.SetValue(sel, "answer + 1"), chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)))
	p.until("the notebook moved to the new id and says so",
		`location.hash !== '#/notebook/`+cell.Session+`' && !!document.querySelector('#nb-moved')`)
	newID := strings.TrimPrefix(eval[string](p, "location.hash"), "#/notebook/")
	if got := p.text("#nb-moved"); !strings.Contains(got, cell.Session) || !strings.Contains(got, newID) {
		t.Errorf("the moved notice: %q, want the old id %s and the new %s", got, cell.Session, newID)
	}
	p.until("the snapshot's restored notice", `document.querySelector('#nb-restored')?.textContent.includes('Restored from snapshot snap-')`)
	p.until("the carried cell with its output", `document.querySelector('.cell:nth-child(1)')?.textContent.includes('43')`)
	p.until("the cells saved to the new session", `document.querySelector('#nb-saved')?.dataset.state === 'saved'`)

	req, _ := http.NewRequest("GET", cell.URL+"/v1/sessions/"+newID+"/notebook", nil)
	req.Header.Set("Authorization", "Bearer "+cell.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var nb struct {
		Cells []struct {
			Source string `json:"source"`
		} `json:"cells"`
	}
	json.NewDecoder(resp.Body).Decode(&nb)
	resp.Body.Close()
	if len(nb.Cells) == 0 || nb.Cells[0].Source != "answer + 1" {
		t.Errorf("the new session's notebook: %+v, want the carried cell", nb)
	}

	sel2 := chromedp.CSS(".cell:nth-child(2) textarea")
	p.do("a cell on the new id", chromedp.Click(chromedp.CSS("#nb-add")), chromedp.WaitVisible(sel2),
		chromedp.SetValue(sel2, "open('kept.txt').read()"), chromedp.Focus(sel2),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)))
	p.until("it ran on the restored session", `document.querySelector('.cell:nth-child(2)')?.textContent.includes("'kept'")`)
	p.shot("restored-under-new-id")
}
