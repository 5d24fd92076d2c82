package webui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

// TestBrowserNotebookNetwork opens an allow-mode session in the notebook,
// runs a cell that reaches a listed server on the host and a name that is
// not listed, and reads both in the network panel (refreshed after the
// cell); a none-mode session's panel says it has no network.
func TestBrowserNotebookNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	site := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from the host") })}
	go site.Serve(ln)
	t.Cleanup(func() { site.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	// A template the session form offers (its last part).
	ix := templatetest.NewIndex(t, "sandloop-tmpl-ui", "picked in the form")
	tdir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	tst, err := template.Open(tdir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tst.Remove("uitmpl"); os.RemoveAll(tdir) })
	if _, err := tst.Build(context.Background(), "uitmpl", template.Spec{Pip: []string{"sandloop-tmpl-ui"}}, ix.BuildOptions()); err != nil {
		t.Fatal(err)
	}
	pool := template.NewPool(tst, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	mgr := session.NewManager(&session.ManagerOptions{Templates: pool})
	t.Cleanup(func() { mgr.Close() })
	// Loopback may be listed (by address) on this server only.
	max, err := egress.ParseAllowlist([]string{"127.0.0.0/8", "*.invalid"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(&server.Options{Manager: mgr, Keepalive: time.Second, PublicMounts: Mounts(), Egress: server.EgressOptions{Max: max}, Templates: pool})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	create := func(body string) string {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/sessions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var s struct{ ID string }
		if err := json.Unmarshal(b, &s); err != nil || resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			t.Fatalf("create session: %d %v %s", resp.StatusCode, err, b)
		}
		return s.ID
	}
	target := "127.0.0.1:" + strconv.Itoa(port)
	id := create(fmt.Sprintf(`{"network": "allow", "allow": [%q]}`, target))

	p := newPage(t, 1366, 900)
	u, _ := url.Parse(ts.URL)
	p.do("open the session", chromedp.Navigate(ts.URL+"/#/notebook/"+id),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.Search(`//p[@id="net-summary" and contains(., "no connections yet")]`)))
	if got := p.text("#net-summary"); !strings.Contains(got, target) {
		t.Errorf("summary before any connection: %q", got)
	}
	// (The proxy variables leave 127.0.0.1 alone, so the code asks the proxy itself.)
	code := fmt.Sprintf(`import http.client, os
def get(url):
    c = http.client.HTTPConnection(os.environ["HTTP_PROXY"][len("http://"):], timeout=20)
    c.request("GET", url)
    r = c.getresponse()
    return r.status, r.read().decode().strip()
print(get("http://%s/"))
print(get("http://blocked.invalid/"))`, target)
	sel := chromedp.CSS(".cell textarea")
	p.do("run the cell", chromedp.SetValue(sel, code), chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(".cell:nth-child(1) .cell-status .badge")),
		chromedp.WaitVisible(chromedp.CSS("#net-table tr.net-refused")),
		chromedp.WaitVisible(chromedp.CSS("#net-table tr.net-allowed")))
	if got := p.text(".cell:nth-child(1) .stream-stdout"); !strings.Contains(got, "(200, 'hello from the host')") || !strings.Contains(got, "(403, 'sandloop: egress to blocked.invalid is not allowed") {
		t.Errorf("the cell's output: %q", got)
	}
	allowed := strings.ToLower(p.text("#net-table tr.net-allowed"))
	for _, want := range []string{"get 127.0.0.1:" + strconv.Itoa(port), "allowed", "b sent", "b received"} {
		if !strings.Contains(allowed, want) {
			t.Errorf("allowed row %q lacks %q", allowed, want)
		}
	}
	refused := strings.ToLower(p.text("#net-table tr.net-refused"))
	for _, want := range []string{"get blocked.invalid:80", "refused", "sandloop: egress to blocked.invalid is not allowed; allowed: " + target} {
		if !strings.Contains(refused, want) {
			t.Errorf("refused row %q lacks %q", refused, want)
		}
	}
	// Newest first.
	if got := eval[string](p, `document.querySelector('#net-table tbody tr').className`); got != "net-refused" {
		t.Errorf("first row %q, want the refusal (the newest)", got)
	}
	if got := p.text("#net-summary"); !strings.Contains(got, "of 1.0 GB used") {
		t.Errorf("summary: %q", got)
	}
	p.shot("notebook-network")

	none := create(`{}`)
	p.do("open a none-mode session", chromedp.Navigate(ts.URL+"/#/notebook/"+none),
		chromedp.WaitVisible(chromedp.Search(`//p[@id="net-summary" and contains(., "No network")]`)))
	if hidden := eval[bool](p, `document.getElementById('net-table').hidden`); !hidden {
		t.Error("a none-mode session shows a connection table")
	}

	// The session form offers the server's templates; a session started
	// with one imports its package and says which it is.
	p.do("start a session of the template", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.WaitReady(chromedp.Search(`//select[@id="session-template"]/option[starts-with(., "uitmpl — Python 3.")]`)),
		chromedp.WaitVisible(chromedp.CSS("#session-template")),
		chromedp.SetValue(chromedp.CSS("#session-template"), "template:uitmpl"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.CSS("#session-template-badge")))
	if got := p.text("#session-template-badge"); !strings.EqualFold(got, "template uitmpl") {
		t.Errorf("the session's template badge: %q", got)
	}
	p.do("import the template's package", chromedp.SetValue(sel, "import sandloop_tmpl_ui; print(sandloop_tmpl_ui.VALUE)"), chromedp.Focus(sel),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(".cell:nth-child(1) .cell-status .badge")))
	if got := p.text(".cell:nth-child(1) .stream-stdout"); !strings.Contains(got, "picked in the form") {
		t.Errorf("the template's session: %q", got)
	}
	p.shot("notebook-template")
	p.do("start a plain session", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.WaitVisible(chromedp.CSS("#session-template")),
		chromedp.SetValue(chromedp.CSS("#session-template"), ""),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")))
	if n := eval[int](p, `document.querySelectorAll('#session-template-badge').length`); n != 0 {
		t.Error("a plain session shows a template")
	}
	p.check(u.Scheme + "://" + u.Host)
}
