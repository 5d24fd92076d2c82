package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// interp runs code in sandbox c's default context and returns the status
// and the lines /execute streamed.
func (ts *testServer) interp(t *testing.T, c created, code string) (int, []map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"code": code})
	resp, body := ts.call(t, "POST", "/execute", strings.NewReader(string(b)), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
		"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	if resp.StatusCode != 200 {
		return resp.StatusCode, nil
	}
	return 200, ndjson(t, body)
}

func (ts *testServer) info(t *testing.T, c created) infoJSON {
	t.Helper()
	resp, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID, "", keyA)
	var info infoJSON
	if err := json.Unmarshal(b, &info); resp.StatusCode != 200 || err != nil {
		t.Fatalf("info: %d %s", resp.StatusCode, b)
	}
	return info
}

func (ts *testServer) listed(t *testing.T, query string) []string {
	t.Helper()
	_, b := ts.control(t, "GET", "/v2/sandboxes"+query, "", keyA)
	var list []infoJSON
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("list: %s", b)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.SandboxID+":"+s.State)
	}
	return ids
}

// TestPauseConnect: E2B's pause and connect wire (contract sections 1-3):
// 204, then 409 for "already paused"; state paused in getInfo and list
// (which shows paused ones unless asked otherwise); the data plane answers
// 409; connect resumes (201, the same tokens) with the variables kept,
// and answers 200 to a running one; a paused sandbox is killed cleanly.
func TestPauseConnect(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	if st, _ := ts.interp(t, c, "x = 7"); st != 200 {
		t.Fatalf("execute: %d", st)
	}
	if resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", `{}`, keyA); resp.StatusCode != 204 {
		t.Fatalf("pause: %d %s", resp.StatusCode, b)
	}
	sb := ts.h.lookup(c.SandboxID)
	u1, _ := sb.ms.Resources()
	if info := ts.info(t, c); info.State != "paused" || info.Lifecycle.OnTimeout != "kill" {
		t.Errorf("info of a paused sandbox: %+v", info)
	}
	resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", ``, keyA)
	if resp.StatusCode != 409 || !strings.Contains(string(b), `"code":409`) {
		t.Errorf("pause again: %d %s, want 409 (the SDK's false)", resp.StatusCode, b)
	}
	for _, c2 := range []struct {
		path, key string
	}{{"/sandboxes/nope/pause", keyA}, {"/sandboxes/" + c.SandboxID + "/pause", keyB}, {"/v2/sandboxes/" + c.SandboxID + "/connect", keyB}} {
		if resp, b := ts.control(t, "POST", c2.path, `{}`, c2.key); resp.StatusCode != 404 || !strings.Contains(string(b), `"code":404`) {
			t.Errorf("%s with another key or id: %d %s, want 404", c2.path, resp.StatusCode, b)
		}
	}
	all, running, paused := ts.listed(t, ""), ts.listed(t, "?state=running"), ts.listed(t, "?state=running,paused")
	if want := c.SandboxID + ":paused"; len(all) != 1 || all[0] != want || len(running) != 0 || len(paused) != 1 {
		t.Errorf("lists: all %v, running %v, running+paused %v", all, running, paused)
	}
	if st, _ := ts.interp(t, c, "x"); st != 409 {
		t.Errorf("execute in a paused sandbox: %d, want 409", st)
	}
	if resp, _ := ts.envd(t, c, "GET", "/files?path=x", nil); resp.StatusCode != 409 {
		t.Errorf("files of a paused sandbox: %d, want 409", resp.StatusCode)
	}
	if u2, _ := sb.ms.Resources(); u2.CPU != u1.CPU {
		t.Errorf("the paused sandbox used %v of CPU", u2.CPU-u1.CPU)
	}
	resp, b = ts.control(t, "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", `{"timeout":60}`, keyA)
	var cn created
	if json.Unmarshal(b, &cn); resp.StatusCode != 201 || cn.EnvdAccessToken != c.EnvdAccessToken || cn.TrafficAccessToken != c.TrafficAccessToken || cn.EnvdVersion == "" {
		t.Errorf("connect to a paused sandbox: %d %s, want 201 with the same tokens", resp.StatusCode, b)
	}
	if end := ts.info(t, c).EndAt; end.Before(time.Now().Add(50*time.Second)) || ts.info(t, c).State != "running" {
		t.Errorf("resumed: %+v, want running until now + 60 s", ts.info(t, c))
	}
	if st, lines := ts.interp(t, c, "x"); st != 200 || lines[0]["text"] != "7" {
		t.Errorf("after connect: %d %v, want x = 7", st, lines)
	}
	if resp, _ := ts.control(t, "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", `{}`, keyA); resp.StatusCode != 200 {
		t.Errorf("connect to a running sandbox: %d, want 200", resp.StatusCode)
	}
	// memory: false: the files stay, the kernel starts afresh.
	ts.interp(t, c, "open('kept.txt', 'w').write('k')")
	if resp, _ := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", `{"memory":false}`, keyA); resp.StatusCode != 204 {
		t.Fatalf("pause without memory: %d", resp.StatusCode)
	}
	ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/connect", `{}`, keyA)
	if st, lines := ts.interp(t, c, "'x' in globals(), open('kept.txt').read()"); st != 200 || lines[0]["text"] != "(False, 'k')" {
		t.Errorf("resumed after a pause without memory: %d %v, want no x and the file", st, lines)
	}
	// connect's memory: false (onResume: 'reboot') does the same.
	ts.interp(t, c, "w = 1")
	ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", `{}`, keyA)
	if resp, _ := ts.control(t, "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", `{"memory":false}`, keyA); resp.StatusCode != 201 {
		t.Errorf("connect with memory false: %d", resp.StatusCode)
	}
	if st, lines := ts.interp(t, c, "'w' in globals()"); st != 200 || lines[0]["text"] != "False" {
		t.Errorf("resumed by a reboot: %d %v, want a fresh kernel", st, lines)
	}
	// Killed while paused: gone, session and all.
	ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", `{}`, keyA)
	if resp, _ := ts.control(t, "DELETE", "/sandboxes/"+c.SandboxID, "", keyA); resp.StatusCode != 204 {
		t.Errorf("kill a paused sandbox: %d", resp.StatusCode)
	}
	if _, err := ts.mgr.Get("owner-a", c.SandboxID); err == nil {
		t.Errorf("the killed paused sandbox's session is still held")
	}
	if resp, _ := ts.control(t, "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", `{}`, keyA); resp.StatusCode != 404 {
		t.Errorf("connect to a killed sandbox: %d, want 404", resp.StatusCode)
	}
}

// TestOnTimeoutPause: lifecycle onTimeout 'pause' (autoPause) pauses a
// sandbox at the end of its time to live instead of killing it, and its
// time to live stops; with autoResume a request resumes it, state and
// all; without, the request gets 409.
func TestOnTimeoutPause(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{ReapInterval: 50 * time.Millisecond})
	if resp, b := ts.control(t, "POST", "/v2/sandboxes", `{"autoResume":{"enabled":true}}`, keyA); resp.StatusCode != 400 {
		t.Errorf("autoResume without autoPause: %d %s, want 400", resp.StatusCode, b)
	}
	auto := ts.create(t, keyA, `{"timeout":60,"autoPause":true,"autoResume":{"enabled":true}}`)
	manual := ts.create(t, keyA, `{"timeout":60,"autoPause":true}`)
	for _, c := range []created{auto, manual} {
		if st, _ := ts.interp(t, c, "y = 3"); st != 200 {
			t.Fatalf("execute: %d", st)
		}
		// A second of life from now, once the cell ran (a slow start
		// under load does not eat it).
		if resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":1}`, keyA); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("set timeout: %d %s", resp.StatusCode, b)
		}
	}
	for _, c := range []created{auto, manual} {
		testutil.WaitFor(t, 20*time.Second, func() error {
			if st := ts.info(t, c).State; st != "paused" {
				return errors.New("state " + st + " after the time to live, want paused")
			}
			return nil
		})
	}
	if lc := ts.info(t, auto).Lifecycle; lc.OnTimeout != "pause" || !lc.AutoResume {
		t.Errorf("lifecycle %+v", lc)
	}
	time.Sleep(300 * time.Millisecond) // paused, its time to live does not run
	if ts.h.lookup(manual.SandboxID) == nil {
		t.Fatal("a paused sandbox was killed")
	}
	if st, _ := ts.interp(t, manual, "y"); st != 409 {
		t.Errorf("a request to a paused sandbox without autoResume: %d, want 409", st)
	}
	if st, lines := ts.interp(t, auto, "y"); st != 200 || lines[0]["text"] != "3" {
		t.Errorf("a request to a paused sandbox with autoResume: %d %v, want y = 3", st, lines)
	}
	if info := ts.info(t, auto); info.State != "running" || !info.EndAt.After(time.Now()) {
		t.Errorf("auto-resumed: %+v", info)
	}
	if resp, _ := ts.control(t, "DELETE", "/sandboxes/"+manual.SandboxID, "", keyA); resp.StatusCode != http.StatusNoContent {
		t.Errorf("kill: %d", resp.StatusCode)
	}
}
