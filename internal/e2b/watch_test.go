package e2b

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// runCell runs code in the sandbox's kernel and fails the test on an error.
func (ts *testServer) runCell(t *testing.T, c created, code string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code})
	resp, b := ts.call(t, "POST", "/execute", strings.NewReader(string(body)), "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", portInterpreter,
		"E2B-Traffic-Access-Token", c.TrafficAccessToken, "Content-Type", "application/json")
	if resp.StatusCode != 200 || strings.Contains(string(b), `"type":"error"`) {
		t.Fatalf("execute %q: %d %s", code, resp.StatusCode, b)
	}
}

// watcher is a sync watcher (CreateWatcher) of a test, with the events
// drained so far.
type watcher struct {
	ts  *testServer
	c   created
	id  string
	got []string // "TYPE name", TYPE without EVENT_TYPE_
}

func (ts *testServer) watcher(t *testing.T, c created, path string, recursive bool) *watcher {
	t.Helper()
	st, m := ts.rpc(t, c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": path, "recursive": recursive})
	id, _ := m["watcherId"].(string)
	if st != 200 || id == "" {
		t.Fatalf("CreateWatcher %s: %d %v", path, st, m)
	}
	return &watcher{ts: ts, c: c, id: id}
}

// drain takes the queued events.
func (w *watcher) drain(t *testing.T) {
	t.Helper()
	st, m := w.ts.rpc(t, w.c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": w.id})
	if st != 200 {
		t.Fatalf("GetWatcherEvents: %d %v", st, m)
	}
	evs, _ := m["events"].([]any)
	for _, e := range evs {
		e := e.(map[string]any)
		w.got = append(w.got, strings.TrimPrefix(e["type"].(string), "EVENT_TYPE_")+" "+e["name"].(string))
	}
}

// waitFor drains until every one of want has come (in this order among
// themselves).
func (w *watcher) waitFor(t *testing.T, want ...string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		w.drain(t)
		i := 0
		for _, g := range w.got {
			if i < len(want) && g == want[i] {
				i++
			}
		}
		if i < len(want) {
			return fmt.Errorf("events %q, want %q in order", w.got, want)
		}
		return nil
	})
}

// The sync watcher RPCs: what the kernel does in the workspace is
// reported with E2B's event types and names relative to the watched
// directory; recursive follows new directories; bounds and errors.
func TestWatcherRPCs(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	ws := ts.h.lookup(c.SandboxID).ms.Workspace()
	all := ts.watcher(t, c, "/workspace", true)
	flat := ts.watcher(t, c, ".", false)

	ts.runCell(t, c, "import os\nos.makedirs('d/e')")
	all.waitFor(t, "CREATE d", "CREATE d/e")
	ts.runCell(t, c, "open('d/e/f.txt', 'w').write('x')\nos.chmod('d/e/f.txt', 0o600)\nos.rename('d/e/f.txt', 'd/g.txt')\nos.remove('d/g.txt')")
	all.waitFor(t, "CREATE d/e/f.txt", "WRITE d/e/f.txt", "CHMOD d/e/f.txt", "RENAME d/e/f.txt", "CREATE d/g.txt", "REMOVE d/g.txt")
	ts.runCell(t, c, "os.rename('d', 'moved')\nopen('moved/e/h.txt', 'w').write('y')")
	all.waitFor(t, "RENAME d", "CREATE moved", "CREATE moved/e/h.txt", "WRITE moved/e/h.txt")
	// Not recursive: only the directory's own entries (its own inotify
	// instance and goroutine: waited for, not read at once).
	flat.waitFor(t, "CREATE d", "RENAME d", "CREATE moved")
	if want := []string{"CREATE d", "RENAME d", "CREATE moved"}; !slices.Equal(flat.got, want) {
		t.Errorf("non-recursive watcher: %q, want %q", flat.got, want)
	}

	// A symlink out of the workspace is never followed: what happens
	// outside is not reported, and it cannot be watched itself.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	all.waitFor(t, "CREATE out")
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644)
	os.WriteFile(filepath.Join(ws, "marker"), []byte("m"), 0o644)
	all.waitFor(t, "CREATE marker")
	for _, g := range all.got {
		if strings.Contains(g, "secret") {
			t.Errorf("an event from outside the workspace: %q", all.got)
		}
	}
	os.WriteFile(filepath.Join(ws, "file"), nil, 0o644)
	for _, tc := range []struct {
		method string
		msg    map[string]any
		code   string
	}{
		{"CreateWatcher", map[string]any{"path": "out"}, "invalid_argument"},
		{"CreateWatcher", map[string]any{"path": "file"}, "invalid_argument"},
		{"CreateWatcher", map[string]any{"path": "nope"}, "not_found"},
		{"CreateWatcher", map[string]any{"path": "/etc"}, "permission_denied"},
		{"GetWatcherEvents", map[string]any{"watcherId": "nope"}, "not_found"},
		{"RemoveWatcher", map[string]any{"watcherId": "nope"}, "not_found"},
	} {
		if st, m := ts.rpc(t, c, "filesystem.Filesystem/"+tc.method, tc.msg); m["code"] != tc.code {
			t.Errorf("%s %v: %d %v, want %s", tc.method, tc.msg, st, m, tc.code)
		}
	}
	if st, m := ts.rpc(t, c, "filesystem.Filesystem/RemoveWatcher", map[string]any{"watcherId": flat.id}); st != 200 {
		t.Errorf("RemoveWatcher: %d %v", st, m)
	}
	if _, m := ts.rpc(t, c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": flat.id}); m["code"] != "not_found" {
		t.Errorf("a removed watcher: %v", m)
	}

	// Bounded: a queue left undrained stops its watcher, saying so; and a
	// sandbox has at most maxWatchers.
	ts.runCell(t, c, fmt.Sprintf("for i in range(%d):\n    open(f'moved/n{i}', 'w').close()", maxQueuedEvents+10))
	// Wait for the watcher to have read them all without draining its
	// queue (a GetWatcherEvents between two of its reads would): it stops.
	sb := ts.h.lookup(c.SandboxID)
	sb.mu.Lock()
	wt := sb.watches[all.id]
	sb.mu.Unlock()
	testutil.WaitFor(t, 60*time.Second, func() error {
		wt.mu.Lock()
		defer wt.mu.Unlock()
		if wt.err == nil {
			return fmt.Errorf("still running: %d events queued", len(wt.queued))
		}
		return nil
	})
	testutil.WaitFor(t, 10*time.Second, func() error {
		st, m := ts.rpc(t, c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": all.id})
		if st == 200 {
			return fmt.Errorf("still running: %d events", len(m["events"].([]any)))
		}
		if m["code"] != "resource_exhausted" || !strings.Contains(m["message"].(string), "events came between two GetWatcherEvents") {
			t.Fatalf("an overflowing watcher: %d %v", st, m)
		}
		return nil
	})
	var ids []string
	for range maxWatchers {
		ids = append(ids, ts.watcher(t, c, ".", false).id)
	}
	if st, m := ts.rpc(t, c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "."}); m["code"] != "resource_exhausted" {
		t.Errorf("watcher %d: %d %v", maxWatchers+1, st, m)
	}
	// Killing the sandbox stops them all.
	sb = ts.h.lookup(c.SandboxID)
	ts.control(t, "DELETE", "/sandboxes/"+c.SandboxID, "", keyA)
	testutil.WaitFor(t, 10*time.Second, func() error {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if len(sb.watches) != 0 {
			return fmt.Errorf("%d watchers left after the kill", len(sb.watches))
		}
		return nil
	})
}

// The WatchDir stream: start first, then the events, keepalives while
// idle, and deadline_exceeded at the Connect-Timeout-Ms deadline.
func TestWatchDirStream(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	sb := ts.h.lookup(c.SandboxID)
	var msgs []map[string]any
	var end map[string]any
	var wg sync.WaitGroup
	wg.Go(func() {
		msgs, end = ts.stream(t, c, "filesystem.Filesystem/WatchDir", map[string]any{"path": "/workspace", "recursive": true},
			"Connect-Timeout-Ms", "4000", "Keepalive-Ping-Interval", "1")
	})
	testutil.WaitFor(t, 10*time.Second, func() error {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		for _, wt := range sb.watches {
			if wt != nil { // set up, not only reserved
				return nil
			}
		}
		return fmt.Errorf("no watcher yet")
	})
	ts.runCell(t, c, "import os\nos.mkdir('s')\nopen('s/plot.png', 'wb').write(b'x')")
	wg.Wait()
	if len(msgs) == 0 || msgs[0]["start"] == nil {
		t.Fatalf("the first message is not start: %v", msgs)
	}
	var got []string
	keepalives := 0
	for _, m := range msgs[1:] {
		switch {
		case m["filesystem"] != nil:
			e := m["filesystem"].(map[string]any)
			got = append(got, e["type"].(string)+" "+e["name"].(string))
		case m["keepalive"] != nil:
			keepalives++
		default:
			t.Errorf("message %v", m)
		}
	}
	if want := []string{"EVENT_TYPE_CREATE s", "EVENT_TYPE_CREATE s/plot.png", "EVENT_TYPE_WRITE s/plot.png"}; !slices.Equal(got, want) {
		// (The file may be made before the new directory's watch: then
		// its creation is found by the scan, and its write not seen.)
		if !slices.Equal(got, want[:2]) {
			t.Errorf("events %q, want %q", got, want)
		}
	}
	if keepalives < 2 {
		t.Errorf("%d keepalives in 4 s at 1 s", keepalives)
	}
	if e, _ := end["error"].(map[string]any); e["code"] != "deadline_exceeded" {
		t.Errorf("end %v, want deadline_exceeded", end)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if len(sb.watches) != 0 {
			return fmt.Errorf("%d watchers left after the stream ended", len(sb.watches))
		}
		return nil
	})
}
