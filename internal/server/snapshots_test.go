package server

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
)

func testSnapshotStore(t *testing.T, o *snapshot.Options) (*snapshot.Store, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := snapshot.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	return st, dir
}

// Snapshots over HTTP on real sessions and a real store: take, list, get,
// start a session from one (the header and restored say what came back),
// another token's 404, hibernate and the wake by a request, corrupted
// refused, quota, delete; every answer checked against openapi.yaml.
func TestSnapshotsOverHTTP(t *testing.T) {
	st, dir := testSnapshotStore(t, &snapshot.Options{Quota: 64 << 20})
	ts := newTestServer(t, session.ManagerOptions{Snapshots: st}, Options{Tokens: []string{tokenA, tokenB}})
	sc := newSpecCheck(t, ts.URL, tokenA)
	other := newSpecCheck(t, ts.URL, tokenB)
	var s sessionJSON
	a := sc.do("POST", "/v1/sessions", "")
	a.want(201, "")
	json.Unmarshal(a.body, &s)
	r := ts.exec(t, s.ID, "import os\ndf = {'a': list(range(10))}\ng = (i for i in range(2))\nos.makedirs('d', exist_ok=True)\nopen('d/f.txt','w').write('hello')")
	if r.Status != "ok" {
		t.Fatalf("%+v", r)
	}
	var snap snapshotJSON
	a = sc.do("POST", "/v1/sessions/"+s.ID+"/snapshots", `{"name":"first"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &snap)
	if !strings.HasPrefix(snap.ID, "snap-") || snap.Name != "first" || snap.Session != s.ID || snap.Files != 1 || len(snap.NotRestorable) == 0 || snap.NotRestorable[0].Name != "g" {
		t.Fatalf("snapshot: %s", a.body)
	}
	other.do("POST", "/v1/sessions/"+s.ID+"/snapshots", "").want(404, "not_found")
	other.do("GET", "/v1/snapshots/"+snap.ID, "").want(404, "snapshot_not_found")
	other.do("DELETE", "/v1/snapshots/"+snap.ID, "").want(404, "snapshot_not_found")
	other.do("POST", "/v1/sessions", `{"snapshot":"`+snap.ID+`"}`).want(404, "snapshot_not_found")
	a = other.do("GET", "/v1/snapshots", "")
	a.want(200, "")
	if strings.Contains(string(a.body), snap.ID) {
		t.Errorf("another token lists the snapshot: %s", a.body)
	}
	a = sc.do("GET", "/v1/snapshots/"+snap.ID, "")
	a.want(200, "")
	if !strings.Contains(string(a.body), `"path":"d/f.txt"`) {
		t.Errorf("GET snapshot has no file list: %s", a.body)
	}
	a = sc.do("GET", "/v1/sessions/"+s.ID+"/snapshots", "")
	a.want(200, "")
	if !strings.Contains(string(a.body), snap.ID) {
		t.Errorf("the session's snapshots: %s", a.body)
	}

	// A new session from it.
	var c sessionJSON
	a = sc.do("POST", "/v1/sessions", `{"snapshot":"`+snap.ID+`"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &c)
	hdr := a.Header.Get(HeaderRestored)
	if c.Restored == nil || c.Restored.Snapshot != snap.ID || !strings.Contains(hdr, "files exact (1 files)") || !strings.Contains(hdr, "variables restored: ") || !strings.Contains(hdr, "not restorable: g") {
		t.Fatalf("created from a snapshot: %s, %s: %q", a.body, HeaderRestored, hdr)
	}
	if r := ts.exec(t, c.ID, "df['a'][-1], open('d/f.txt').read()"); r.Status != "ok" || r.MainResult()["text/plain"] != "(9, 'hello')" {
		t.Errorf("restored session: %+v", r)
	}

	// Hibernate; a GET says so without waking it; an execution wakes it,
	// its stream's first event saying what came back.
	a = sc.do("POST", "/v1/sessions/"+c.ID+"/hibernate", "")
	a.want(200, "")
	json.Unmarshal(a.body, &c)
	if c.State != "hibernated" {
		t.Fatalf("hibernate: %s", a.body)
	}
	sc.do("GET", "/v1/sessions/"+c.ID, "").want(200, "")
	if got := ts.mgr.Stats().Hibernated; got != 1 {
		t.Errorf("GET woke the session (%d hibernated)", got)
	}
	a = sc.do("POST", "/v1/sessions/"+c.ID+"/execute", `{"code":"df['a'][0] + 100"}`, "Accept", "application/x-ndjson")
	a.want(200, "")
	events := readStream(t, strings.NewReader(string(a.body)), false)
	if len(events) == 0 || events[0]["type"] != "restored" || !strings.Contains(events[0]["text"].(string), "from hibernation") || !strings.Contains(a.Header.Get(HeaderRestored), "from hibernation") {
		t.Errorf("the wake's stream: %s (header %q)", a.body, a.Header.Get(HeaderRestored))
	}
	if !strings.Contains(string(a.body), `"100"`) {
		t.Errorf("after the wake: %s", a.body)
	}
	// A files request wakes it too.
	sc.do("POST", "/v1/sessions/"+c.ID+"/hibernate", "").want(200, "")
	req, _ := http.NewRequest("GET", ts.URL+"/v1/sessions/"+c.ID+"/files/d/f.txt", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello" || resp.Header.Get(HeaderRestored) == "" {
		t.Errorf("files of a hibernated session: %d %q (header %q)", resp.StatusCode, body, resp.Header.Get(HeaderRestored))
	}

	// Corrupted: refused, no session made.
	m, err := st.Get(t.Context(), ownerA(t), snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Files[len(m.Files)-1].Chunks[0].Hash
	p := filepath.Join(dir, "blobs", h[:2], h)
	if err := os.WriteFile(p, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := len(ts.mgr.List(ownerA(t)))
	sc.do("POST", "/v1/sessions", `{"snapshot":"`+snap.ID+`"}`).want(422, "snapshot_corrupted")
	if n := len(ts.mgr.List(ownerA(t))); n != before {
		t.Errorf("a corrupted snapshot left a session (%d, %d before)", n, before)
	}

	// Quota: 64 MiB; 80 MB of random data does not fit.
	if r := ts.exec(t, s.ID, "open('big','wb').write(os.urandom(80 << 20))"); r.Status != "ok" {
		t.Fatalf("%+v", r)
	}
	a = sc.do("POST", "/v1/sessions/"+s.ID+"/snapshots", "")
	a.want(413, "snapshot_quota")

	sc.do("DELETE", "/v1/snapshots/"+snap.ID, "").want(204, "")
	sc.do("GET", "/v1/snapshots/"+snap.ID, "").want(404, "snapshot_not_found")
}

// ownerA is tokenA's owner as the server names it.
func ownerA(t *testing.T) string { return OwnerOf(tokenA) }

// Without a store, snapshots answer 501 saying why.
func TestSnapshotsWithoutStore(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	sc := newSpecCheck(t, ts.URL, "")
	sc.do("GET", "/v1/snapshots", "").want(501, "no_snapshots")
}
