package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
)

// Checkpoints, restore, undo, fork, pause and resume over HTTP, on real
// sessions, every answer checked against openapi.yaml.
func TestLifecycleOverHTTP(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{tokenA, tokenB}})
	sc := newSpecCheck(t, ts.URL, tokenA)
	other := newSpecCheck(t, ts.URL, tokenB)
	var s sessionJSON
	a := sc.do("POST", "/v1/sessions", `{"checkpoints":"auto"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &s)
	if s.Checkpoints != "auto" || s.State != "running" || s.Restored != nil {
		t.Fatalf("created: %s", a.body)
	}
	base := "/v1/sessions/" + s.ID
	run := func(id, code string) string {
		t.Helper()
		r := ts.exec(t, id, code)
		if r.Status != "ok" {
			t.Fatalf("%s: %+v", code, r)
		}
		return r.MainResult()["text/plain"]
	}
	run(s.ID, "x = 1\nopen('a.txt', 'w').write('one')")
	var cp session.Checkpoint
	a = sc.do("POST", base+"/checkpoints", `{"name":"one"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &cp)
	if cp.ID == "" || cp.Name != "one" || cp.Auto || cp.Files != 1 || cp.ExecutionCount != 1 {
		t.Fatalf("checkpoint: %s", a.body)
	}
	run(s.ID, "import os\nx = 2\nopen('b.txt', 'w').write('two')\nos.remove('a.txt')")
	var list checkpointList
	a = sc.do("GET", base+"/checkpoints", "")
	a.want(200, "")
	json.Unmarshal(a.body, &list)
	var named, auto int
	for _, c := range list.Checkpoints {
		if c.Auto {
			auto++
		} else if c.ID == cp.ID {
			named++
		}
	}
	if named != 1 || auto < 1 || list.HeldBytes <= 0 {
		t.Errorf("checkpoints: %s", a.body)
	}

	// Restore: variables and files as they were; the session says so.
	a = sc.do("POST", base+"/checkpoints/"+cp.ID+"/restore", "")
	a.want(200, "")
	json.Unmarshal(a.body, &s)
	if s.Restored == nil || !strings.Contains(s.Restored.From, cp.ID) || s.Restored.ExecutionCount != 1 || s.DiskUsedBytes == nil {
		t.Fatalf("restore: %s", a.body)
	}
	if got := run(s.ID, "import os\n(x, sorted(os.listdir('.')))"); got != "(1, ['a.txt'])" {
		t.Errorf("after the restore: %s", got)
	}
	// Undo reverts the last cell only.
	run(s.ID, "x = 99")
	sc.do("POST", base+"/undo", "").want(200, "")
	if got := run(s.ID, "x"); got != "1" {
		t.Errorf("after undo, x = %s", got)
	}
	a = sc.do("GET", base, "")
	json.Unmarshal(a.body, &s)
	if s.Restored == nil || s.Restored.From != "undo" {
		t.Errorf("GET after undo: %s", a.body)
	}

	// Fork: two children with the parent's state; a child's writes stay its own.
	var fork forkResponse
	a = sc.do("POST", base+"/fork", `{"count":2}`)
	a.want(201, "")
	json.Unmarshal(a.body, &fork)
	if len(fork.Sessions) != 2 || fork.Restored == nil || fork.Sessions[0].ID == s.ID || fork.Sessions[0].Restored == nil || fork.Sessions[0].DiskUsedBytes == nil {
		t.Fatalf("fork: %s", a.body)
	}
	kid := fork.Sessions[0].ID
	if got := run(kid, "x"); got != "1" {
		t.Errorf("the fork's x = %s", got)
	}
	run(kid, "x = 'kid'\nopen('a.txt', 'w').write('kid')")
	if got := run(s.ID, "(x, open('a.txt').read())"); got != "(1, 'one')" {
		t.Errorf("the parent after its fork wrote: %s", got)
	}
	if got := run(fork.Sessions[1].ID, "(x, open('a.txt').read())"); got != "(1, 'one')" {
		t.Errorf("the sibling after the fork wrote: %s", got)
	}
	a = sc.do("GET", "/v1/sessions", "")
	if n := strings.Count(string(a.body), `"state":"running"`); n != 3 {
		t.Errorf("list: %d running, want 3: %s", n, a.body)
	}

	// Pause and resume; an execution resumes a paused session.
	a = sc.do("POST", base+"/pause", "")
	a.want(200, "")
	if !strings.Contains(string(a.body), `"state":"paused"`) {
		t.Errorf("pause: %s", a.body)
	}
	if a := sc.do("GET", base, ""); !strings.Contains(string(a.body), `"state":"paused"`) {
		t.Errorf("GET of a paused session: %s", a.body)
	}
	sc.do("POST", base+"/resume", "").want(200, "")
	sc.do("POST", base+"/pause", "").want(200, "")
	if got := run(s.ID, "x + 1"); got != "2" {
		t.Errorf("execute on a paused session: %s", got)
	}
	if a := sc.do("GET", base, ""); !strings.Contains(string(a.body), `"state":"running"`) {
		t.Errorf("after an execution: %s", a.body)
	}
	// So does a restore.
	sc.do("POST", base+"/pause", "").want(200, "")
	a = sc.do("POST", base+"/checkpoints/"+cp.ID+"/restore", "")
	if a.want(200, ""); !strings.Contains(string(a.body), `"state":"running"`) {
		t.Errorf("restore of a paused session: %s", a.body)
	}
	if got := run(s.ID, "x"); got != "1" {
		t.Errorf("after restoring %s again, x = %s", cp.ID, got)
	}

	// Another token's session is not found, whatever is asked of it.
	for _, r := range [][2]string{{"POST", "/pause"}, {"POST", "/resume"}, {"POST", "/undo"}, {"GET", "/checkpoints"},
		{"POST", "/checkpoints"}, {"POST", "/checkpoints/" + cp.ID + "/restore"}, {"DELETE", "/checkpoints/" + cp.ID}, {"POST", "/fork"}} {
		other.do(r[0], base+r[1], "").want(404, "not_found")
	}

	// Bad input and bounds: what to fix.
	sc.do("POST", base+"/checkpoints/cp999/restore", "").want(404, "not_found")
	sc.do("DELETE", base+"/checkpoints/cp999", "").want(404, "not_found")
	sc.do("POST", base+"/fork", `{"count":17}`).want(400, "limit_too_high")
	sc.do("POST", base+"/fork", `{"count":-1}`).want(400, "bad_request")
	sc.do("POST", base+"/fork", `{"count":1,"from":"cp1"}`).want(400, "bad_request")
	sc.do("POST", base+"/fork", `{"checkpoint":"cp999"}`).want(404, "not_found")
	sc.do("POST", base+"/checkpoints", `{"name":"`+strings.Repeat("n", 201)+`"}`).want(400, "bad_request")
	sc.do("POST", "/v1/sessions", `{"checkpoints":"always"}`).want(400, "bad_request")
	plain := ts.create(t, `{"checkpoints":"off"}`)
	a = sc.do("POST", "/v1/sessions/"+plain+"/undo", "")
	if a.want(404, "not_found"); !strings.Contains(string(a.body), "nothing to undo") {
		t.Errorf("undo without checkpoints: %s", a.body)
	}

	// Fork from a checkpoint, then drop it.
	a = sc.do("POST", base+"/fork", `{"checkpoint":"`+cp.ID+`"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &fork)
	if len(fork.Sessions) != 1 || run(fork.Sessions[0].ID, "x") != "1" {
		t.Errorf("fork from %s: %s", cp.ID, a.body)
	}
	sc.do("DELETE", base+"/checkpoints/"+cp.ID, "").want(204, "")
	a = sc.do("GET", base+"/checkpoints", "")
	if strings.Contains(string(a.body), `"id":"`+cp.ID+`"`) {
		t.Errorf("%s still listed after its delete: %s", cp.ID, a.body)
	}
}
