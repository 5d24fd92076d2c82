package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b"
	"github.com/sandloop/sandloop/internal/e2b/e2btest"
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
