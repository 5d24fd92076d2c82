package main

import (
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/gateway/restoretest"
)

// TestSessionsCLIRestored: a sessions verb given the id of a session whose
// host was lost (a real gateway restores it from its snapshot and answers
// 307) works on the restored session and says on stderr, in one line, the
// new id and what came back; stdout stays the verb's own answer.
func TestSessionsCLIRestored(t *testing.T) {
	cell := restoretest.New(t, nil)
	cell.Lose(t)
	t.Setenv("SANDLOOP_TOKEN", cell.Token)
	code, out, errOut := sandloop(t, "", "sessions", "--url", cell.URL, "checkpoint", cell.Session, "--name", "after")
	if code != 0 || !strings.Contains(out, "taken at execution") {
		t.Fatalf("checkpoint of the lost session: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "session "+cell.Session+" was restored as ") ||
		!strings.Contains(lines[0], "files exact") || !strings.Contains(lines[0], "variables restored: answer") {
		t.Fatalf("stderr = %q, want one line naming the new id and what came back", errOut)
	}
	newID := strings.Fields(strings.TrimPrefix(lines[0], "session "+cell.Session+" was restored as "))[0]
	// Another invocation (a new client: the gateway's later 307 has no
	// summary) says the same, and the checkpoint is the restored session's.
	code, out, errOut = sandloop(t, "", "sessions", "--url", cell.URL, "checkpoints", cell.Session)
	if code != 0 || !strings.Contains(out, "after") || !strings.Contains(errOut, "was restored as "+newID+" from snapshot") {
		t.Errorf("checkpoints of the lost id: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// --json: stdout is JSON only.
	code, out, errOut = sandloop(t, "", "sessions", "--url", cell.URL, "--json", "pause", cell.Session)
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "{") || !strings.Contains(out, newID) || !strings.Contains(errOut, newID) {
		t.Errorf("pause --json: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}
