package webui

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot/snapshottest"
)

// TestBrowserSnapshots drives the notebook's snapshots panel on a real
// server with a snapshot store: a snapshot is taken and listed with what
// it could not keep; Open starts a session from it in a new tab, whose
// notice says it was restored from the snapshot and what did not come
// back; a hibernated session's next cell wakes it, and the notebook says
// so.
func TestBrowserSnapshots(t *testing.T) {
	st := snapshottest.Dir(t)
	mgr := session.NewManager(&session.ManagerOptions{Snapshots: st})
	t.Cleanup(func() { mgr.Close() })
	ts := serve(t, "", mgr, nil, nil)
	p := newPage(t, 1366, 900)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.CSS("#sn-panel")))
	id := strings.TrimPrefix(eval[string](p, "location.hash"), "#/notebook/")
	sel := chromedp.CSS(".cell:nth-child(1) textarea")
	p.do("cell 1", chromedp.SetValue(sel, "x = 7\ng = (i for i in [1])"), chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(".cell:nth-child(1) .cell-status .badge")))
	p.do("take a snapshot", chromedp.SetValue(chromedp.CSS("#sn-name"), "seven"), chromedp.Click(chromedp.CSS("#sn-take")))
	p.until("the snapshot listed, with what it could not keep", `[...document.querySelectorAll('#sn-list li')].some(e => e.textContent.includes('seven') && e.textContent.includes('1 not restorable'))`)

	opened := chromedp.WaitNewTarget(p.ctx, func(i *target.Info) bool { return i.Type == "page" && strings.Contains(i.URL, "#/notebook/") })
	p.do("open it", chromedp.Click(chromedp.CSS("#sn-list .sn-open")))
	var tid target.ID
	select {
	case tid = <-opened:
	case <-time.After(30 * time.Second): // a hang guard, not a timing claim
		t.Fatal("Open opened no tab")
	}
	tab, cancel := chromedp.NewContext(p.ctx, chromedp.WithTargetID(tid))
	t.Cleanup(cancel)
	p2 := &page{ctx: tab, t: t}
	p2.do("the new session's tab", chromedp.WaitVisible(chromedp.CSS("#nb-restored")))
	if got := p2.text("#nb-restored"); !strings.Contains(got, "Restored from snapshot snap-") || !strings.Contains(got, "Variables restored: ") || !strings.Contains(got, "Not restorable: g") {
		t.Errorf("the notice: %q", got)
	}

	// Hibernate the first session over the API. The next request of the
	// page wakes it, here the files panel's (a panel's poll may come
	// before a cell does): the notice says so all the same.
	resp, err := http.Post(ts.URL+"/v1/sessions/"+id+"/hibernate", "application/json", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("hibernate: %v %v", resp, err)
	}
	resp.Body.Close()
	p.do("refresh the files", chromedp.Click(chromedp.CSS("#files-refresh")))
	p.until("the wake said", `document.querySelector('#nb-restored')?.textContent.includes('Woken from hibernation')`)
	sel2 := chromedp.CSS(".cell:nth-child(2) textarea")
	p.do("cell 2 after hibernation", chromedp.WaitVisible(sel2), chromedp.SetValue(sel2, "x + 1"), chromedp.Focus(sel2),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(".cell:nth-child(2) .cell-status .badge")))
	if got := p.text(".cell:nth-child(2)"); !strings.Contains(got, "8") {
		t.Errorf("cell 2 after the wake: %q", got)
	}
	p.shot("snapshots")
}
