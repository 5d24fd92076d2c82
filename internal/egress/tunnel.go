package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// tunnel serves a CONNECT request.
func (g *Gate) tunnel(c *countConn, br *bufio.Reader, req *http.Request) {
	start := time.Now()
	host, port := splitTarget(req)
	e := Entry{Time: start, Method: req.Method, Host: host, Port: port}
	defer g.finish(&e, c, start)
	if _, _, err := net.SplitHostPort(req.Host); err != nil {
		r := &refusal{http.StatusBadRequest, "sandloop: CONNECT needs host:port"}
		e.Reason = r.msg
		writeRefusal(c, r)
		return
	}
	// From the gate's context: Close ends a lookup or dial under way.
	addrs, al, r := g.check(g.ctx, host, port)
	if r == nil {
		up, err := g.dial(g.ctx, addrs, port)
		if err != nil {
			r = &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: could not connect to %s: %v", net.JoinHostPort(host, strconv.Itoa(port)), dialReason(err))}
		} else {
			defer up.Close()
			e.Addr = up.RemoteAddr().String()
			if r := g.opened(e, c, start, al); r != nil {
				e.Reason = r.msg
				writeRefusal(c, r)
				return
			}
			e.Allowed = true
			if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
				return
			}
			if n := br.Buffered(); n > 0 {
				b, _ := br.Peek(n)
				if _, err := up.Write(b); err != nil {
					return
				}
				br.Discard(n)
			}
			g.splice(c, up)
			return
		}
	}
	e.Reason = r.msg
	writeRefusal(c, r)
}

// spliceChunk is how much one step of a tunnel's bulk copy moves at most:
// the step is one splice(2) between the two sockets on Linux (the bytes
// never enter this process). Each step reserves its bytes of the session's
// cap first (see reserve), and a direction waiting for data holds none, so
// the tunnels of a session together never send more than the cap: a
// download is cut at exactly the cap.
const spliceChunk = 4 << 20

// stepTimeout bounds how long a bulk step waits for data before giving
// back the rest of its reservation (and waiting without one).
const stepTimeout = 500 * time.Millisecond

// splice copies both ways until both sides have finished (a half-close
// is passed on), either fails, the cap is reached or neither side has sent
// anything for IdleTimeout.
func (g *Gate) splice(c *countConn, up net.Conn) {
	done := make(chan bool, 2) // true: the source ended cleanly and was half-closed
	idle := func() bool { return time.Since(time.Unix(0, c.last.Load())) >= g.policy.IdleTimeout }
	cp := func(dst, src net.Conn, counter *atomic.Int64) {
		rf, ok := dst.(io.ReaderFrom)
		if !ok {
			rf = readerFromFunc(func(r io.Reader) (int64, error) { return io.Copy(dst, r) })
		}
		ended := func() {
			hc, ok := dst.(interface{ CloseWrite() error })
			done <- ok && hc.CloseWrite() == nil
		}
		buf := make([]byte, 64<<10)
		for {
			// Wait for data holding none of the cap; send what fits.
			src.SetReadDeadline(time.Now().Add(g.policy.IdleTimeout))
			n, err := src.Read(buf)
			if n > 0 {
				k := g.take(int64(n))
				if k > 0 {
					w, werr := dst.Write(buf[:k])
					counter.Add(int64(w))
					if werr != nil {
						g.refund(k - int64(w)) // not sent: the total stays the entries' sum
						done <- false
						return
					}
					c.last.Store(time.Now().UnixNano())
				}
				if k < int64(n) {
					c.capError.Store(true)
					done <- false
					return
				}
			}
			switch {
			case errors.Is(err, io.EOF):
				ended()
				return
			case err != nil && isTimeout(err) && !idle():
				continue // the other direction is busy
			case err != nil:
				done <- false
				return
			case n < len(buf):
				continue
			}
			// A full buffer: more is coming. Splice while it does.
			for {
				grant := g.reserve(spliceChunk)
				if grant == 0 {
					break // the rest of the cap is spoken for: read what fits
				}
				src.SetReadDeadline(time.Now().Add(min(stepTimeout, g.policy.IdleTimeout)))
				m, err := rf.ReadFrom(&io.LimitedReader{R: src, N: grant})
				g.settle(grant, m)
				if m > 0 {
					counter.Add(m)
					c.last.Store(time.Now().UnixNano())
				}
				if err != nil && isTimeout(err) {
					break // a pause: wait without a reservation
				}
				if err != nil {
					done <- false
					return
				}
				if m < grant { // the source ended
					ended()
					return
				}
			}
		}
	}
	go cp(up, c.Conn, &c.out)
	go cp(c.Conn, up, &c.in)
	ended := 1
	if <-done {
		ended++
		if <-done {
			return
		}
	}
	c.Conn.Close()
	up.Close()
	if ended < 2 {
		<-done
	}
}

type readerFromFunc func(io.Reader) (int64, error)

func (f readerFromFunc) ReadFrom(r io.Reader) (int64, error) { return f(r) }
