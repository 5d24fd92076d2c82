package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// stuckCloseTimeout is the hosts' bound on one session's close in these
// tests: a close held by the stuck client would last that long, one that
// is not ends in well under half of it however loaded the machine.
const stuckCloseTimeout = time.Minute

// Through the gateway too, deleting a session never waits on a client that
// stopped reading its stream (issue 24).
func TestDeleteNotHeldByStuckStream(t *testing.T) {
	f := newFixture(t, 1, func(sh *swapHost) { sh.closeTimeout = stuckCloseTimeout })
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
	if took > stuckCloseTimeout/2 {
		t.Errorf("DELETE took %v: it waited for the stuck stream", took)
	}
	if st, _ := f.do(tok1, "GET", "/v1/sessions/"+id, ""); st != http.StatusNotFound {
		t.Errorf("after DELETE: GET answers %d, want 404", st)
	}
}
