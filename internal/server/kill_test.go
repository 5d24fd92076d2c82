package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// stuckStream starts a streaming execution of a print flood on session id
// from a client that never reads, so the server's writes block.
func stuckStream(t *testing.T, ts *testServer, id string) {
	t.Helper()
	addr := ts.Listener.Addr().String()
	testutil.StuckClient(t, addr, testutil.FloodRequest(addr, "/v1/sessions/"+id+"/execute", testutil.FloodCode, "Accept: application/x-ndjson"))
}

func createSession(t *testing.T, ts *testServer) string {
	t.Helper()
	var out struct{ ID string }
	if resp := ts.do(t, "POST", "/v1/sessions", `{}`, &out); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	return out.ID
}

// stuckCloseTimeout bounds one session's close in these tests: a close
// held by the stuck client would last that long, one that is not ends in
// well under half of it, however loaded the machine.
const stuckCloseTimeout = time.Minute

// Deleting a session never waits on a client that stopped reading its
// stream (issue 24): the blocked write is failed and DELETE answers.
func TestDeleteNotHeldByStuckStream(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{CloseTimeout: stuckCloseTimeout}, Options{})
	id := createSession(t, ts)
	stuckStream(t, ts, id)
	start := time.Now()
	resp := ts.do(t, "DELETE", "/v1/sessions/"+id, "", nil)
	took := time.Since(start)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	t.Logf("DELETE with a stuck stream: %v", took.Round(time.Millisecond))
	if took > stuckCloseTimeout/2 {
		t.Errorf("DELETE took %v: it waited for the stuck stream", took)
	}
	if got := ts.mgr.Stats().Sessions; got != 0 {
		t.Errorf("%d sessions left", got)
	}
}

// The reaper closes an expired session on time while another expired
// session has a stuck stream.
func TestReaperNotHeldByStuckStream(t *testing.T) {
	const life = 2 * time.Second
	ts := newTestServer(t, session.ManagerOptions{MaxLifetime: life, ReapInterval: 50 * time.Millisecond, CloseTimeout: stuckCloseTimeout}, Options{})
	stuck := createSession(t, ts)
	stuckStream(t, ts, stuck)
	other := createSession(t, ts)
	born := time.Now()
	deadline := born.Add(life + stuckCloseTimeout/2)
	for time.Now().Before(deadline) {
		if ts.do(t, "GET", "/v1/sessions/"+other, "", nil).StatusCode == http.StatusNotFound {
			t.Logf("expired session gone %v after its creation (lifetime %v)", time.Since(born).Round(time.Millisecond), life)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	var list struct{ Sessions []struct{ ID string } }
	ts.do(t, "GET", "/v1/sessions", "", &list)
	t.Fatalf("session %s still there %v after its creation (lifetime %v); sessions: %v", other, time.Since(born), life, list.Sessions)
}
