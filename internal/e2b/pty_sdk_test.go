package e2b

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestSDKPTY drives a terminal with E2B's real npm SDK (testdata/sdk/pty.mjs):
// pty.create, sendInput of python3 -q and print(6*7), resize, list, kill,
// the stream's deadline; no process of it is left afterwards.
func TestSDKPTY(t *testing.T) {
	e2btest.SDK(t)
	t.Parallel()
	ts := newTestServer(t, Options{})
	marker := fmt.Sprintf("sandloop-pty-%d", time.Now().UnixNano())
	out, err := e2btest.RunScript(t, e2btest.Env{URL: ts.URL, Key: keyA}, 3*time.Minute, "pty.mjs", marker)
	const steps = 7
	if ok := strings.Count("\n"+string(out), "\nok "); err != nil || ok != steps || !strings.HasSuffix(string(out), "done\n") {
		t.Fatalf("node pty.mjs: %v (%d steps ok, want %d)\n%s", err, ok, steps, out)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
			return fmt.Errorf("processes left behind: %v", pids)
		}
		return nil
	})
}
