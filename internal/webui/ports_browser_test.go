package webui

import (
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// TestBrowserOpensAnAppsPort: a server started in a notebook cell shows in
// the Ports panel with an Open link; the link (a signed URL of the port's
// PORT-ID.localhost name) opens the app in the browser, which then loads
// the app's own absolute paths without any token; the token is never in
// the link.
func TestBrowserOpensAnAppsPort(t *testing.T) {
	ts := newServer(t, testToken, nil)
	p := newPage(t, 1366, 900)
	u, _ := url.Parse(ts.URL)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.Search(`//p[@id="ports-summary" and contains(., "No server")]`)))
	sel := chromedp.CSS(".cell:nth-child(1) textarea")
	code := `import threading, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/app.js":
            body, kind = b"document.getElementById('x').textContent = 'script ran from ' + location.pathname", "text/javascript"
        else:
            body, kind = b"<!doctype html><h1 id=x>hello preview</h1><script src=/app.js></script>", "text/html"
        self.send_response(200); self.send_header("Content-Type", kind); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
threading.Thread(target=http.server.ThreadingHTTPServer(("127.0.0.1", 8765), H).serve_forever, daemon=True).start()`
	p.do("start an app",
		chromedp.SetValue(sel, code),
		chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS("#port-open-8765")))
	href := eval[string](p, `document.getElementById('port-open-8765').href`)
	if !strings.Contains(href, ".localhost:"+u.Port()+"/?sandloop_sig=") || strings.Contains(href, testToken) {
		t.Fatalf("Open link %q: want a signed PORT-ID.localhost URL without the token", href)
	}
	p.shot("ports-panel")
	p.check(u.Scheme + "://" + u.Host) // the notebook itself stayed on its origin
	// The link as a new tab would open it: the app, its script from its
	// own absolute path, and the grant gone from the address.
	p.do("open the app", chromedp.Navigate(href),
		chromedp.WaitVisible(chromedp.Search(`//h1[@id="x" and text()="script ran from /"]`)))
	if loc := eval[string](p, `location.href`); strings.Contains(loc, "sandloop_sig") {
		t.Errorf("the grant stayed in the address: %s", loc)
	}
	p.shot("ports-app")
}
