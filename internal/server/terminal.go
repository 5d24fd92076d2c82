package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
)

// The terminal of a session: GET /v1/sessions/{id}/terminal?cols=&rows=,
// upgraded to a WebSocket. A shell (session.TerminalShell) runs on a
// pseudo-terminal in a jail of its own on the session's workspace for as
// long as the socket is open.
//
// Binary messages carry bytes: from the client what is typed, from the
// server what the terminal displays. Text messages are JSON: the client
// sends {"type":"resize","cols":N,"rows":N}; the server's last message is
// {"type":"exit","exit_code":N} (and "signal" if one ended it) before it
// closes the socket.
//
// Browsers cannot set headers on a WebSocket, so this route takes the
// token as ?token= too (QueryTokenRoutes), as the event stream does. A
// WebSocket URL is not kept in the history or sent as a Referer, and the
// server logs paths without their queries. (A one-time ticket from a POST
// would keep the token out of the URL altogether, for a second request
// and state to keep per ticket.) The Origin must be this server's (the
// cross-origin check of every route, and the WebSocket library's own).

// terminalControl is a text message of the terminal's socket.
type terminalControl struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// maxTerminalMessage bounds a message from the client (typed or pasted input).
const maxTerminalMessage = 1 << 20

func (s *Server) terminal(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	size := jail.WindowSize{Cols: 80, Rows: 24}
	for name, v := range map[string]*int{"cols": &size.Cols, "rows": &size.Rows} {
		q := r.URL.Query().Get(name)
		if q == "" {
			continue
		}
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > jail.MaxWindowSide {
			writeError(w, badRequest("%s=%q: must be a whole number from 1 to %d", name, q, jail.MaxWindowSide))
			return
		}
		*v = n
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeError(w, &apiError{http.StatusUpgradeRequired, "upgrade_required", "the terminal is a WebSocket: connect with Upgrade: websocket (see /openapi.yaml)", 0})
		return
	}
	// (A session whose kernel died still has its files: a terminal may
	// look at them.)
	if err := ms.Err(); errors.Is(err, session.ErrClosed) {
		writeError(w, err)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered
	}
	defer c.CloseNow()
	c.SetReadLimit(maxTerminalMessage)
	// Typing in the terminal is using the session: it is not idle meanwhile.
	defer ms.Lease()()

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	in, typed := io.Pipe()
	defer typed.Close()
	p, err := ms.StartTerminal(ctx, size, in, socketWriter{ctx, c})
	if err != nil {
		s.log.Warn("terminal", "session", ms.ID(), "err", err)
		c.Close(websocket.StatusInternalError, "the terminal could not start")
		return
	}
	ended := make(chan struct{})
	var res *jail.Result
	go func() {
		res, _ = p.Wait()
		close(ended)
	}()
	go func() {
		// The client's messages, until it goes away or the terminal ends.
		defer p.Kill()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := typed.Write(b); err != nil {
					return
				}
				continue
			}
			var m terminalControl
			if json.Unmarshal(b, &m) != nil || m.Type != "resize" {
				c.Close(websocket.StatusUnsupportedData, `text messages are {"type":"resize","cols":N,"rows":N}`)
				return
			}
			if err := p.Resize(jail.WindowSize{Cols: m.Cols, Rows: m.Rows}); err != nil {
				var ae *jail.ArgumentError
				if errors.As(err, &ae) {
					c.Close(websocket.StatusPolicyViolation, ae.Error())
					return
				}
			}
		}
	}()
	select {
	case <-ended:
	case <-ms.Done():
		// The session was closed: so is its terminal.
		p.Kill()
		<-ended
	}
	if res != nil && ctx.Err() == nil {
		end := terminalControl{Type: "exit", ExitCode: &res.ExitCode, Signal: res.Signal}
		b, _ := json.Marshal(end)
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_ = c.Write(wctx, websocket.MessageText, b)
		wcancel()
	}
	c.Close(websocket.StatusNormalClosure, "the terminal ended")
}

// socketWriter sends what the terminal displays as binary messages. A
// client that stops reading holds the terminal's output back (the program
// then waits, as on a real terminal), until the socket is closed.
type socketWriter struct {
	ctx context.Context
	c   *websocket.Conn
}

func (w socketWriter) Write(b []byte) (int, error) {
	if err := w.c.Write(w.ctx, websocket.MessageBinary, b); err != nil {
		return 0, err
	}
	return len(b), nil
}
