package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/testutil"
)

// portApp starts, in the kernel, a server on 127.0.0.1:PORT that answers
// with what it was sent, and switches a request with "Upgrade: echo" to
// an echo of upper-cased bytes (as a WebSocket is switched).
const portApp = `
import threading, http.server, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade") == "echo":
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "echo")
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.connection.recv(1024)
                if not b:
                    break
                self.connection.sendall(b.upper())
            self.close_connection = True
            return
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", %d), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
`

type appSaw struct {
	Path    string
	Headers map[string]string
}

// TestPortsThroughGateway: a server inside a session answers through the
// gateway by every route serve has (the native route, PORT-ID.localhost,
// E2B's headers, a preview URL, an upgraded connection), reaching the host
// that holds the session; another token, or none, is refused; a public
// session's port needs none.
func TestPortsThroughGateway(t *testing.T) {
	f := newFixture(t, 2)
	id, _ := f.create(tok1)
	if st, body := f.do(tok1, "POST", "/v1/sessions/"+id+"/execute", fmt.Sprintf(`{"code":%q}`, fmt.Sprintf(portApp, 8000))); st != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("start the app: %d %s", st, body)
	}
	gwAddr := f.ts.Listener.Addr().String()
	_, gwPort, _ := net.SplitHostPort(gwAddr)
	hostName := fmt.Sprintf("8000-%s.localhost:%s", id, gwPort)
	send := func(client *http.Client, host, path string, hdr ...string) (*http.Response, appSaw) {
		t.Helper()
		req, _ := http.NewRequest("GET", f.ts.URL+path, nil)
		if host != "" {
			req.Host = host
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var saw appSaw
		if resp.StatusCode == 200 {
			json.NewDecoder(resp.Body).Decode(&saw)
		}
		return resp, saw
	}
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

	// The list, through the gateway, names the gateway's address.
	st, body := f.do(tok1, "GET", "/v1/sessions/"+id+"/ports", "")
	if st != 200 || !strings.Contains(body, `"url":"http://`+hostName+`/"`) || !strings.Contains(body, `"path_url":"`+f.ts.URL+"/v1/sessions/"+id+"/ports/8000/") {
		t.Fatalf("ports: %d %s (want the gateway's names, %s)", st, body, hostName)
	}

	for _, c := range []struct {
		name, host, path string
		hdr              []string
		wantPath         string
	}{
		{"the native route", "", "/v1/sessions/" + id + "/ports/8000/api?q=1", bearer(tok1), "/api?q=1"},
		{"the host name", hostName, "/static/app.js", bearer(tok1), "/static/app.js"},
		{"E2B's headers", "", "/e2b", append(bearer(tok1), "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "8000"), "/e2b"},
	} {
		resp, saw := send(http.DefaultClient, c.host, c.path, c.hdr...)
		if resp.StatusCode != 200 || saw.Path != c.wantPath {
			t.Errorf("%s with the owner's token: %d %+v, want the app at %s", c.name, resp.StatusCode, saw, c.wantPath)
			continue
		}
		for k := range saw.Headers {
			if strings.EqualFold(k, "Authorization") || strings.HasPrefix(strings.ToLower(k), "x-sandloop-") {
				t.Errorf("%s: the app was sent %s", c.name, k)
			}
		}
		for _, tok := range []string{tok2, "wrong-token-0123456789", ""} {
			var h []string
			if tok != "" {
				h = bearer(tok)
			}
			if c.name == "E2B's headers" {
				h = append(h, "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "8000")
			}
			if resp, _ := send(http.DefaultClient, c.host, c.path, h...); resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s with token %q: %d, want 403", c.name, tok, resp.StatusCode)
			}
		}
	}
	// An app's own Authorization (not one of the gateway's tokens) is the
	// app's: passed on.
	if resp, saw := send(http.DefaultClient, hostName, "/", append(bearer(tok1), "X-Other", "1")...); resp.StatusCode != 200 || saw.Headers["Host"] != hostName {
		t.Errorf("the app saw Host %q, want the name the user typed %q", saw.Headers["Host"], hostName)
	}

	// A preview URL: made through the gateway, opened without a token.
	st, body = f.do(tok1, "POST", "/v1/sessions/"+id+"/previews", `{"port": 8000, "expires_in_s": 120}`)
	var prev struct {
		URL     string `json:"url"`
		PathURL string `json:"path_url"`
	}
	if json.Unmarshal([]byte(body), &prev); st != 201 || !strings.HasPrefix(prev.URL, "http://"+hostName+"/?sandloop_sig=") {
		t.Fatalf("preview: %d %s", st, body)
	}
	for _, raw := range []string{prev.URL, prev.PathURL} {
		jar, _ := cookiejar.New(nil)
		browser := &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, gwAddr) // *.localhost is the loopback, as browsers resolve it
		}}}
		resp, err := browser.Get(raw)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"path": "/"`) {
			t.Errorf("preview %s: %d %s", raw, resp.StatusCode, b)
		}
		u, _ := url.Parse(raw)
		u.RawQuery = ""
		u = u.JoinPath("next")
		if resp, err := browser.Get(u.String()); err != nil || resp.StatusCode != 200 {
			t.Errorf("after the preview's first visit, %s: %v %v", u, resp.StatusCode, err)
		} else {
			resp.Body.Close()
		}
	}

	// An upgraded connection (a WebSocket's) passes both ways.
	c, err := net.Dial("tcp", gwAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", hostName, tok1)
	br := bufio.NewReader(c)
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != 101 {
		t.Fatalf("upgrade through the gateway: %v %v", up, err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "through the gateway")
	buf := make([]byte, len("through the gateway"))
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "THROUGH THE GATEWAY" {
		t.Fatalf("echo: %q %v", buf, err)
	}

	// A public session's port needs no token; an unknown session is 404.
	st, body = f.do(tok2, "POST", "/v1/sessions", `{"public_ports": true}`)
	var pub struct{ ID string }
	if json.Unmarshal([]byte(body), &pub); st != 201 {
		t.Fatalf("create public: %d %s", st, body)
	}
	if st, body := f.do(tok2, "POST", "/v1/sessions/"+pub.ID+"/execute", fmt.Sprintf(`{"code":%q}`, fmt.Sprintf(portApp, 5000))); st != 200 {
		t.Fatalf("start the public app: %d %s", st, body)
	}
	if resp, saw := send(http.DefaultClient, fmt.Sprintf("5000-%s.localhost:%s", pub.ID, gwPort), "/hi"); resp.StatusCode != 200 || saw.Path != "/hi" {
		t.Errorf("public port without a token: %d %+v", resp.StatusCode, saw)
	}
	if resp, _ := send(http.DefaultClient, "5000-0123456789abcdef.localhost:"+gwPort, "/", bearer(tok1)...); resp.StatusCode != 404 {
		t.Errorf("unknown session's port: %d, want 404", resp.StatusCode)
	}
	// E2B's own ports (envd's, the interpreter's) are E2B's API, which a
	// gateway does not serve: said, not proxied to the app.
	if resp, _ := send(http.DefaultClient, "", "/health", append(bearer(tok1), "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49983")...); resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("envd's port through the gateway: %d, want 501", resp.StatusCode)
	}
	// A port's traffic left the placement alone (a DELETE to the app is the app's).
	req, _ := http.NewRequest("DELETE", f.ts.URL+"/a/b", nil)
	req.Host = hostName
	req.Header.Set("Authorization", "Bearer "+tok1)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	if _, err := f.pg.GetPlacement(t.Context(), id); err != nil {
		t.Errorf("a DELETE to the app dropped the session's placement: %v", err)
	}
}

// TestRunPreviewThroughGateway: an app run started through the gateway
// keeps its sandbox for the server its agent left running, and the
// preview URL its report names (under the gateway's name) opens the app
// through the gateway, on the host that ran it, without a token: the run's
// host recorded the kept session in the cell's sessions table. The session
// API stays closed to the run's owner; cancelling the ended run closes
// the preview and drops the record.
func TestRunPreviewThroughGateway(t *testing.T) {
	file := func(path, content string) llmtest.ToolCall {
		b, _ := json.Marshal(map[string]string{"path": path, "content": content})
		return llmtest.ToolCall{Name: "write_file", Arguments: string(b)}
	}
	app := "from flask import Flask\napp = Flask(__name__)\n\n@app.get('/')\ndef home():\n    return 'the app the agent built'\n\nif __name__ == '__main__':\n    app.run(host='127.0.0.1', port=5000)\n"
	wait := `{"code":"import socket, time\nfor _ in range(300):\n    try:\n        socket.create_connection(('127.0.0.1', 5000), 1).close(); break\n    except OSError:\n        time.sleep(0.1)\nprint('up')"}`
	model := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{file("app.py", app), file("test_app.py", "from app import app\n\ndef test_home():\n    assert app.test_client().get('/').status_code == 200\n"),
			file("requirements.txt", "flask\n"), file("README.md", "# App\n\nRun: python3 app.py\n")}},
		{ToolCalls: []llmtest.ToolCall{{Name: "start_process", Arguments: `{"name":"server","command":"python3 app.py"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: wait}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"a Flask app"}`}}},
	})
	f := newFixture(t, 2, func(sh *swapHost) {
		sh.runs = func(o *runs.Options) (*runs.Service, store.History) {
			o.Store = sh.pg
			o.Provider = func(context.Context, string) (llm.Provider, error) {
				return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: model.URL, APIKey: "k", Model: "gpt-4o-mini"}), nil
			}
			return runs.New(o), sh.pg
		}
	})
	gwAddr := f.ts.Listener.Addr().String()
	_, gwPort, _ := net.SplitHostPort(gwAddr)

	st, body := f.do(tok1, "POST", "/v1/runs", `{"task":"a Flask app with a home page","mode":"app"}`)
	var run store.Run
	if json.Unmarshal([]byte(body), &run); st != 201 || run.ID == "" {
		t.Fatalf("start the run: %d %s", st, body)
	}
	testutil.WaitFor(t, 3*time.Minute, func() error {
		st, body := f.do(tok1, "GET", "/v1/runs/"+run.ID, "")
		if json.Unmarshal([]byte(body), &run); st != 200 || run.Status == "running" {
			return fmt.Errorf("run: %d %s", st, run.Status)
		}
		return nil
	})
	var rep agent.Report
	json.Unmarshal(run.Report, &rep)
	if run.Status != "done" || len(rep.Previews) != 1 || rep.Previews[0].Port != 5000 {
		t.Fatalf("run %s %s: previews %+v", run.Status, run.Error, rep.Previews)
	}
	pv := rep.Previews[0]
	u, err := url.Parse(pv.URL)
	if err != nil || !strings.HasSuffix(u.Host, ".localhost:"+gwPort) || !strings.HasPrefix(u.Host, "5000-") {
		t.Fatalf("preview URL %s does not name the gateway (%s)", pv.URL, gwAddr)
	}
	sid := strings.TrimSuffix(strings.TrimPrefix(u.Host, "5000-"), ".localhost:"+gwPort)
	runPl, err1 := f.pg.GetPlacement(t.Context(), run.ID)
	sessPl, err2 := f.pg.GetPlacement(t.Context(), sid)
	if err1 != nil || err2 != nil || sessPl.Host != runPl.Host || sessPl.Epoch != runPl.Epoch || sessPl.Kind != store.KindSession {
		t.Fatalf("the run's session is not recorded on the run's host: run %+v %v, session %+v %v", runPl, err1, sessPl, err2)
	}

	browser := func() *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, gwAddr) // *.localhost is the loopback, as browsers resolve it
		}}}
	}
	open := func(raw string) (int, string) {
		t.Helper()
		resp, err := browser().Get(raw)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The preview, and the native route with the same signature.
	pathURL := f.ts.URL + "/v1/sessions/" + sid + "/ports/5000/?" + u.RawQuery
	for _, raw := range []string{pv.URL, pathURL} {
		if st, body := open(raw); st != 200 || body != "the app the agent built" {
			t.Errorf("preview %s through the gateway: %d %q", raw, st, body)
		}
	}
	unsigned := *u
	unsigned.RawQuery = ""
	if st, _ := open(unsigned.String()); st != http.StatusForbidden {
		t.Errorf("the preview without its signature: %d, want 403", st)
	}
	// The kept sandbox is the run's, not a session of its owner's.
	if st, body := f.do(tok1, "POST", "/v1/sessions/"+sid+"/execute", `{"code":"1"}`); st != http.StatusNotFound {
		t.Errorf("the run's sandbox through the session API: %d %s, want 404", st, body)
	}

	// Closing the previews (cancel of the ended run) closes the sandbox
	// and drops its record: the URL no longer answers.
	if st, body := f.do(tok1, "POST", "/v1/runs/"+run.ID+"/cancel", ""); st != http.StatusAccepted {
		t.Fatalf("close the previews: %d %s", st, body)
	}
	if _, err := f.pg.GetPlacement(t.Context(), sid); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the closed preview's record: %v, want not found", err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if st, _ := open(pv.URL); st != http.StatusNotFound {
			return fmt.Errorf("preview after its run's previews were closed: %d, want 404", st)
		}
		return nil
	})
}
