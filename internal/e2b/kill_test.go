package e2b

import (
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// Killing a sandbox never waits on a client that stopped reading a cell's
// stream (issue 24): the blocked write fails, the cell ends, the session
// is gone.
func TestKillNotHeldByStuckExecute(t *testing.T) {
	ts := newTestServer(t, Options{})
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
	if took > 2*time.Second {
		t.Errorf("kill took %v, want <= 2s", took)
	}
	// (Within 2s means the session's close finished: the manager waits
	// for it up to its CloseTimeout, 5s.)
	if n := ts.mgr.Stats().Sessions; n != 0 {
		t.Errorf("%d sessions held after the kill", n)
	}
}
