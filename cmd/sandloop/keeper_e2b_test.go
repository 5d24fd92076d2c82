package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b"
	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestKeepSessionsE2B: E2B sandboxes survive a kill -9 of serve
// --keep-sessions, with E2B's own SDK (testdata/sdk/keep.mjs): after the
// restart, getInfo has their metadata and time to live, the paused one is
// still paused, and connect + runCode work on the same ids with the
// variables, files and envs back, while the old server's command is
// reported ended; connect resumes the paused one. After a SIGTERM restart
// (an upgrade) the sandbox is adopted again.
func TestKeepSessionsE2B(t *testing.T) {
	needKeeper(t)
	e2btest.SDK(t)
	const token = "keep-e2b-token-0123456789"
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	start := func() (*keptServe, e2btest.Env) {
		s := startKept(t, dataDir, "--pool", "0", "--e2b=true", "--token", token)
		return s, e2btest.Env{URL: s.url, Key: e2b.KeyForToken(token)}
	}
	a, env := start()
	out, err := e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "create")
	if err != nil {
		t.Fatalf("keep.mjs create: %v\n%s", err, out)
	}
	var ids []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "ids" {
			ids = f[1:]
		}
	}
	if len(ids) != 2 {
		t.Fatalf("keep.mjs create printed no ids:\n%s", out)
	}
	a.kill9()

	b, env := start()
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "after", ids[0], ids[1])
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs after a kill -9: %v\n%s", err, out)
	}

	// An upgrade: SIGTERM leaves the sandboxes to the next server.
	b.term(t)
	_, env = start()
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "again", ids[0])
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs again after a SIGTERM restart: %v\n%s", err, out)
	}
}

// TestKeepSessionsE2BKeeperKilled: an E2B sandbox whose keeper is killed
// (SIGKILL, by its PID) while serve --keep-sessions runs, with E2B's own
// SDK (keep.mjs kcreate/kafter/kagain): the same serve answers getInfo
// with its metadata and connect + runCode on the same id with its
// variable, files (one from the files API, one from a cell) and envs back
// from its automatic snapshot, its first cell saying on stderr that it
// was restored, from what and as of when; a sandbox paused then is still
// paused, and connect resumes it with its variable. Then serve and the new keeper
// are both killed (-9) and serve restarted: the sandbox, restored asleep
// by the manager, is adopted again by the E2B layer, with what was done
// after the first loss (z = 2, set by a cell alone: a cell is a use, so
// it is in the next automatic snapshot).
func TestKeepSessionsE2BKeeperKilled(t *testing.T) {
	needKeeper(t)
	e2btest.SDK(t)
	const token = "keep-e2b-keeper-token-0123456789"
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	start := func() (*keptServe, e2btest.Env) {
		s := startKept(t, dataDir, "--pool", "0", "--e2b=true", "--token", token, "--snapshot-every", "200ms")
		return s, e2btest.Env{URL: s.url, Key: e2b.KeyForToken(token)}
	}
	// snapshotted waits until sandbox id's latest automatic snapshot is
	// newer than prev and holds every use of it.
	snapshotted := func(id, prev string) string {
		var snap string
		testutil.WaitFor(t, 120*time.Second, func() error {
			r, err := readSessionRecord(dataDir, id)
			if err != nil || r.Snapshot == "" || r.Snapshot == prev || !r.UsedAt.IsZero() {
				return fmt.Errorf("no new automatic snapshot of %s yet: %+v %v", id, r, err)
			}
			snap = r.Snapshot
			return nil
		})
		return snap
	}
	a, env := start()
	out, err := e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "kcreate")
	if err != nil {
		t.Fatalf("keep.mjs kcreate: %v\n%s", err, out)
	}
	var id, paused string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "ids" {
			id, paused = f[1], f[2]
		}
	}
	if id == "" {
		t.Fatalf("keep.mjs kcreate printed no id:\n%s", out)
	}
	first := snapshotted(id, "")

	stopKeeper(t, dataDir) // SIGKILL by PID; serve runs on
	testutil.WaitFor(t, 120*time.Second, func() error {
		req, _ := http.NewRequest("GET", a.url+"/v1/sessions/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var sess struct{ State string }
		json.NewDecoder(resp.Body).Decode(&sess)
		if sess.State != "hibernated" {
			return fmt.Errorf("sandbox %s: state %q, want hibernated (asleep on its snapshot)", id, sess.State)
		}
		return nil
	})
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "kafter", id, paused)
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs kafter the keeper's death: %v\n%s", err, out)
	}

	// A cell alone (z = 2) is a use: it is in the next automatic
	// snapshot. Then serve and keeper die.
	woken := snapshotted(id, first)
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "kset", id)
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs kset: %v\n%s", err, out)
	}
	snapshotted(id, woken)
	a.kill9()
	stopKeeper(t, dataDir)
	if _, err := os.Stat(filepath.Join(dataDir, "e2b", id+".json")); err != nil {
		t.Fatalf("the sandbox's E2B record is gone before the restart: %v", err)
	}
	c, env := start()
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "kagain", id)
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs kagain after serve and keeper were killed: %v\n%s", err, out)
	}
	// Killed: its E2B record and its session's record are gone.
	if _, err := os.Stat(filepath.Join(dataDir, "e2b", id+".json")); !os.IsNotExist(err) {
		t.Errorf("killed sandbox %s: its E2B record is left (%v)", id, err)
	}
	if _, err := readSessionRecord(dataDir, id); !os.IsNotExist(err) {
		t.Errorf("killed sandbox %s: its session record is left (%v)", id, err)
	}
	c.term(t)
}

// TestServeRestartKeepsSessionsE2B: serve without a keeper, its sessions
// durable (--snapshot-every), stopped with SIGTERM, puts each sandbox to
// sleep on a snapshot, and the next serve on the same --data-dir adopts
// it, with E2B's own SDK (keep.mjs screate/safter): getInfo has its
// metadata and time to live, the paused one is still paused, and connect
// + runCode on the same id find every variable that serializes (set after
// the last automatic snapshot too), the files and envs, the first cell
// saying what did not come back.
func TestServeRestartKeepsSessionsE2B(t *testing.T) {
	e2btest.SDK(t)
	const token = "shelve-e2b-token-0123456789"
	dataDir := t.TempDir()
	start := func() (*keptServe, e2btest.Env) {
		s := startServeIn(t, dataDir, nil, "--pool", "0", "--e2b=true", "--token", token, "--snapshot-every", "1h")
		return s, e2btest.Env{URL: s.url, Key: e2b.KeyForToken(token)}
	}
	a, env := start()
	out, err := e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "screate")
	if err != nil {
		t.Fatalf("keep.mjs screate: %v\n%s", err, out)
	}
	var ids []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "ids" {
			ids = f[1:]
		}
	}
	if len(ids) != 2 {
		t.Fatalf("keep.mjs screate printed no ids:\n%s", out)
	}
	a.term(t)
	if !strings.Contains(a.stderr.String(), `"shutdown: sessions asleep on their snapshots, for the next server" sessions=2`) {
		t.Errorf("serve's shutdown did not put both sessions to sleep:\n%s", tail(a.stderr.String(), 20))
	}
	_, env = start()
	out, err = e2btest.RunScript(t, env, 3*time.Minute, "keep.mjs", "safter", ids[0], ids[1])
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("keep.mjs safter a SIGTERM restart: %v\n%s", err, out)
	}
}
