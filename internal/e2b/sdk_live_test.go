package e2b

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
)

// runLive runs `node testdata/sdk/live.mjs args...` (E2B's own npm SDKs)
// against ts and checks that every step passed.
func runLive(t *testing.T, ts *testServer, steps int, args ...string) {
	t.Helper()
	e2btest.SDK(t) // installs the SDKs, or skips without node
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(e2btest.Dir(), "live.mjs")}, args...)...)
	cmd.Dir = e2btest.Dir()
	cmd.Env = append(os.Environ(), "E2B_API_URL="+ts.URL, "E2B_SANDBOX_URL="+ts.URL, "E2B_API_KEY="+keyA)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	ok := strings.Count("\n"+string(out), "\nok ")
	if err != nil || !strings.HasSuffix(string(out), "done\n") || ok != steps {
		t.Fatalf("node live.mjs %s: %v (%d steps ok, want %d)\n%s", args[0], err, ok, steps, out)
	}
}

// updateNetwork and watchDir through E2B's npm SDK, unchanged.
func TestSDKNetworkAndWatch(t *testing.T) {
	t.Parallel()
	t.Run("network", func(t *testing.T) {
		t.Parallel()
		nw := newNetWorld(t, 0)
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(caFile, nw.ca.PEM, 0o644); err != nil {
			t.Fatal(err)
		}
		runLive(t, nw.ts, 5, "network", nw.site, caFile)
	})
	t.Run("watch", func(t *testing.T) {
		t.Parallel()
		runLive(t, newTestServer(t, Options{}), 4, "watch")
	})
}
