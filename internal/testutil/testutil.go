// Package testutil holds test helpers that import nothing of sandloop's,
// so that the tests of any package, the jail's own included, may use them.
// (Helpers that need the jail are in jail/jailtest.)
package testutil

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// WaitFor calls try until it returns nil, and fails tb with try's last
// error if that has not happened within d. Between calls it sleeps a
// little longer each time (5 ms, doubling up to 50 ms). It must be called
// from the goroutine running the test, as tb.Fatal must.
func WaitFor(tb testing.TB, d time.Duration, try func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	pause := 5 * time.Millisecond
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("still waiting after %v: %v", d, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// StuckClient sends request (a whole raw HTTP/1.1 request) to addr from a
// client that never reads the answer, with a small receive buffer, and
// returns once the server has had time to fill the buffers on the way:
// from then on the server's writes to it block. The connection is closed
// at the end of the test.
func StuckClient(tb testing.TB, addr, request string) {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	conn.(*net.TCPConn).SetReadBuffer(4096)
	tb.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, request); err != nil {
		tb.Fatal(err)
	}
	time.Sleep(time.Second)
}

// FloodRequest is a raw POST of body (JSON) to path with the headers given
// as "Name: value" lines: for StuckClient.
func FloodRequest(host, path, body string, headers ...string) string {
	h := ""
	for _, l := range headers {
		h += l + "\r\n"
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, host, h, len(body), body)
}

// FloodCode is a cell that prints without end, for a client that stops reading.
const FloodCode = `{"code":"while True: print('x' * 65536, flush=True)"}`
