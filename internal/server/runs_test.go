package server

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/testutil"
)

func newRunsServer(t *testing.T, script llmtest.Script, tokens ...string) *testServer {
	t.Helper()
	rs := runstest.New(t, script)
	srv, err := New(&Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Keepalive: 50 * time.Millisecond, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	hs := &testServer{mgr: rs.Manager, srv: srv}
	if len(tokens) > 0 {
		hs.token = tokens[0]
	}
	hs.Server = newHTTPTest(srv)
	t.Cleanup(hs.Close) // before the service (cleanups run last first)
	return hs
}

type sseEvent struct {
	id, event string
	data      map[string]any
}

func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			json.Unmarshal([]byte(line[6:]), &cur.data)
		case line == "" && cur.event != "":
			out = append(out, cur)
			if cur.event == "end" {
				return out
			}
			cur = sseEvent{}
		}
	}
	return out
}

func TestRunsAPI(t *testing.T) {
	ts := newRunsServer(t, llmtest.Script{
		{Text: "Plotting.", ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"import matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()\nopen('out.txt','w').write('hi')"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"plotted"}`}}},
	})
	var run store.Run
	resp := ts.do(t, "POST", "/v1/runs", `{"task":"plot 1,2,3","files":{"data/in.txt":"1\n2\n3\n"}}`, &run)
	if resp.StatusCode != 201 || run.ID == "" || run.Status != "running" {
		t.Fatalf("start: %d %+v", resp.StatusCode, run)
	}
	evResp, err := http.Get(ts.URL + "/v1/runs/" + run.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, evResp.Body)
	evResp.Body.Close()
	var types []string
	images := 0
	for _, e := range events {
		types = append(types, e.event)
		if e.event == "tool_result" {
			if n, _ := e.data["images"].(float64); n > 0 {
				images++
			}
		}
	}
	joined := strings.Join(types, ",")
	if !strings.HasPrefix(joined, "run_started,") || !strings.HasSuffix(joined, "run_finished,end") || images != 1 {
		t.Errorf("events %s (images %d)", joined, images)
	}
	// Replaying from the middle.
	evResp, _ = http.Get(ts.URL + "/v1/runs/" + run.ID + "/events?since=" + events[2].id)
	if replay := readSSE(t, evResp.Body); len(replay) != len(events)-3 {
		t.Errorf("resume after %s: %d events, want %d", events[2].id, len(replay), len(events)-3)
	}
	evResp.Body.Close()
	var got store.Run
	ts.do(t, "GET", "/v1/runs/"+run.ID, "", &got)
	if got.Status != "done" || got.Steps != 2 || len(got.Report) == 0 || got.TokensIn == 0 {
		t.Errorf("run after: %+v", got)
	}
	resp = ts.do(t, "GET", "/v1/runs/"+run.ID+"/artifacts", "", nil)
	b, _ := io.ReadAll(resp.Body)
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("artifacts: %v", err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	if strings.Join(names, ",") != "data/in.txt,out.txt" {
		t.Errorf("artifacts %v", names)
	}
	var list struct{ Runs []store.Run }
	ts.do(t, "GET", "/v1/runs", "", &list)
	if len(list.Runs) != 1 {
		t.Errorf("list %+v", list)
	}
	if resp := ts.do(t, "POST", "/v1/runs/"+run.ID+"/cancel", "", nil); resp.StatusCode != 409 {
		t.Errorf("cancel a finished run: %d", resp.StatusCode)
	}
	for _, c := range []struct {
		m, p, body string
		status     int
	}{
		{"GET", "/v1/runs/nope", "", 404},
		{"POST", "/v1/runs/nope/cancel", "", 404},
		{"POST", "/v1/runs", `{"task":"x","mode":"sideways"}`, 400},
		{"POST", "/v1/runs", `{"task":"x","files":{"../x":"y"}}`, 400},
		{"POST", "/v1/runs", `{"task":"x","max_steps":-1}`, 400},
		{"POST", "/v1/runs", `{"task":5}`, 400},
	} {
		if resp := ts.do(t, c.m, c.p, c.body, nil); resp.StatusCode != c.status {
			t.Errorf("%s %s %s: %d, want %d", c.m, c.p, c.body, resp.StatusCode, c.status)
		}
	}
}

func TestRunCancel(t *testing.T) {
	ts := newRunsServer(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"import time\nprint('working', flush=True)\ntime.sleep(600)"}`}}},
	})
	var run store.Run
	ts.do(t, "POST", "/v1/runs", `{"task":"sleep"}`, &run)
	evResp, err := http.Get(ts.URL + "/v1/runs/" + run.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer evResp.Body.Close()
	br := bufio.NewReader(evResp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal("stream ended before the output")
		}
		if strings.Contains(line, "working") {
			break
		}
	}
	if resp := ts.do(t, "POST", "/v1/runs/"+run.ID+"/cancel", "", nil); resp.StatusCode != 202 {
		t.Fatalf("cancel: %d", resp.StatusCode)
	}
	rest := readSSE(t, br)
	if len(rest) < 2 || rest[len(rest)-2].event != "run_finished" {
		t.Fatalf("no run_finished after cancel: %+v", rest)
	}
	rep, _ := rest[len(rest)-2].data["report"].(map[string]any)
	if rep["status"] != "cancelled" {
		t.Errorf("report %v", rep)
	}
	var got store.Run
	ts.do(t, "GET", "/v1/runs/"+run.ID, "", &got)
	if got.Status != "cancelled" {
		t.Errorf("stored status %q", got.Status)
	}
}

// A run belongs to the token that started it: another token neither sees
// it listed nor reaches it (404, as for sessions).
func TestRunOwnership(t *testing.T) {
	ts := newRunsServer(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"print(2+2)"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"printed 4"}`}}},
	}, tokenA, tokenB)
	var run store.Run
	if resp := ts.do(t, "POST", "/v1/runs", `{"task":"print 2+2"}`, &run); resp.StatusCode != 201 {
		t.Fatalf("start: %d", resp.StatusCode)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		var got store.Run
		if ts.do(t, "GET", "/v1/runs/"+run.ID, "", &got); got.Status == "running" {
			return errors.New("the run has not ended")
		}
		return nil
	})

	ts.token = tokenB
	for _, p := range []string{"GET /v1/runs/" + run.ID, "GET /v1/runs/" + run.ID + "/events", "POST /v1/runs/" + run.ID + "/cancel", "GET /v1/runs/" + run.ID + "/artifacts"} {
		m, path, _ := strings.Cut(p, " ")
		if resp := ts.do(t, m, path, "", nil); resp.StatusCode != 404 {
			t.Errorf("other token %s: %d, want 404", p, resp.StatusCode)
		}
	}
	var list struct{ Runs []store.Run }
	ts.do(t, "GET", "/v1/runs", "", &list)
	if len(list.Runs) != 0 {
		t.Errorf("other token lists %d runs", len(list.Runs))
	}

	ts.token = tokenA
	ts.do(t, "GET", "/v1/runs", "", &list)
	if len(list.Runs) != 1 || list.Runs[0].ID != run.ID {
		t.Errorf("owner lists %+v", list.Runs)
	}
	if resp := ts.do(t, "GET", "/v1/runs/"+run.ID+"/artifacts", "", nil); resp.StatusCode != 200 {
		t.Errorf("owner's artifacts: %d", resp.StatusCode)
	}
}

// Bad input to the runs API is a 400 that says what to fix: an empty task,
// limit, offset, status or mode values that mean nothing.
func TestRunsBadInput(t *testing.T) {
	ts := newRunsServer(t, llmtest.Script{})
	for _, body := range []string{`{}`, `{"task":""}`, `{"task":"   \n"}`} {
		if resp := ts.do(t, "POST", "/v1/runs", body, nil); resp.StatusCode != 400 || errCode(t, resp) != "bad_request" {
			t.Errorf("POST /v1/runs %s: %d, want 400", body, resp.StatusCode)
		}
	}
	// A debug run needs the program to run: refused before the run exists.
	for body, want := range map[string]string{
		`{"mode":"debug"}`: "give its .py file",
		`{"mode":"debug","task":"fix it","files":{"a.py":"1","b.py":"2"}}`: "name it as the entry among the 2 .py files given (a.py, b.py)",
		`{"mode":"debug","files":{"a.py":"1/0"},"entry":"main.py"}`:        "main.py is not among the files given",
	} {
		resp := ts.do(t, "POST", "/v1/runs", body, nil)
		if resp.StatusCode != 400 {
			t.Errorf("POST /v1/runs %s: %d, want 400", body, resp.StatusCode)
			continue
		}
		var e struct{ Error struct{ Message string } }
		json.NewDecoder(resp.Body).Decode(&e)
		if !strings.Contains(e.Error.Message, "entry") || !strings.Contains(e.Error.Message, want) {
			t.Errorf("POST /v1/runs %s: the message %q does not name the entry or lacks %q", body, e.Error.Message, want)
		}
	}
	var list struct{ Runs []json.RawMessage }
	if resp := ts.do(t, "GET", "/v1/runs", "", nil); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/runs: %d", resp.StatusCode)
	} else if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Runs) != 0 {
		t.Errorf("refused runs were stored: %d runs", len(list.Runs))
	}
	for _, q := range []string{"limit=abc", "limit=-1", "limit=1.5", "offset=x", "offset=-3", "status=dnoe", "mode=fast"} {
		resp := ts.do(t, "GET", "/v1/runs?"+q, "", nil)
		if resp.StatusCode != 400 {
			t.Errorf("GET /v1/runs?%s: %d, want 400", q, resp.StatusCode)
			continue
		}
		var e struct{ Error struct{ Message string } }
		json.NewDecoder(resp.Body).Decode(&e)
		name, _, _ := strings.Cut(q, "=")
		if !strings.Contains(e.Error.Message, name) {
			t.Errorf("GET /v1/runs?%s: the message %q does not name %s", q, e.Error.Message, name)
		}
	}
	for _, q := range []string{"limit=5", "status=done", "mode=debug", "offset=0"} {
		if resp := ts.do(t, "GET", "/v1/runs?"+q, "", nil); resp.StatusCode != 200 {
			t.Errorf("GET /v1/runs?%s: %d", q, resp.StatusCode)
		}
	}
}

// A refactor run needs no task: it gets the refactor task as its title.
func TestRunRefactorWithoutTask(t *testing.T) {
	ts := newRunsServer(t, llmtest.Script{{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"clean already"}`}}}})
	resp := ts.do(t, "POST", "/v1/runs", `{"mode":"refactor","files":{"legacy.py":"print(1)\n"}}`, nil)
	if resp.StatusCode != 201 {
		t.Fatalf("POST /v1/runs refactor without a task: %d, want 201", resp.StatusCode)
	}
	var run struct{ Task string }
	json.NewDecoder(resp.Body).Decode(&run)
	if run.Task != agent.RefactorTask {
		t.Errorf("task %q, want %q", run.Task, agent.RefactorTask)
	}
}

// TestAppRunPreview: an app run whose agent leaves its server running
// reports a preview URL (in its report and its run_finished event) that
// opens the app after the run, without a token, until the run's previews
// are closed (POST .../cancel on the ended run), when its session goes.
func TestAppRunPreview(t *testing.T) {
	file := func(path, content string) llmtest.ToolCall {
		b, _ := json.Marshal(map[string]string{"path": path, "content": content})
		return llmtest.ToolCall{Name: "write_file", Arguments: string(b)}
	}
	app := "from flask import Flask\napp = Flask(__name__)\n\n@app.get('/')\ndef home():\n    return 'the app the agent built'\n\nif __name__ == '__main__':\n    app.run(host='127.0.0.1', port=5000)\n"
	wait := `{"code":"import socket, time\nfor _ in range(300):\n    try:\n        socket.create_connection(('127.0.0.1', 5000), 1).close(); break\n    except OSError:\n        time.sleep(0.1)\nprint('up')"}`
	var ts *testServer
	rs := runstest.New(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{file("app.py", app), file("test_app.py", "from app import app\n\ndef test_home():\n    assert app.test_client().get('/').status_code == 200\n"),
			file("requirements.txt", "flask\n"), file("README.md", "# App\n\nRun: python3 app.py\n")}},
		{ToolCalls: []llmtest.ToolCall{{Name: "start_process", Arguments: `{"name":"server","command":"python3 app.py"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: wait}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"a Flask app"}`}}},
	}, func(o *runs.Options) {
		o.PreviewURL = func(id string, port int, exp time.Time) string {
			_, p, _ := net.SplitHostPort(ts.Listener.Addr().String())
			return ts.srv.PreviewURL("localhost:"+p, id, port, exp)
		}
	})
	srv, err := New(&Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Keepalive: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts = &testServer{mgr: rs.Manager, srv: srv, Server: newHTTPTest(srv)}
	t.Cleanup(ts.Close)

	var run store.Run
	if resp := ts.do(t, "POST", "/v1/runs", `{"task":"a Flask app with a home page","mode":"app"}`, &run); resp.StatusCode != 201 {
		t.Fatalf("start: %d", resp.StatusCode)
	}
	testutil.WaitFor(t, 3*time.Minute, func() error {
		ts.do(t, "GET", "/v1/runs/"+run.ID, "", &run)
		if run.Status == "running" {
			return errors.New("still running")
		}
		return nil
	})
	var rep agent.Report
	json.Unmarshal(run.Report, &rep)
	if run.Status != "done" || len(rep.Previews) != 1 || rep.Previews[0].Port != 5000 || time.Until(rep.Previews[0].ExpiresAt) < 20*time.Minute {
		t.Fatalf("run %s %s: previews %+v", run.Status, run.Error, rep.Previews)
	}
	pv := rep.Previews[0]
	// Asked under another name (as through a gateway), the URL names that
	// name, with the same grant.
	{
		req, _ := http.NewRequest("GET", ts.URL+"/v1/runs/"+run.ID, nil)
		req.Host = "localhost:1234"
		resp := mustDo(t, http.DefaultClient, req)
		var other store.Run
		json.NewDecoder(resp.Body).Decode(&other)
		var orep agent.Report
		json.Unmarshal(other.Report, &orep)
		u, _ := url.Parse(pv.URL)
		if len(orep.Previews) != 1 || orep.Previews[0].URL != "http://"+strings.Split(u.Host, ".")[0]+".localhost:1234/?"+u.RawQuery {
			t.Errorf("previews asked as localhost:1234: %+v (stored %s)", orep.Previews, pv.URL)
		}
	}
	// The run's event stream says it too.
	evResp, err := http.Get(ts.URL + "/v1/runs/" + run.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	evs := readSSE(t, evResp.Body)
	evResp.Body.Close()
	var fin map[string]any
	for _, e := range evs {
		if e.event == agent.EventFinished {
			fin = e.data
		}
	}
	if b, _ := json.Marshal(fin); !strings.Contains(string(b), pv.URL) {
		t.Errorf("run_finished does not carry the preview: %s", b)
	}

	// A browser opens the URL after the run: *.localhost is the loopback.
	open := func(raw string) (int, string) {
		t.Helper()
		jar, _ := cookiejar.New(nil)
		browser := &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, ts.Listener.Addr().String())
		}}}
		resp, err := browser.Get(raw)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := open(pv.URL); st != 200 || body != "the app the agent built" {
		t.Fatalf("preview after the run: %d %q", st, body)
	}
	u, _ := url.Parse(pv.URL)
	u.RawQuery = ""
	if st, _ := open(u.String()); st != http.StatusForbidden {
		t.Errorf("the preview's page without its signature: %d, want 403", st)
	}
	// Closing the previews ends the session: the URL no longer answers.
	if resp := ts.do(t, "POST", "/v1/runs/"+run.ID+"/cancel", "", nil); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("close the previews: %d", resp.StatusCode)
	}
	if st, _ := open(pv.URL); st != http.StatusNotFound {
		t.Errorf("preview after its run's previews were closed: %d, want 404", st)
	}
	if rs.Runs.PreviewsKept(run.ID) || len(rs.Manager.List(runs.SessionOwner)) != 0 {
		t.Errorf("the run's session outlived its previews")
	}
}
