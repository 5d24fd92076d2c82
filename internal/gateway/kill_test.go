package gateway

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// Through the gateway too, deleting a session never waits on a client that
// stopped reading its stream (issue 24).
func TestDeleteNotHeldByStuckStream(t *testing.T) {
	f := newFixture(t, 1)
	id, _ := f.create(tok1)
	conn, err := net.Dial("tcp", f.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).SetReadBuffer(4096)
	t.Cleanup(func() { conn.Close() })
	body := `{"code":"while True: print('x' * 65536, flush=True)"}`
	fmt.Fprintf(conn, "POST /v1/sessions/%s/execute HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: application/x-ndjson\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		id, f.ts.Listener.Addr(), tok1, len(body), body)
	time.Sleep(time.Second) // the flood fills the buffers on the way; then writes block
	start := time.Now()
	st, out := f.do(tok1, "DELETE", "/v1/sessions/"+id, "")
	took := time.Since(start)
	if st != http.StatusNoContent {
		t.Fatalf("delete: %d %s", st, out)
	}
	t.Logf("DELETE through the gateway with a stuck stream: %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("DELETE took %v, want <= 2s", took)
	}
	if st, _ := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusNotFound {
		t.Errorf("after DELETE: GET answers %d, want 404", st)
	}
}
