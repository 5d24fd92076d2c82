package webui

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// shown is a JS function telling whether the element sel selects is on
// the page and displayed (not hidden, nor inside something hidden).
const shown = `(sel => { const e = document.querySelector(sel); return !!e && e.getClientRects().length > 0; })`

// until waits for the JS expression js to be true.
func (p *page) until(what, js string) {
	p.t.Helper()
	// By interval, not on animation frames (the default): a tab in the
	// background (another one opened) draws none, and its poll never ran.
	p.do(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(30*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
}

func (p *page) shown(sel string) bool {
	p.t.Helper()
	return eval[bool](p, shown+"("+jsString(sel)+")")
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestBrowserServerInfo: the run form names the model before a task is
// typed (or says how to configure one), and "Set token" is offered only
// where the server wants a token.
func TestBrowserServerInfo(t *testing.T) {
	t.Run("token and model", func(t *testing.T) {
		ts := newServer(t, testToken, nil)
		p := newPage(t, 1280, 900)
		p.do("open", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))
		p.until("model named", `document.getElementById('run-model-note').textContent.includes('openai-compatible/gpt-4o-mini')`)
		if got := eval[string](p, `document.getElementById('run-task').value`); got != "" {
			t.Errorf("task %q: the model should be named before any is typed", got)
		}
		p.until("server asked", `document.getElementById('token-button').dataset.required !== undefined`)
		if !p.shown("#token-button") {
			t.Error("a server with tokens: the token button is hidden")
		}
		if got := p.text("#token-button"); got != "Token ✓" {
			t.Errorf("token button %q", got)
		}
		// An empty task is refused by the form, next to the box, with no run started.
		p.do("start with no task", chromedp.Click(chromedp.CSS("#run-start")), chromedp.WaitVisible(chromedp.CSS("#run-task-error")))
		if got := p.text("#run-task-error"); got != "Say what the agent should do." {
			t.Errorf("empty task: %q", got)
		}
		if eval[string](p, "document.activeElement.id") != "run-task" || eval[string](p, "location.hash") != "#/runs" {
			t.Error("an empty task should keep the form, with the focus in the task box")
		}
		p.do("type a task", chromedp.SendKeys(chromedp.CSS("#run-task"), "x"), chromedp.WaitNotVisible(chromedp.CSS("#run-task-error")))
		if got := p.text("#run-list"); !strings.Contains(got, "No runs yet.") {
			t.Errorf("the run list after an empty task: %q", got)
		}
		p.check(ts.URL)
	})
	t.Run("no token, no model", func(t *testing.T) {
		ts := newServerWithModel(t, "", func(context.Context, string) (llm.Provider, error) { return nil, &llm.NoModelError{} })
		p := newPage(t, 1280, 900)
		p.do("open", chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-list .empty")))
		p.until("no model said", `document.getElementById('run-model-note').textContent.includes('no model configured: set SANDLOOP_MODEL or --model')`)
		if !p.shown("#run-model-note") {
			t.Error("the note on the model is not shown")
		}
		p.until("server asked", `document.getElementById('token-button').dataset.required !== undefined`)
		if p.shown("#token-button") {
			t.Errorf("a server without tokens: the page offers %q", p.text("#token-button"))
		}
		p.check(ts.URL)
	})
}

// TestBrowserNoDownloadWithoutFiles: "Download files" is offered only for
// a run that left files, and "Download workspace" only for a session
// workspace with files in it.
func TestBrowserNoDownloadWithoutFiles(t *testing.T) {
	ts := newServer(t, "", llmtest.Script{
		// Run 1 writes nothing.
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "print(6 * 7)")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"printed 42"}`}}},
		// Run 2 writes a file.
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "open('answer.txt', 'w').write('42')")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"wrote answer.txt"}`}}},
	})
	p := newPage(t, 1280, 900)
	start := func(task string) {
		t.Helper()
		p.do("start "+task, chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
			chromedp.SendKeys(chromedp.CSS("#run-task"), task), chromedp.Click(chromedp.CSS("#run-start")),
			chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
	}
	start("print 6*7")
	// Reloaded too: the button follows the recorded report.
	for _, how := range []string{"live", "reloaded"} {
		if how == "reloaded" {
			p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
			p.until("outcome replayed", `!document.getElementById('run-outcome').hidden`)
		}
		if p.shown("#run-download") {
			t.Errorf("%s: a run without files offers to download them", how)
		}
	}
	start("write the answer")
	p.until("download offered", shown+`('#run-download')`)

	// A new session's workspace is empty: nothing to download until a file is there.
	p.do("notebook", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")), chromedp.WaitVisible(chromedp.CSS("#file-list .empty")))
	if p.shown("#files-archive") {
		t.Error("an empty workspace offers to download it")
	}
	sel := chromedp.CSS(".cell textarea")
	p.do("write a file", chromedp.SetValue(sel, "open('a.txt', 'w').write('hi')"), chromedp.Focus(sel),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.WaitVisible(chromedp.Search(`//ul[@id="file-list"]//span[text()="a.txt"]`)))
	if !p.shown("#files-archive") {
		t.Error("a workspace with a file does not offer to download it")
	}
	p.check(ts.URL)
}

// TestBrowserSessionGone: the notebook of a session that no longer exists
// says so and shows none of the controls that cannot work.
func TestBrowserSessionGone(t *testing.T) {
	ts := newServer(t, "", nil)
	p := newPage(t, 1280, 900)
	controls := []string{"#nb-run-all", "#nb-interrupt", "#nb-restart", "#nb-close", "#nb-add", ".cell .cell-run", "#file-upload"}
	open := func() (del func()) {
		t.Helper()
		p.do("new session", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
			chromedp.WaitVisible(chromedp.CSS("#session-status")))
		// (The new notebook renders after its status: wait for each.)
		for _, c := range controls {
			p.until("a live session: "+c+" shown", shown+"("+jsString(c)+")")
		}
		id := eval[string](p, `decodeURIComponent(location.hash.split('/')[2])`)
		return func() {
			t.Helper()
			req, _ := http.NewRequest("DELETE", ts.URL+"/v1/sessions/"+id, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode/100 != 2 {
				t.Fatalf("delete the session: %v %v", resp, err)
			}
			resp.Body.Close()
		}
	}
	check := func(how string) {
		t.Helper()
		p.until(how+": gone said", shown+`('#nb-gone')`)
		if got := p.text("#nb-gone"); !strings.Contains(got, "This session no longer exists") {
			t.Errorf("%s: note %q", how, got)
		}
		for _, c := range controls {
			if p.shown(c) {
				t.Errorf("%s: the ended session still shows %s", how, c)
			}
		}
	}
	// Ended while the tab was elsewhere: coming back shows it.
	open()()
	eval[bool](p, `document.dispatchEvent(new Event('visibilitychange'))`)
	check("back to the tab")
	// Ended while the page is open: the next cell finds out.
	open()()
	sel := chromedp.CSS(".cell textarea")
	p.do("run a cell", chromedp.SetValue(sel, "1 + 1"), chromedp.Focus(sel),
		chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)))
	check("while open")
	// Opened afterwards (a bookmark, the history). The page asks first:
	// leaving drops the cell typed into the ended session. Leave.
	if ev := p.dialog(`location.reload()`, true); ev.Type != cdppage.DialogTypeBeforeunload {
		t.Errorf("reloading an ended session with a typed cell asked %s %q, want beforeunload", ev.Type, ev.Message)
	}
	p.do("reload", chromedp.WaitVisible(chromedp.CSS("#nb-title")))
	check("reopened")
	p.check(ts.URL)
}

// endInView is a JS function telling whether the last occurrence of needle
// in the box sel selects is inside the box's visible part (no scrolling).
const endInView = `((sel, needle) => {
  const box = document.querySelector(sel);
  if (!box) return 'no ' + sel;
  const w = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
  let node = null;
  for (let n; (n = w.nextNode());) if (n.data.includes(needle)) node = n;
  if (!node) return needle + ' is not in ' + sel;
  const r = document.createRange();
  const i = node.data.lastIndexOf(needle);
  r.setStart(node, i);
  r.setEnd(node, i + needle.length);
  const a = r.getBoundingClientRect(), b = box.getBoundingClientRect();
  return a.height > 0 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1 ? 'ok' : 'hidden: ' + needle + ' at ' + a.top + '..' + a.bottom + ', box ' + b.top + '..' + b.bottom;
})`

// TestBrowserLongOutput: long output boxes show their end (the ValueError
// under a traceback) without scrolling, with "show all" for the middle,
// and a finished run's outcome heads the page above its long timeline.
func TestBrowserLongOutput(t *testing.T) {
	ts := newServer(t, "", llmtest.Script{
		{Text: "Reading the rows.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code",
			"open('rows.txt', 'w').write('13\\n')\nfor i in range(120):\n    print('row', i)\ndef f(n):\n    if n == 0:\n        raise ValueError('month 13 is out of range')\n    return f(n - 1)\nf(40)")}}},
		{Text: "Now the script the way the user runs it.", ToolCalls: []llmtest.ToolCall{{Name: "run_shell", Arguments: jsonArgs("command",
			`for i in $(seq 150); do echo "checking row $i" >&2; done; python3 -c "raise ValueError('month 13 is out of range')"`)}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "print(open('rows.txt').read())")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"Row 13 holds month 13, which the script rejects with a ValueError."}`}}},
	})
	p := newPage(t, 1280, 900)
	p.do("start", chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
		chromedp.SendKeys(chromedp.CSS("#run-task"), "Why does the monthly report fail?"), chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
	ends := []struct{ sel, needle string }{
		{"#timeline .tool-run_shell pre.stream-stderr", "ValueError: month 13 is out of range"},
		{"#timeline .tool-execute_python pre.stream-stdout", "row 119"},
		{"#timeline .tool-execute_python .traceback pre", "raise ValueError('month 13 is out of range')"},
	}
	for _, how := range []string{"live", "reloaded"} {
		if how == "reloaded" {
			p.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#timeline .tool-run_shell pre.stream-stderr")))
		}
		for _, e := range ends {
			if got := eval[string](p, endInView+"("+jsString(e.sel)+", "+jsString(e.needle)+")"); got != "ok" {
				t.Errorf("%s: %s: %s", how, e.sel, got)
			}
		}
	}
	p.shot("long-output")

	// The outcome heads the run, visible without scrolling the page, with
	// the figures of the run; the timeline below is long.
	p.until("outcome", shown+`('#run-outcome .summary')`)
	if got := p.text("#run-outcome .summary"); !strings.Contains(got, "Row 13 holds month 13") {
		t.Errorf("outcome %q", got)
	}
	if in := eval[bool](p, `document.querySelector('#run-outcome .summary').getBoundingClientRect().bottom <= innerHeight`); !in {
		t.Error("the summary is below the first screen")
	}
	if long := eval[bool](p, `document.documentElement.scrollHeight > 2 * innerHeight`); !long {
		t.Error("the timeline is not long enough for this test to mean anything")
	}
	head := strings.ToLower(p.text(".run-head"))
	for _, want := range []string{"done", "steps\n4", "tokens", "cost", "duration", "rows.txt"} {
		if !strings.Contains(head, want) {
			t.Errorf("the header lacks %q:\n%s", want, head)
		}
	}

	// "Show all" brings the middle back and keeps the end in sight.
	stderr := "#timeline .tool-run_shell pre.stream-stderr"
	if strings.Contains(p.text(stderr), "checking row 75\n") {
		t.Error("the middle of a long box is shown from the start")
	}
	p.do("show all", chromedp.Click(chromedp.CSS(stderr+" .clip-more")))
	if got := p.text(stderr); !strings.Contains(got, "checking row 75\n") {
		t.Errorf("after show all, the box lacks its middle")
	}
	if got := eval[string](p, endInView+"("+jsString(stderr)+", 'ValueError: month 13 is out of range')"); got != "ok" {
		t.Errorf("after show all: %s", got)
	}

	// In the notebook, output streaming into a full box keeps its end in sight.
	p.do("notebook", chromedp.Navigate(ts.URL+"/#/notebook"), chromedp.Click(chromedp.CSS("#session-new")),
		chromedp.WaitVisible(chromedp.CSS("#session-status")))
	cell := chromedp.CSS(".cell textarea")
	p.do("run a long cell", chromedp.SetValue(cell, "import time\nfor i in range(300):\n    print('line', i, flush=True)\n    if i % 50 == 0: time.sleep(0.05)\nraise ValueError('month 13 is out of range')"),
		chromedp.Focus(cell), chromedp.KeyEvent("\r", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.WaitVisible(chromedp.CSS(".cell .cell-status .badge")))
	if got := eval[string](p, endInView+"('.cell pre.stream-stdout', 'line 299')"); got != "ok" {
		t.Errorf("notebook: %s", got)
	}
	p.check(ts.URL)
}

// gate stands in front of a model server and holds its n-th request back
// until release is called (or the client gives up).
type gate struct {
	n       int32
	count   atomic.Int32
	release func()
	open    <-chan struct{}
	proxy   *httputil.ReverseProxy
}

func newGate(t *testing.T, target string, n int32) (*gate, *httptest.Server) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	g := &gate{n: n, open: open, release: sync.OnceFunc(func() { close(open) })}
	g.proxy = httputil.NewSingleHostReverseProxy(u)
	g.proxy.FlushInterval = -1 // streamed replies pass as they come
	// (Requests cut short when the test ends are no news.)
	g.proxy.ErrorLog = log.New(io.Discard, "", 0)
	hs := httptest.NewServer(g)
	t.Cleanup(func() {
		g.release()
		hs.CloseClientConnections()
		hs.Close()
	})
	return g, hs
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.count.Add(1) == g.n {
		select {
		case <-g.open:
		case <-r.Context().Done():
			return
		}
	}
	g.proxy.ServeHTTP(w, r)
}

// TestBrowserModelWait: while a run waits on the model the page says so,
// with the time ticking, and says when the model server's refusal is being
// retried; the run's entry in the list follows its steps and tokens live.
func TestBrowserModelWait(t *testing.T) {
	model := llmtest.NewOpenAIServer(t, llmtest.Script{
		{Text: "First, a look at the data.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "print('step one')")}}},
		{Status: http.StatusTooManyRequests, RetryAfter: "1"},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"looked"}`}}},
	})
	g, front := newGate(t, model.URL, 3) // the retry after the 429 waits for the test
	ts := newServerWithModel(t, "", func(context.Context, string) (llm.Provider, error) {
		return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: front.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
	})
	p := newPage(t, 1280, 900)
	p.do("start", chromedp.Navigate(ts.URL+"/#/runs"), chromedp.WaitVisible(chromedp.CSS("#run-task")),
		chromedp.SendKeys(chromedp.CSS("#run-task"), "Look at the data"), chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS("#timeline .tool-execute_python .stream-stdout")))

	// Held at the gate: the wait ticks on (it began at 0 s), under the retry's sentence.
	p.until("the wait ticks", `/waiting for the model · ([3-9]|\d\d+) s/.test(document.getElementById('run-wait').textContent)`)
	wait := p.text("#run-wait")
	for _, want := range []string{"rate limited by the model server", "(attempt 2/"} {
		if !strings.Contains(wait, want) {
			t.Errorf("the wait lacks %q: %q", want, wait)
		}
	}
	if got := p.text("#run-live"); !strings.Contains(got, "waiting for the model") {
		t.Errorf("the header's live note %q", got)
	}
	// The list's entry shows the first step's tokens, with no reload.
	if got := p.text("#run-list .run-item.active .run-steps"); got != "1 step" {
		t.Errorf("list entry steps %q", got)
	}
	if got := p.text("#run-list .run-item.active .run-tokens"); got != "120 tok" {
		t.Errorf("list entry tokens %q", got)
	}
	p.shot("model-wait")

	g.release()
	p.do("finish", chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`)))
	if p.shown("#run-wait") {
		t.Errorf("a finished run still waits: %q", p.text("#run-wait"))
	}
	p.check(ts.URL)
}
