package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// termClient is a client of a session's terminal socket.
type termClient struct {
	c      *websocket.Conn
	mu     sync.Mutex
	screen strings.Builder
	exit   *terminalControl
	closed chan struct{}
}

func dialTerminal(t *testing.T, ts *testServer, id, query string) *termClient {
	t.Helper()
	u := "ws" + strings.TrimPrefix(ts.URL, "http") + "/v1/sessions/" + id + "/terminal?token=" + ts.token + query
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatalf("dial the terminal: %v", err)
	}
	tc := &termClient{c: c, closed: make(chan struct{})}
	t.Cleanup(func() { c.CloseNow() })
	go func() {
		defer close(tc.closed)
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			tc.mu.Lock()
			if typ == websocket.MessageBinary {
				tc.screen.Write(b)
			} else {
				json.Unmarshal(b, &tc.exit)
			}
			tc.mu.Unlock()
		}
	}()
	return tc
}

func (tc *termClient) typeIn(t *testing.T, s string) {
	t.Helper()
	if err := tc.c.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

// waitShown waits for re in what the terminal showed after from and
// returns the end of the match.
func (tc *termClient) waitShown(t *testing.T, from int, re string) int {
	t.Helper()
	rx := regexp.MustCompile(re)
	end := 0
	testutil.WaitFor(t, 30*time.Second, func() error {
		tc.mu.Lock()
		out := tc.screen.String()
		tc.mu.Unlock()
		if loc := rx.FindStringIndex(out[from:]); loc != nil {
			end = from + loc[1]
			return nil
		}
		return fmt.Errorf("no %q on the terminal after byte %d: %q", re, from, out[from:])
	})
	return end
}

// A session's terminal over its WebSocket: python3 typed into bash answers,
// a resize reaches the program, the shell's exit is reported, and closing
// the socket or the session leaves no process behind.
func TestTerminalSocket(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{"terminal-token-0123456789"}})
	id := ts.create(t, `{"env":{"GREETING":"hello-from-env"}}`)
	ts.exec(t, id, "open('made-by-kernel.txt', 'w').write('x')")

	tc := dialTerminal(t, ts, id, "&cols=90&rows=30")
	at := tc.waitShown(t, 0, `\$ $`)
	tc.typeIn(t, "echo $GREETING; ls; stty size\n")
	at = tc.waitShown(t, at, `\rhello-from-env\r\nmade-by-kernel.txt\r\n30 90\r\n`)
	tc.typeIn(t, "python3 -q\n")
	at = tc.waitShown(t, at, `>>> $`)
	tc.typeIn(t, "print(6*7)\n")
	at = tc.waitShown(t, at, `\r\n42\r\n>>> $`)
	tc.c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"resize","cols":120,"rows":40}`))
	tc.typeIn(t, "import os; print(tuple(os.get_terminal_size()))\n")
	at = tc.waitShown(t, at, `\r\n\(120, 40\)\r\n`)
	tc.typeIn(t, "exit()\nexit 5\n")
	select {
	case <-tc.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the socket stayed open after the shell exited")
	}
	if tc.exit == nil || tc.exit.Type != "exit" || tc.exit.ExitCode == nil || *tc.exit.ExitCode != 5 {
		t.Errorf("last message %+v, want exit with code 5", tc.exit)
	}

	// Closing the socket kills what runs in the terminal.
	marker := fmt.Sprintf("sandloop-term-%d", time.Now().UnixNano())
	tc = dialTerminal(t, ts, id, "")
	at = tc.waitShown(t, 0, `\$ $`)
	tc.typeIn(t, "python3 -q -X "+marker+"\n")
	tc.waitShown(t, at, `>>> $`)
	if len(testutil.PidsWithArg(marker)) == 0 {
		t.Fatal("python3 is not running")
	}
	tc.c.Close(websocket.StatusNormalClosure, "")
	testutil.WaitFor(t, 10*time.Second, func() error {
		if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
			return fmt.Errorf("left behind after the socket closed: %v", pids)
		}
		return nil
	})

	// Closing the session ends its terminal.
	tc = dialTerminal(t, ts, id, "")
	at = tc.waitShown(t, 0, `\$ $`)
	tc.typeIn(t, "python3 -q -X "+marker+"\n")
	tc.waitShown(t, at, `>>> $`)
	if resp := ts.do(t, "DELETE", "/v1/sessions/"+id, "", nil); resp.StatusCode != 204 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	select {
	case <-tc.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the socket stayed open after the session was closed")
	}
	if tc.exit == nil || tc.exit.Signal != "SIGKILL" {
		t.Errorf("last message %+v, want exit by SIGKILL", tc.exit)
	}
	if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
		t.Errorf("left behind after the session closed: %v", pids)
	}
}

// What the terminal route refuses, with the API's JSON errors.
func TestTerminalRefused(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{"terminal-token-0123456789"}})
	id := ts.create(t, "")
	path := "/v1/sessions/" + id + "/terminal"
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	for _, tc := range []struct {
		name, path, token string
		hdr               []string
		status            int
		code              string
	}{
		{"no token", path, "", upgrade, 401, "unauthorized"},
		{"another session", "/v1/sessions/0000000000000000/terminal", "terminal-token-0123456789", upgrade, 404, "not_found"},
		{"not a WebSocket", path, "terminal-token-0123456789", nil, 426, "upgrade_required"},
		{"bad size", path + "?cols=0", "terminal-token-0123456789", upgrade, 400, "bad_request"},
		{"another origin", path, "terminal-token-0123456789", append([]string{"Origin", "http://evil.example"}, upgrade...), 403, "cross_origin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", ts.URL+tc.path, nil)
			if tc.token != "" {
				q := req.URL.Query()
				q.Set("token", tc.token)
				req.URL.RawQuery = q.Encode()
			}
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				req.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if code := errCode(t, resp); code != tc.code {
				t.Errorf("code %s, want %s", code, tc.code)
			}
		})
	}
}
