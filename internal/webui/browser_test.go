package webui

import (
	"archive/zip"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

const chromiumPath = "/usr/bin/chromium"

// page is a headless Chromium tab, with what it did recorded for checks.
type page struct {
	ctx      context.Context
	t        *testing.T
	mu       sync.Mutex
	requests []string // every URL the page asked for
	problems []string // uncaught exceptions and console errors
}

func newPage(t *testing.T, width, height int) *page {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("browser tests need Debian's chromium at %s (scripts/deps.sh installs it): %v", chromiumPath, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		// Chromium's own scratch dirs (org.chromium.Chromium.*) go here too,
		// not into the host's /tmp, where a killed browser would leave them.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	// The deadline every wait below is bounded by.
	ctx, cancel := context.WithTimeout(ctx, 75*time.Second)
	t.Cleanup(cancel)
	p := &page{ctx: ctx, t: t}
	if err := chromedp.Do(ctx); err != nil { // start the browser
		t.Fatalf("start chromium: %v", err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			p.requests = append(p.requests, ev.Request.URL)
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			p.problems = append(p.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				var parts []string
				for _, a := range ev.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				p.problems = append(p.problems, "console.error: "+strings.Join(parts, " "))
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		p.t.Fatalf("%s: %v", what, err)
	}
}

func (p *page) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		p.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func eval[T any](p *page, js string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// shot saves a full-page PNG to $SANDLOOP_SCREENSHOTS (else a temporary directory).
func (p *page) shot(name string) {
	p.t.Helper()
	dir := os.Getenv("SANDLOOP_SCREENSHOTS")
	if dir == "" {
		dir = p.t.TempDir()
	}
	// From the top, so the sticky bar sits where it does for a reader.
	if _, err := chromedp.Run(p.ctx, chromedp.Evaluate[any]("window.scrollTo(0, 0)")); err != nil {
		p.t.Logf("scroll: %v", err)
	}
	buf, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, buf, 0o644); err == nil {
			p.t.Logf("screenshot: %s", path)
		}
	}
}

// check fails the test on page errors and on requests to any other origin.
func (p *page) check(origin string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.problems {
		p.t.Errorf("page: %s", pr)
	}
	for _, u := range p.requests {
		if !strings.HasPrefix(u, origin+"/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:"+origin) {
			p.t.Errorf("the page requested %s (only %s is allowed)", u, origin)
		}
	}
}

const testToken = "test-token-0123456789abcdef"

// TestBrowserRuns starts two runs from the page against a scripted model:
// the first is watched live (its plot appears while the model is still
// thinking) and cancelled; the second finishes with a report whose files
// are downloaded.
func TestBrowserRuns(t *testing.T) {
	ts := newServer(t, testToken, llmtest.Script{
		// Run 1: a plot, then the model hangs until the run is cancelled.
		{Text: "I'll plot the squares first.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code",
			"import matplotlib.pyplot as plt\nxs = list(range(8))\nprint('points:', len(xs))\nplt.plot(xs, [x * x for x in xs], marker='o')\nplt.title('squares')\nplt.show()")}}},
		{Text: "Looking at the figure", Hang: true},
		// Run 2 (debug mode): a crash, a fix, a plot, done.
		{Text: "Let me run the script as given.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "exec(open('stats.py').read())")}}},
		{Text: "The mean divides by zero on an empty list; I'll guard it.", ToolCalls: []llmtest.ToolCall{{Name: "edit_file", Arguments: `{"path":"stats.py","old_text":"    return sum(xs) / len(xs)","new_text":"    return sum(xs) / len(xs) if xs else 0.0"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code",
			"exec(open('stats.py').read())\nimport matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.show()")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"Guarded mean() against empty input; the script now prints 0.0 and 2.0.","root_cause":"mean() divided by len(xs), which is 0 for an empty list."}`}}},
	})
	p := newPage(t, 1366, 900)
	u, _ := url.Parse(ts.URL)

	// The token arrives in the URL, moves into storage and leaves the address bar.
	p.do("open with token", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))
	if loc := eval[string](p, "location.href"); strings.Contains(loc, "token") {
		t.Errorf("the token stayed in the address bar: %s", loc)
	}
	if got := eval[string](p, "localStorage.getItem('sandloop.token')"); got != testToken {
		t.Errorf("stored token %q", got)
	}
	// Without it, the page asks for it.
	p.do("forget token", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Run(ctx, chromedp.Evaluate[any]("localStorage.clear()"))
		return err
	}), chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS("#token-dialog[open] #token-input")))
	p.do("enter token", chromedp.SendKeys(chromedp.CSS("#token-input"), testToken+kb.Enter),
		chromedp.WaitNotVisible(chromedp.CSS("#token-dialog")), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))

	// Keyboard: from the task box, Tab reaches the start button.
	p.do("focus task", chromedp.Focus(chromedp.CSS("#run-task")))
	reached := false
	for range 8 {
		p.do("tab", chromedp.KeyEvent(kb.Tab))
		if eval[string](p, "document.activeElement.id") == "run-start" {
			reached = true
			break
		}
	}
	if !reached {
		t.Errorf("Tab from the task never reached the start button")
	}

	// Run 1: watched live.
	p.do("start run 1",
		chromedp.SendKeys(chromedp.CSS("#run-task"), "Plot the squares of 0..7"),
		chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS("#timeline .tool-execute_python img.figure")),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="running"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-cancel`)),
	)
	if s := p.text("#timeline .say"); !strings.Contains(s, "I'll plot the squares first.") {
		t.Errorf("model text %q", s)
	}
	if s := p.text("#timeline .tool-execute_python .stream-stdout"); !strings.Contains(s, "points: 8") {
		t.Errorf("stdout %q", s)
	}
	if kw := p.text("#timeline .tool-execute_python pre.code .tok-kw"); kw != "import" {
		t.Errorf("first highlighted keyword %q, want import", kw)
	}
	p.do("see the model still talking", chromedp.WaitVisible(chromedp.Search(`//div[@class="say" and contains(., "Looking at the figure")]`)))
	p.shot("run-live")
	p.do("cancel", chromedp.Click(chromedp.CSS("#run-cancel")),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="cancelled"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-list .run-item .badge-muted`)))

	// Run 2: debug mode, with a file to upload, to the end.
	src := filepath.Join(t.TempDir(), "stats.py")
	os.WriteFile(src, []byte("def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([]))\nprint(mean([1, 2, 3]))\n"), 0o644)
	p.do("start run 2",
		chromedp.SendKeys(chromedp.CSS("#run-task"), "Fix stats.py so that it runs, and plot a bar chart"),
		chromedp.SetValue(chromedp.CSS("#run-mode"), "debug"),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.querySelector('#run-mode').dispatchEvent(new Event('change'))`))
			return err
		}),
		chromedp.SendKeys(chromedp.CSS("#run-entry"), "stats.py"),
		chromedp.SetUploadFiles(chromedp.CSS("#run-files"), []string{src}),
		chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS(`#report .d-add`)),
	)
	if st := eval[string](p, `document.querySelector('#run-status').dataset.status`); st != "done" {
		t.Errorf("run 2 status %q", st)
	}
	if tb := p.text("#timeline .traceback .tb-name"); tb != "ZeroDivisionError" {
		t.Errorf("traceback heading %q", tb)
	}
	// The crash the harness reproduced comes first, before the model's first step.
	if s := p.text(`#timeline li.step[data-step="0"] [data-reproduced="error"]`); !strings.Contains(s, "$ python3 stats.py") || !strings.Contains(s, "ZeroDivisionError") {
		t.Errorf("the reproduced crash before step 1: %q", s)
	}
	if s := p.text("#run-outcome .summary"); !strings.Contains(s, "Guarded mean()") {
		t.Errorf("summary %q", s)
	}
	// Before and after: the harness's reproduction failed, its verification passed.
	if got := eval[[]string](p, `[...document.querySelectorAll('#report .check h5 .badge')].map(e => e.textContent)`); !slices.Equal(got, []string{"error", "OK"}) {
		t.Errorf("before/after badges %v, want [error OK]", got)
	}
	if s := p.text("#report .check pre.stream"); !strings.Contains(s, "ZeroDivisionError") {
		t.Errorf("reproduction output %q", s)
	}
	if n := eval[int](p, `document.querySelectorAll('#report .d-del').length`); n < 1 {
		t.Errorf("the diff has no removed line")
	}
	if n := eval[int](p, `document.querySelectorAll('#report figure img').length`); n != 1 {
		t.Errorf("report figures: %d, want 1", n)
	}
	if got := eval[string](p, `document.querySelector('#run-list .run-item .run-meta').textContent`); !strings.Contains(got, "4 steps") {
		t.Errorf("run list entry %q", got)
	}
	// The same cost, in the same words, in the list and on the run's page,
	// and as the CLI says it: the scripted model at a local URL has no price.
	listCost := eval[string](p, `document.querySelector('#run-list .run-item .run-cost').textContent`)
	pageCost := eval[string](p, `[...document.querySelectorAll('dl.stats dt')].find(e => e.textContent === 'Cost')?.nextElementSibling?.textContent ?? ''`)
	if listCost != "cost unknown" || pageCost != "cost unknown" {
		t.Errorf("cost in the run list %q, on the run's page %q; want \"cost unknown\" in both, as runs ls and runs show say it", listCost, pageCost)
	}
	p.shot("run-report")

	// Download the run's files through the page.
	dir := t.TempDir()
	progress := chromedp.BrowserEvents(p.ctx, browser.DownloadProgress)
	if _, err := chromedp.CallBrowser(p.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: ptr(true),
	}); err != nil {
		t.Fatal(err)
	}
	p.do("download", chromedp.Click(chromedp.CSS("#report-download")))
	var guid string
	for ev, err := range progress {
		if err != nil {
			t.Fatalf("waiting for the download: %v", err)
		}
		if ev.State == browser.DownloadProgressStateCanceled {
			t.Fatal("download cancelled")
		}
		if ev.State == browser.DownloadProgressStateCompleted {
			guid = ev.GUID
			break
		}
	}
	zr, err := zip.OpenReader(filepath.Join(dir, guid))
	if err != nil {
		t.Fatalf("downloaded artifacts: %v", err)
	}
	t.Cleanup(func() { zr.Close() })
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	if !slices.Contains(names, "stats.py") {
		t.Errorf("artifacts %v lack stats.py", names)
	}

	// Narrow screen: one column, nothing wider than the screen.
	p.do("narrow", chromedp.EmulateViewport(390, 844), chromedp.WaitVisible(chromedp.CSS("#report")))
	if w := eval[int](p, "document.documentElement.scrollWidth"); w > 390 {
		t.Errorf("on a 390px screen the page is %dpx wide", w)
	}
	p.shot("run-narrow")
	p.check(u.Scheme + "://" + u.Host)
}

// TestBrowserNotebook runs cells in a session: a DataFrame shows as a
// table, HTML with script in it does not run, a traceback is set off, and
// files upload into the workspace.
func TestBrowserNotebook(t *testing.T) {
	ts := newServer(t, "", nil)
	p := newPage(t, 1366, 900)
	u, _ := url.Parse(ts.URL)
	p.do("open notebook", chromedp.Navigate(ts.URL+"/#/notebook"),
		chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS(".cell textarea")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")))

	cell := func(i int) string { return ".cell:nth-child(" + string(rune('0'+i)) + ")" }
	run := func(i int, code string) {
		t.Helper()
		sel := chromedp.CSS(cell(i) + " textarea")
		p.do("cell "+string(rune('0'+i)),
			chromedp.WaitVisible(sel),
			chromedp.SetValue(sel, code),
			chromedp.Focus(sel),
			chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
			chromedp.WaitVisible(chromedp.CSS(cell(i)+" .cell-status .badge")))
	}
	run(1, "import pandas as pd\ndf = pd.DataFrame({'city': ['Lyon', 'Oslo', 'Quito'], 'temp': [14.5, 6.1, 13.9]})\ndf")
	if got := eval[[]string](p, `[...document.querySelectorAll('.cell:nth-child(1) .html-output table th')].map(e => e.textContent)`); !slices.Contains(got, "city") || !slices.Contains(got, "temp") {
		t.Errorf("DataFrame table headers %v", got)
	}
	if got := p.text(cell(1) + " .html-output table tbody tr:nth-child(2) td"); got != "Oslo" {
		t.Errorf("second row %q", got)
	}
	run(2, "class Evil:\n    def _repr_html_(self):\n        return '<b>bold</b><script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"><a href=\"javascript:window.pwned=3\">link</a>'\nEvil()")
	if got := p.text(cell(2) + " .html-output b"); got != "bold" {
		t.Errorf("sanitized HTML lost its bold text: %q", got)
	}
	if got := eval[int](p, `document.querySelectorAll('.html-output script, .html-output img, .html-output a, [onerror]').length`); got != 0 {
		t.Errorf("%d dangerous elements reached the page", got)
	}
	if got := eval[bool](p, `'pwned' in window`); got {
		t.Errorf("script from a result ran in the app's origin")
	}
	run(3, "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()\nprint('plotted')\n1 / 0")
	p.do("traceback", chromedp.WaitVisible(chromedp.CSS(cell(3)+" .traceback")), chromedp.WaitVisible(chromedp.CSS(cell(3)+" img.figure")))
	if got := p.text(cell(3) + " .prompt"); got != "[3]" {
		t.Errorf("execution count %q", got)
	}
	// Upload a file and see it listed.
	up := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(up, []byte("hello from the browser\n"), 0o644)
	p.do("upload", chromedp.SetUploadFiles(chromedp.CSS("#file-upload"), []string{up}),
		chromedp.WaitVisible(chromedp.Search(`//ul[@id="file-list"]//span[contains(@class,"file-name") and text()="notes.txt"]`)))
	run(4, "print(open('notes.txt').read().upper())")
	if got := p.text(cell(4) + " .stream-stdout"); !strings.Contains(got, "HELLO FROM THE BROWSER") {
		t.Errorf("cell 4 stdout %q", got)
	}
	p.shot("notebook")

	// Interrupt a cell that would run for ten minutes; state survives it.
	sleeper := chromedp.CSS(cell(5) + " textarea")
	p.do("interrupt",
		chromedp.SetValue(sleeper, "import time\nprint('sleeping', flush=True)\ntime.sleep(600)"),
		chromedp.Focus(sleeper),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
		chromedp.WaitVisible(chromedp.CSS(cell(5)+" .stream-stdout")),
		chromedp.Click(chromedp.CSS("#nb-interrupt")),
		chromedp.WaitVisible(chromedp.CSS(cell(5)+" .cell-status .badge")))
	if got := p.text(cell(5) + " .cell-status .badge"); !strings.EqualFold(got, "interrupted") {
		t.Errorf("status after interrupt %q", got)
	}
	run(6, "len(df)")
	if got := p.text(cell(6) + " pre.result"); got != "3" {
		t.Errorf("after the interrupt, len(df) = %q", got)
	}
	// Restart clears the variables.
	p.do("restart", chromedp.Click(chromedp.CSS("#nb-restart")), chromedp.WaitVisible(chromedp.Search(`//div[@id="toast" and contains(., "restarted")]`)))
	run(7, "df")
	if got := p.text(cell(7) + " .tb-name"); got != "NameError" {
		t.Errorf("after a restart, df gave %q, want NameError", got)
	}
	p.check(u.Scheme + "://" + u.Host)
}

func ptr[T any](v T) *T { return &v }

// dialog runs the script what, waits for the dialog it opens (confirm,
// beforeunload...) and answers it: accept is OK or Leave.
func (p *page) dialog(what string, accept bool) cdppage.EventJavascriptDialogOpening {
	p.t.Helper()
	dialogs := chromedp.Events(p.ctx, cdppage.JavascriptDialogOpening)
	go chromedp.Run(p.ctx, chromedp.Evaluate[any](what))
	for ev, err := range dialogs {
		if err != nil {
			p.t.Fatalf("waiting for a dialog after %s: %v", what, err)
		}
		if _, err := chromedp.Call(p.ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: accept}); err != nil {
			p.t.Fatal(err)
		}
		return ev
	}
	p.t.Fatalf("no dialog after %s", what)
	return cdppage.EventJavascriptDialogOpening{}
}
