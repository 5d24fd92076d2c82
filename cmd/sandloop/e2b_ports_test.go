package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
)

// TestE2BPorts: E2B's SDK reaches a server in a sandbox at getHost(port),
// by header routing too; allowPublicTraffic: false needs the traffic token,
// also for a server a background command started (which runCode reaches);
// maskRequestHost and httpsPorts (testdata/sdk/ports.mjs of package e2b).
func TestE2BPorts(t *testing.T) {
	e2btest.SDK(t)
	env := startServe(t, "--token", e2bTestToken, "--pool", "0")
	out, err := e2btest.RunScript(t, env, 2*time.Minute, "ports.mjs")
	if err != nil || !strings.HasSuffix(string(out), "done\n") || strings.Count(string(out), "ok ") != 11 {
		t.Fatalf("node ports.mjs: %v\n%s", err, out)
	}
}
