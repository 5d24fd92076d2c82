package e2b

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// Killing a sandbox never waits on a client that stopped reading a cell's
// stream (issue 24): the blocked write fails, the cell ends, the session
// is gone.
func TestKillNotHeldByStuckExecute(t *testing.T) {
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).SetReadBuffer(4096)
	t.Cleanup(func() { conn.Close() })
	body := `{"code":"while True: print('x' * 65536, flush=True)"}`
	fmt.Fprintf(conn, "POST /execute HTTP/1.1\r\nHost: %s\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: %s\r\nE2B-Traffic-Access-Token: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		ts.Listener.Addr(), c.SandboxID, portInterpreter, c.TrafficAccessToken, len(body), body)
	time.Sleep(time.Second) // the flood fills the socket's buffers; then writes block
	start := time.Now()
	resp, b := ts.control(t, "DELETE", "/sandboxes/"+c.SandboxID, "", keyA)
	took := time.Since(start)
	if resp.StatusCode != 204 {
		t.Fatalf("kill: %d %s", resp.StatusCode, b)
	}
	t.Logf("kill with a stuck /execute stream: %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("kill took %v, want <= 2s", took)
	}
	// (Within 2s means the session's close finished: the manager waits
	// for it up to its CloseTimeout, 5s.)
	if n := ts.mgr.Stats().Sessions; n != 0 {
		t.Errorf("%d sessions held after the kill", n)
	}
}
