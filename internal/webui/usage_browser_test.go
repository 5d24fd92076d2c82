package webui

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// TestBrowserShowsSessionUsage: the notebook's Resources panel shows the
// session's memory from its samples, and it grows past 150 MB when a cell
// allocates 150 MiB; the sparklines are drawn from the samples.
func TestBrowserShowsSessionUsage(t *testing.T) {
	ts := newServer(t, testToken, nil)
	p := newPage(t, 1366, 900)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")))
	if eval[string](p, `document.getElementById('usage-summary').textContent`) == "Not measured on this server (no cgroup)." {
		t.Skip("no cgroup measures sessions here")
	}
	p.do("the panel fills", chromedp.WaitVisible(chromedp.CSS("#usage-mem-now")))
	mib := `(() => { const t = document.getElementById('usage-mem-now').textContent; const n = parseFloat(t);
		return t.includes(' GB') ? n * 1024 : t.includes(' MB') ? n : 0; })()`
	if before := eval[float64](p, mib); before >= 150 {
		t.Fatalf("a fresh session shows %.0f MB", before)
	}
	sel := chromedp.CSS(".cell:nth-child(1) textarea")
	p.do("allocate 150 MiB",
		chromedp.SetValue(sel, "x = bytes(range(256)) * (150 << 12)\nlen(x) >> 20"),
		chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.Poll[chromedp.Void](mib+` >= 150`, chromedp.WithPollingTimeout(60*time.Second)))
	if pts := eval[int](p, `document.querySelectorAll('#usage-mem-spark polyline').length`); pts != 1 {
		t.Errorf("memory sparkline: %d lines, want 1", pts)
	}
	p.shot("usage-panel")
}
