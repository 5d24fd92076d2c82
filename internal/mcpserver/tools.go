package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/tools"
)

// addTools adds the offered tools, in the order of ToolNames.
func (s *Server) addTools() error {
	o := s.opts
	var names []string
	_, canFork := s.src.(Forker)
	for _, n := range ToolNames {
		if n == tools.ForkSession && !canFork {
			continue // a source of sessions that cannot copy them (sandloop mcp's own)
		}
		if sn, ok := s.src.(Snapshotter); n == tools.SnapshotName && (!ok || !sn.KeepsSnapshots()) {
			continue // no snapshot store
		}
		if slices.Contains(o.Tools, n) {
			names = append(names, n)
		}
	}
	set, err := tools.New(tools.Config{
		DefaultTimeout: o.DefaultTimeout,
		MaxTimeout:     o.MaxTimeout,
		MaxCodeBytes:   o.MaxCodeBytes,
		MaxTextBytes:   o.MaxTextBytes,
		MaxFileBytes:   o.MaxFileBytes,
		Network:        o.Network,
		Allow:          o.Allow,
	}, names...)
	if err != nil {
		return err
	}
	set.AddToMCP(s.mcp, func(ctx context.Context, req *mcp.CallToolRequest) (tools.Session, kernel.EventFunc, error) {
		return &callSession{s: s, req: req}, s.progress(ctx, req), nil
	})
	return nil
}

// callSession is the connection's session as one tool call sees it: made
// on first use, restarted when its kernel died, replaced when the session
// manager closed it, each said in the call's note.
type callSession struct {
	s    *Server
	req  *mcp.CallToolRequest
	note string
}

func (c *callSession) Note() string { return c.note }

// addNote adds n to the call's note.
func (c *callSession) addNote(n string) {
	if c.note != "" {
		c.note += "\n"
	}
	c.note += n
}

// asleep is a session that may sleep on a snapshot (session.Managed:
// hibernated when idle past serve's --idle-hibernate, or put to sleep
// when its keeper died), which a call wakes.
type asleep interface {
	Hibernated() bool
	Wake(ctx context.Context) (*session.Restored, error)
}

// awake is the connection's session, made on first use, and woken first
// if it slept: what came back, and what did not, goes to the call's note
// (a wake inside the call would leave the model to find its variables
// gone).
func (c *callSession) awake(ctx context.Context) (Session, error) {
	sess, err := c.s.session(ctx, c.req.Session)
	if err != nil {
		return nil, err
	}
	if a, ok := sess.(asleep); ok && a.Hibernated() {
		r, err := a.Wake(ctx)
		switch {
		case errors.Is(err, session.ErrClosed):
			return sess, nil // the call finds it closed, and says so
		case err != nil:
			return nil, fmt.Errorf("wake the sandbox session: %w", err)
		case r != nil:
			c.addNote(tools.WokeNote(toolsRestored(r)))
		}
	}
	return sess, nil
}

func (c *callSession) Files(ctx context.Context) (tools.Files, error) {
	sess, err := c.awake(ctx)
	if err != nil {
		return nil, err
	}
	return c.s.workspace(sess)
}

func (c *callSession) Execute(ctx context.Context, kreq kernel.Request, onEvent kernel.EventFunc) (*kernel.Result, error) {
	s, ss := c.s, c.req.Session
	sess, err := c.awake(ctx)
	if err != nil {
		return nil, err
	}
	res, err := sess.Execute(ctx, kreq, onEvent)
	switch {
	case errors.Is(err, session.ErrRestartRequired):
		c.addNote(fmt.Sprintf("note: the previous kernel had died (%v); a fresh one was started for this call: Python variables are gone, files are kept", err))
		if err := sess.Restart(ctx); err != nil {
			return nil, fmt.Errorf("restart the sandbox session: %w", err)
		}
		res, err = sess.Execute(ctx, kreq, onEvent)
	case errors.Is(err, session.ErrClosed):
		c.addNote("note: the previous sandbox session had been closed; a new one was started for this call: Python variables and files are gone")
		s.replace(ss, sess)
		sess, err = s.session(ctx, ss)
		if err != nil {
			return nil, err
		}
		res, err = sess.Execute(ctx, kreq, onEvent)
	}
	if err != nil {
		return nil, fmt.Errorf("execute: %w", err)
	}
	return res, nil
}

// Reset restarts the connection's kernel, and empties /workspace if asked.
func (c *callSession) Reset(ctx context.Context, clearFiles bool) (string, error) {
	s, ss := c.s, c.req.Session
	sess := s.existing(ss)
	if sess == nil {
		// Nothing ran yet: the next call starts a fresh session anyway.
		return "The session is fresh: no code has run in it yet, and /workspace is empty.", nil
	}
	msg := "The Python kernel was restarted: all variables and imports are gone; files in /workspace are kept."
	if err := sess.Restart(ctx); errors.Is(err, session.ErrClosed) {
		s.replace(ss, sess)
		return "The sandbox session had already been closed; the next call starts a new one with an empty /workspace.", nil
	} else if err != nil {
		return "", fmt.Errorf("restart: %w", err)
	}
	if clearFiles {
		ws, err := s.workspace(sess)
		if err != nil {
			return "", err
		}
		defer ws.Close()
		if err := ws.Clear(); err != nil {
			return "", fmt.Errorf("clear /workspace: %w", err)
		}
		msg = "The Python kernel was restarted and /workspace was emptied: all variables, imports and files are gone."
	}
	return msg, nil
}

// progress returns an event func that reports output as progress
// notifications when the client asked for them (a progress token), at
// most twice a second, so a client can show it and keep a long call alive.
func (s *Server) progress(ctx context.Context, req *mcp.CallToolRequest) kernel.EventFunc {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	var n float64
	var last time.Time
	return func(ev kernel.Event) {
		if ev.Type != kernel.EventStdout && ev.Type != kernel.EventStderr {
			return
		}
		if now := time.Now(); now.Sub(last) >= 500*time.Millisecond {
			last = now
			n++
			msg := lastLine(ev.Text)
			if len(msg) > 200 {
				msg = cutUTF8(msg, 200) + "…"
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg}); err != nil {
				s.log.Debug("progress notification", "err", err)
			}
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not
// split a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
