package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// Through the gateway too, deleting a session never waits on a client that
// stopped reading its stream (issue 24).
func TestDeleteNotHeldByStuckStream(t *testing.T) {
	f := newFixture(t, 1)
	id, _ := f.create(tok1)
	addr := f.ts.Listener.Addr().String()
	testutil.StuckClient(t, addr, testutil.FloodRequest(addr, "/v1/sessions/"+id+"/execute", testutil.FloodCode,
		"Authorization: Bearer "+tok1, "Accept: application/x-ndjson"))
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
