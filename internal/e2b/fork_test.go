package e2b

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// text is the main result's text/plain of an /execute stream (or the
// error's name).
func resultText(lines []map[string]any) string {
	for _, l := range lines {
		if l["type"] == "result" {
			if s, ok := l["text"].(string); ok {
				return s
			}
		}
		if l["type"] == "error" {
			return fmt.Sprint(l["name"])
		}
	}
	return ""
}

// TestFork: E2B's fork wire (contract section 6): 201 with one
// {sandbox} per fork, each a sandbox of its own with the source's
// variables and files, reachable with its own tokens; the source keeps
// running; count out of range is 400, a paused source 409, another key's
// or an unknown one 404; an omitted timeout gives the schema's 15 s.
func TestFork(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{"metadata":{"who":"parent"}}`)
	if st, _ := ts.interp(t, c, "x = 41\nopen('f.txt', 'w').write('parent')"); st != 200 {
		t.Fatalf("execute: %d", st)
	}
	resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/fork", `{"count":2,"timeout":60}`, keyA)
	var entries []forkEntry
	if err := json.Unmarshal(b, &entries); resp.StatusCode != 201 || err != nil || len(entries) != 2 {
		t.Fatalf("fork: %d %s", resp.StatusCode, b)
	}
	var kids []created
	for _, e := range entries {
		if e.Sandbox == nil || e.Error != nil || e.Sandbox.SandboxID == c.SandboxID || e.Sandbox.EnvdAccessToken == c.EnvdAccessToken {
			t.Fatalf("entry %+v", e)
		}
		kids = append(kids, *e.Sandbox)
	}
	_, lines := ts.interp(t, kids[0], "x += 1\nopen('f.txt', 'w').write('kid')\nx")
	if got := resultText(lines); got != "42" {
		t.Errorf("the fork's x + 1 = %q (%v)", got, lines)
	}
	_, lines = ts.interp(t, c, "(x, open('f.txt').read())")
	if got := resultText(lines); got != "(41, 'parent')" {
		t.Errorf("the source after its fork wrote: %q", got)
	}
	_, lines = ts.interp(t, kids[1], "(x, open('f.txt').read())")
	if got := resultText(lines); got != "(41, 'parent')" {
		t.Errorf("the sibling: %q", got)
	}
	info := ts.info(t, kids[0])
	if info.Metadata["who"] != "parent" || info.State != "running" || time.Until(info.EndAt) > time.Minute || time.Until(info.EndAt) < 30*time.Second {
		t.Errorf("the fork's info: %+v", info)
	}
	// An omitted timeout: E2B's schema default.
	resp, b = ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/fork", ``, keyA)
	if json.Unmarshal(b, &entries); resp.StatusCode != 201 || len(entries) != 1 || entries[0].Sandbox == nil {
		t.Fatalf("fork without a body: %d %s", resp.StatusCode, b)
	}
	if left := time.Until(ts.info(t, *entries[0].Sandbox).EndAt); left > forkTimeout {
		t.Errorf("a fork without timeout lives %s, want at most %s", left, forkTimeout)
	}

	for _, tc := range []struct {
		path, body, key string
		status          int
	}{
		{"/sandboxes/" + c.SandboxID + "/fork", `{"count":0}`, keyA, 400},
		{"/sandboxes/" + c.SandboxID + "/fork", `{"count":101}`, keyA, 400},
		{"/sandboxes/" + c.SandboxID + "/fork", `{}`, keyB, 404},
		{"/sandboxes/nope/fork", `{}`, keyA, 404},
	} {
		resp, b := ts.control(t, "POST", tc.path, tc.body, tc.key)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), fmt.Sprintf(`"code":%d`, tc.status)) {
			t.Errorf("POST %s %s: %d %s, want %d", tc.path, tc.body, resp.StatusCode, b, tc.status)
		}
	}
	if resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", `{}`, keyA); resp.StatusCode != 204 {
		t.Fatalf("pause: %d %s", resp.StatusCode, b)
	}
	if resp, b := ts.control(t, "POST", "/sandboxes/"+c.SandboxID+"/fork", `{}`, keyA); resp.StatusCode != 409 || !strings.Contains(string(b), "resume") {
		t.Errorf("fork of a paused sandbox: %d %s", resp.StatusCode, b)
	}
}
