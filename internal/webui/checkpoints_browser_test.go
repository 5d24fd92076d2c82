package webui

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// TestBrowserCheckpoints drives the notebook's checkpoint strip on a real
// server: automatic checkpoints appear as cells run, a named one is taken,
// Undo and Restore put the kernel back (what the server then says of the
// session agrees), cells run after the restored point are marked, pause
// shows the state with Resume, and Fork opens the copy in a new tab with
// the parent's cells and variables.
func TestBrowserCheckpoints(t *testing.T) {
	ts := newServer(t, "", nil)
	p := newPage(t, 1366, 900)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.CSS("#ck-strip")))
	id := strings.TrimPrefix(eval[string](p, "location.hash"), "#/notebook/")
	cell := func(i int) string { return ".cell:nth-child(" + string(rune('0'+i)) + ")" }
	run := func(i int, code string) {
		t.Helper()
		sel := chromedp.CSS(cell(i) + " textarea")
		p.do("cell "+string(rune('0'+i)), chromedp.WaitVisible(sel), chromedp.SetValue(sel, code), chromedp.Focus(sel),
			chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
			chromedp.WaitVisible(chromedp.CSS(cell(i)+" .cell-status .badge")))
		// (chromedp's Enter lands in the next cell: clear it.)
		eval[any](p, `document.querySelector('`+cell(i+1)+` textarea') && (document.querySelector('`+cell(i+1)+` textarea').value = '')`)
	}
	// x as the kernel holds it, asked over the API (as a second client would).
	x := func() string {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/sessions/"+id+"/execute", "application/json", strings.NewReader(`{"code":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Results []struct {
				Data map[string]string `json:"data"`
			} `json:"results"`
			Error *struct{ Name string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&r)
		if r.Error != nil || len(r.Results) == 0 {
			return "error"
		}
		return r.Results[0].Data["text/plain"]
	}

	run(1, "x = 1")
	p.until("the automatic checkpoint of cell 1", `document.querySelectorAll('#ck-list .ck-auto').length >= 1`)
	p.do("take a named checkpoint", chromedp.SetValue(chromedp.CSS("#ck-name"), "after one"), chromedp.Click(chromedp.CSS("#ck-take")))
	p.until("the named checkpoint listed", `[...document.querySelectorAll('#ck-list .ck-label')].some(e => e.textContent === 'after one')`)
	if got := p.text(`#ck-list li:not(.ck-auto) .ck-size`); !strings.HasSuffix(got, "B") {
		t.Errorf("the named checkpoint's size: %q", got)
	}
	run(2, "x = 2")
	run(3, "x = 3")

	p.do("undo", chromedp.Click(chromedp.CSS("#ck-undo")),
		chromedp.WaitVisible(chromedp.Search(`//div[@id="toast" and contains(., "Restored from undo")]`)))
	p.until("cell 3 marked undone", `document.querySelector('`+cell(3)+`').classList.contains('cell-undone') && !document.querySelector('`+cell(2)+`').classList.contains('cell-undone')`)
	if got := x(); got != "2" {
		t.Errorf("after Undo, x = %s", got)
	}
	// Found and clicked in one step: the list is drawn again whenever it
	// refreshes, and a button found first could be gone by the click.
	p.until("the named checkpoint's restore clicked", `(() => {
		const li = [...document.querySelectorAll('#ck-list li')].find(li => [...li.children].some(e => e.tagName === 'SPAN' && e.textContent === 'after one'));
		const b = li && li.querySelector('button.ck-restore');
		if (!b) return false;
		b.click();
		return true;
	})()`)
	p.do("restore the named checkpoint", chromedp.WaitVisible(chromedp.Search(`//div[@id="toast" and contains(., "Restored from checkpoint")]`)))
	p.until("cells 2 and 3 marked undone", `document.querySelector('`+cell(2)+`').classList.contains('cell-undone')`)
	if got := x(); got != "1" {
		t.Errorf("after Restore, x = %s", got)
	}
	// Running a cell again clears its mark.
	run(2, "x = 20")
	if eval[bool](p, `document.querySelector('`+cell(2)+`').classList.contains('cell-undone')`) {
		t.Error("cell 2 still marked undone after it ran again")
	}

	p.do("pause", chromedp.Click(chromedp.CSS("#ck-pause")))
	p.until("paused shown", `document.querySelector('#ck-state').textContent === 'paused' && !document.querySelector('#ck-resume').hidden`)
	if resp, err := http.Get(ts.URL + "/v1/sessions/" + id); err != nil {
		t.Fatal(err)
	} else {
		var s struct{ State string }
		json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
		if s.State != "paused" {
			t.Errorf("the server says %q after Pause", s.State)
		}
	}
	p.do("resume", chromedp.Click(chromedp.CSS("#ck-resume")))
	p.until("running shown", `document.querySelector('#ck-state').textContent === 'running' && document.querySelector('#ck-resume').hidden`)

	// Fork: a new tab on the copy, with the parent's cells and variables.
	opened := chromedp.WaitNewTarget(p.ctx, func(i *target.Info) bool { return i.Type == "page" && strings.Contains(i.URL, "#/notebook/") })
	p.do("fork", chromedp.Click(chromedp.CSS("#ck-fork")))
	var tid target.ID
	select {
	case tid = <-opened:
	case <-time.After(30 * time.Second): // a hang guard, not a timing claim
		t.Fatal("Fork opened no tab")
	}
	tab, cancel := chromedp.NewContext(p.ctx, chromedp.WithTargetID(tid))
	t.Cleanup(cancel)
	p2 := &page{ctx: tab, t: t}
	p2.do("the fork's tab", chromedp.WaitVisible(chromedp.CSS(cell(2)+" textarea")), chromedp.WaitVisible(chromedp.CSS("#ck-strip")))
	u, _ := url.Parse(eval[string](p2, "location.href"))
	kid := strings.TrimPrefix(u.Fragment, "/notebook/")
	if kid == id || kid == "" {
		t.Fatalf("the fork's tab shows %s", u)
	}
	if got := eval[string](p2, `document.querySelector('`+cell(2)+` textarea').value`); got != "x = 20" {
		t.Errorf("the fork's cell 2: %q", got)
	}
	resp, err := http.Post(ts.URL+"/v1/sessions/"+kid+"/execute", "application/json", strings.NewReader(`{"code":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Results []struct {
			Data map[string]string `json:"data"`
		} `json:"results"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if len(r.Results) == 0 || r.Results[0].Data["text/plain"] != "20" {
		t.Errorf("x in the fork: %+v", r)
	}
	p.shot("checkpoints")
	origin := ts.URL
	p.check(origin)
	p2.check(origin)
}
