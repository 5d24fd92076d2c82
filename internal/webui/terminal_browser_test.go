package webui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestBrowserTerminal opens the notebook's terminal in headless Chromium
// (xterm.js served by sandloop, over the session's WebSocket with the
// token), types python3 into bash and print(6*7) into python3, and reads
// 42 on the screen; the page's CSP is kept (no violation: xterm.js's own
// styles are adopted, not inlined), nothing is fetched from elsewhere, and
// closing the terminal ends python3.
func TestBrowserTerminal(t *testing.T) {
	mgr := session.NewManager(&session.ManagerOptions{})
	t.Cleanup(func() { mgr.Close() })
	ts := serve(t, testToken, mgr, nil, nil)
	req, _ := http.NewRequest("POST", ts.URL+"/v1/sessions", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := between(string(b), `"id":"`, `"`)
	if resp.StatusCode != 201 || id == "" {
		t.Fatalf("create session: %d %s", resp.StatusCode, b)
	}
	marker := fmt.Sprintf("sandloop-webterm-%d", time.Now().UnixNano())

	p := newPage(t, 1366, 900)
	p.do("open the session", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/notebook/"+id),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.Evaluate[chromedp.Void](`window.cspViolations = []; document.addEventListener('securitypolicyviolation', e => cspViolations.push(e.violatedDirective + ' ' + e.blockedURI))`),
		chromedp.Click(chromedp.CSS("#term-open")),
		chromedp.WaitVisible(chromedp.Search(`//span[@id="term-status" and .="Connected"]`)))
	// The screen's lines, as xterm.js draws them.
	rows := `[...document.querySelectorAll('#term-screen .xterm-rows > div')].map(r => r.textContent.trimEnd())`
	waitRow := func(what, js string) {
		t.Helper()
		p.do(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(30*time.Second)))
	}
	waitRow("a prompt", rows+`.some(r => r.endsWith('$'))`)
	// Typed as text, then Enter as one key (chromedp's KeyEvent sends a key
	// and a character, which xterm.js takes as two).
	typeLine := func(line string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if _, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: line}); err != nil {
				return err
			}
			for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: typ, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	p.do("start python3", typeLine("python3 -q -X "+marker))
	waitRow("python's prompt", rows+`.some(r => r === '>>>')`)
	p.do("type print(6*7)", typeLine("print(6*7)"))
	waitRow("42", rows+`.some(r => r === '42')`)
	p.shot("notebook-terminal")
	if pids := testutil.PidsWithArg(marker); len(pids) == 0 {
		t.Fatal("python3 is not running in the sandbox")
	}
	if v := eval[[]string](p, `cspViolations`); len(v) > 0 {
		t.Errorf("the terminal broke the page's CSP: %q", v)
	}
	// xterm.js's own styles apply (its rows take the theme's colour).
	if c := eval[string](p, `getComputedStyle(document.querySelector('#term-screen .xterm-rows')).color`); c != "rgb(255, 255, 255)" {
		t.Errorf("the terminal's rows are %s, not the theme's white: xterm.js's styles did not apply", c)
	}
	// The size follows the panel: the shell was told the columns it has.
	p.do("ask the size", typeLine("import os; print('cols', os.get_terminal_size().columns)"))
	waitRow("the size", rows+`.some(r => r.startsWith('cols ') && +r.slice(5) > 40)`)

	p.do("close the terminal", chromedp.Click(chromedp.CSS("#term-close")),
		chromedp.WaitVisible(chromedp.CSS("#term-open")))
	testutil.WaitFor(t, 10*time.Second, func() error {
		if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
			return fmt.Errorf("python3 left running after the terminal closed: %v", pids)
		}
		return nil
	})
	u, _ := url.Parse(ts.URL)
	p.check(u.Scheme + "://" + u.Host)
}

func between(s, a, b string) string {
	_, rest, ok := strings.Cut(s, a)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, b)
	return v
}
