package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// LineTransport is newline-delimited JSON-RPC over a reader and a writer
// (stdin and stdout), like [mcp.IOTransport], with two differences a client
// can count on:
//
//   - A line that is not a JSON-RPC message is answered with a JSON-RPC
//     error (-32700 parse error, or -32600 invalid request) and skipped; the
//     SDK's transport ends the connection on it, so one bad line from a
//     client would lose its session.
//   - At the end of input, the requests already received are answered
//     before the connection ends (`printf '...' | sandloop mcp` gets every
//     answer); the SDK's transport ends at once and drops them.
type LineTransport struct {
	Reader io.ReadCloser
	Writer io.Writer
	// MaxLineLength bounds one line. If zero, [mcp.DefaultMaxLineLength].
	MaxLineLength int
}

// Connect implements [mcp.Transport].
func (t *LineTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	max := t.MaxLineLength
	if max <= 0 {
		max = mcp.DefaultMaxLineLength
	}
	lc := &lineConn{src: t.Reader, in: bufio.NewReader(t.Reader), out: t.Writer, max: max, pending: map[jsonrpc.ID]bool{}}
	lc.cond = sync.NewCond(&lc.mu)
	inner := &mcp.IOTransport{Reader: lc, Writer: (*lineWriter)(lc), MaxLineLength: -1} // lines are bounded here
	return inner.Connect(ctx)
}

// lineConn sits between the client's bytes and the SDK's reader: it passes
// on valid messages a line at a time, answers invalid ones itself, and
// holds back the end of input until every request passed on is answered.
type lineConn struct {
	src io.Closer
	in  *bufio.Reader
	max int
	buf []byte // the rest of the line being handed to the SDK

	wmu sync.Mutex // one line at a time on out, ours and the SDK's
	out io.Writer

	mu      sync.Mutex
	cond    *sync.Cond
	pending map[jsonrpc.ID]bool // requests passed on and not yet answered
	closed  bool
}

func (c *lineConn) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		line, err := c.readLine()
		if len(bytes.TrimSpace(line)) > 0 {
			c.take(line)
		}
		if err == io.EOF && len(c.buf) == 0 {
			c.mu.Lock()
			for len(c.pending) > 0 && !c.closed {
				c.cond.Wait()
			}
			c.mu.Unlock()
			return 0, io.EOF
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

// readLine reads one line; a longer one than max is read to its end and
// returned cut, so that it fails to parse and is answered as such.
func (c *lineConn) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := c.in.ReadSlice('\n')
		if len(line) < c.max {
			line = append(line, frag[:min(len(frag), c.max-len(line))]...)
		}
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// take passes a valid line on to the SDK, noting the requests in it, or
// answers it with an error.
func (c *lineConn) take(line []byte) {
	line = bytes.TrimSpace(line)
	if !json.Valid(line) {
		c.answer(json.RawMessage("null"), jsonrpc.CodeParseError, "parse error: the line is not JSON")
		return
	}
	var msgs []jsonrpc.Message
	if line[0] == '[' {
		var raws []json.RawMessage
		_ = json.Unmarshal(line, &raws)
		for _, r := range raws {
			m, err := jsonrpc.DecodeMessage(r)
			if err != nil {
				c.answer(idOf(r), jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error())
				return
			}
			msgs = append(msgs, m)
		}
	} else {
		m, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			c.answer(idOf(line), jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error())
			return
		}
		msgs = append(msgs, m)
	}
	c.mu.Lock()
	for _, m := range msgs {
		if r, ok := m.(*jsonrpc.Request); ok && r.ID.IsValid() {
			c.pending[r.ID] = true
		}
	}
	c.mu.Unlock()
	c.buf = append(line, '\n')
}

// idOf is the message's id if it has a usable one (a string or a number),
// else null.
func idOf(raw []byte) json.RawMessage {
	var m struct{ ID json.RawMessage }
	if json.Unmarshal(raw, &m) == nil && len(m.ID) > 0 && (m.ID[0] == '"' || m.ID[0] == '-' || m.ID[0] >= '0' && m.ID[0] <= '9') {
		return m.ID
	}
	return json.RawMessage("null")
}

// answer writes an error response itself: the SDK's encoder leaves out a
// null id, which JSON-RPC requires when the request's id is unknown.
func (c *lineConn) answer(id json.RawMessage, code int64, msg string) {
	data, err := json.Marshal(struct {
		Version string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	if err != nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.out.Write(append(data, '\n'))
}

// Close ends the connection: a Read waiting for answers returns, and the
// client's reader is closed, which unblocks a read of stdin.
func (c *lineConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return c.src.Close()
}

// lineWriter is the SDK's side of out: every line it writes is one message
// (or a batch); the responses among them settle pending requests.
type lineWriter lineConn

func (w *lineWriter) Write(p []byte) (int, error) {
	c := (*lineConn)(w)
	c.wmu.Lock()
	n, err := c.out.Write(p)
	c.wmu.Unlock()
	c.settle(bytes.TrimSpace(p))
	return n, err
}

func (c *lineConn) settle(line []byte) {
	var raws []json.RawMessage
	if len(line) > 0 && line[0] == '[' {
		_ = json.Unmarshal(line, &raws)
	} else {
		raws = []json.RawMessage{line}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range raws {
		if m, err := jsonrpc.DecodeMessage(r); err == nil {
			if resp, ok := m.(*jsonrpc.Response); ok {
				delete(c.pending, resp.ID)
			}
		}
	}
	c.cond.Broadcast()
}

// Close is the SDK closing its writer: stdout stays open, it is the
// process's.
func (w *lineWriter) Close() error { return nil }
