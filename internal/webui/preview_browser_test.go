package webui

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/server"
)

// TestBrowserOpensAnAppRunsPreview: the run view of an app run whose
// agent left its server running has an "Open port N" link (the run's
// signed preview URL), which opens the app after the run.
func TestBrowserOpensAnAppRunsPreview(t *testing.T) {
	file := func(path, content string) llmtest.ToolCall {
		b, _ := json.Marshal(map[string]string{"path": path, "content": content})
		return llmtest.ToolCall{Name: "write_file", Arguments: string(b)}
	}
	app := "import http.server\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        b = b'<!doctype html><h1 id=app>built by the agent</h1>'\n        self.send_response(200); self.send_header('Content-Type', 'text/html'); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)\nhttp.server.ThreadingHTTPServer(('127.0.0.1', 5000), H).serve_forever()\n"
	var srv *server.Server
	var hs *httptest.Server
	rs := runstest.New(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{file("app.py", app), file("test_app.py", "def test_ok():\n    assert True\n"),
			file("requirements.txt", "\n"), file("README.md", "# App\n")}},
		{ToolCalls: []llmtest.ToolCall{{Name: "start_process", Arguments: `{"name":"server","command":"python3 app.py"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: jsonArgs("code", "import socket, time\nfor _ in range(300):\n    try:\n        socket.create_connection(('127.0.0.1', 5000), 1).close(); break\n    except OSError:\n        time.sleep(0.1)")}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"a page"}`}}},
	}, func(o *runs.Options) {
		o.PreviewURL = func(id string, port int, exp time.Time) string {
			_, p, _ := net.SplitHostPort(hs.Listener.Addr().String())
			return srv.PreviewURL("localhost:"+p, id, port, exp)
		}
	})
	var err error
	srv, err = server.New(&server.Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Keepalive: time.Second, PublicMounts: Mounts()})
	if err != nil {
		t.Fatal(err)
	}
	hs = httptest.NewServer(srv)
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })

	resp, err := http.Post(hs.URL+"/v1/runs", "application/json", strings.NewReader(`{"task":"a page that says who built it","mode":"app"}`))
	if err != nil {
		t.Fatal(err)
	}
	var run struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&run)
	resp.Body.Close()
	p := newPage(t, 1280, 900)
	p.do("open the run", chromedp.Navigate(hs.URL+"/#/runs/"+run.ID),
		chromedp.WaitVisible(chromedp.CSS(`#run-status[data-status="done"]`), chromedp.AtLeast(0)),
		chromedp.WaitVisible(chromedp.CSS("#report-previews a")))
	href := eval[string](p, `document.querySelector('#report-previews a').href`)
	if !strings.HasPrefix(href, "http://5000-") || !strings.Contains(href, ".localhost:") || !strings.Contains(href, "sandloop_sig=") {
		t.Fatalf("Open link %q: want the signed PORT-ID.localhost URL", href)
	}
	if label := eval[string](p, `document.querySelector('#report-previews a').textContent`); label != "Open port 5000" {
		t.Errorf("link says %q", label)
	}
	p.shot("run-preview")
	p.do("open the app", chromedp.Navigate(href), chromedp.WaitVisible(chromedp.Search(`//h1[@id="app" and text()="built by the agent"]`)))
}
