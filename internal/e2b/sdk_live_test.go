package e2b

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/testutil"
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

// One sandbox, as E2B's is one machine, through E2B's npm SDK unchanged:
// commands, the code interpreter and the files API share /tmp, the
// loopback and processes; a detached background job outlives its command
// and is gone, checked from the host, once the sandbox is killed.
func TestSDKOneSandbox(t *testing.T) {
	t.Parallel()
	mark := "7" + strconv.Itoa(int(time.Now().UnixNano()%1e8))
	runLive(t, newTestServer(t, Options{}), 4, "onebox", mark)
	testutil.WaitFor(t, 30*time.Second, func() error {
		if left := testutil.PidsWithArg(mark); len(left) > 0 {
			return fmt.Errorf("left behind after the sandbox was killed: %v", left)
		}
		return nil
	})
}

// getMetrics through E2B's npm SDK, unchanged: the session's sampler (the
// one GET /v1/sessions/{id}/metrics reads) takes a sample a second, and
// memUsed grows by the 150 MiB the kernel allocates.
func TestSDKMetrics(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	if resp, b := ts.control(t, "GET", "/sandboxes/"+c.SandboxID+"/metrics", "", keyA); resp.StatusCode == 501 {
		t.Skipf("no cgroups here: %s", b)
	}
	runLive(t, ts, 3, "metrics")
}
