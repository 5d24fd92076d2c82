package e2b

import (
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// Killing a sandbox never waits on a client that stopped reading a cell's
// stream (issue 24): the blocked write fails, the cell ends, the session
// is gone.
func TestKillNotHeldByStuckExecute(t *testing.T) {
	// A close held by the stuck client would give up after CloseTimeout;
	// one that is not ends in well under half of it, however loaded.
	const closeTimeout = time.Minute
	ts := newTestServerWith(t, Options{}, session.ManagerOptions{CloseTimeout: closeTimeout})
	c := ts.create(t, keyA, `{}`)
	addr := ts.Listener.Addr().String()
	testutil.StuckClient(t, addr, testutil.FloodRequest(addr, "/execute", testutil.FloodCode,
		"E2b-Sandbox-Id: "+c.SandboxID, "E2b-Sandbox-Port: "+portInterpreter, "E2B-Traffic-Access-Token: "+c.TrafficAccessToken))
	start := time.Now()
	resp, b := ts.control(t, "DELETE", "/sandboxes/"+c.SandboxID, "", keyA)
	took := time.Since(start)
	if resp.StatusCode != 204 {
		t.Fatalf("kill: %d %s", resp.StatusCode, b)
	}
	t.Logf("kill with a stuck /execute stream: %v", took.Round(time.Millisecond))
	if took > closeTimeout/2 {
		t.Errorf("kill took %v: it waited for the stuck stream", took)
	}
	if n := ts.mgr.Stats().Sessions; n != 0 {
		t.Errorf("%d sessions held after the kill", n)
	}
}
