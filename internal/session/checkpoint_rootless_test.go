package session_test

import (
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session/sessiontest"
)

// TestCheckpointsRootless runs the checkpoint, undo and fork tests as an
// unprivileged user (the rootless jail, its workspace and the store).
func TestCheckpointsRootless(t *testing.T) {
	names := []string{"TestCheckpointRestore", "TestUndo", "TestCheckpointNotCarried", "TestFork", "TestForkZygote", "TestForkSharesBuffers", "TestForkReusesExport", "TestRootForkRemapKeepsWrites"}
	out := sessiontest.AsNobody(t, "SANDLOOP_CHECKPOINT_ROOTLESS", "^("+strings.Join(names, "|")+")$")
	for _, name := range names {
		if !strings.Contains(out, "--- PASS: "+name) && !strings.Contains(out, "--- SKIP: "+name) {
			t.Errorf("%s did not pass rootless:\n%s", name, out)
		}
	}
	t.Logf("%s", out)
}
