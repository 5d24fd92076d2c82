package e2btest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// FrameworksDir is internal/e2b/testdata/frameworks: agent frameworks
// (the OpenAI Agents SDK, Mastra, ComputeSDK, Deep Agents) that reach a
// sandbox through E2B's SDK, pinned by its package-lock.json.
func FrameworksDir() string {
	return filepath.Join(filepath.Dir(Dir()), "frameworks")
}

// frameworkPackages are what FrameworksDir's scripts import: npm ci runs
// when any is missing.
var frameworkPackages = []string{
	"@openai/agents", "@openai/agents-extensions", "@mastra/core", "@mastra/e2b",
	"@computesdk/e2b", "computesdk", "deepagents", "@langchain/openai", "e2b",
}

var frameworksOnce struct {
	sync.Once
	err error
	out []byte
}

// Frameworks installs FrameworksDir's packages with `npm ci` the first
// time (from npm's cache when it has them all), within 5 minutes. Without
// node and npm the test is skipped.
func Frameworks(tb testing.TB) {
	tb.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("the agent framework tests need %s (Node.js 20 or newer) on PATH", tool)
		}
	}
	frameworksOnce.Do(func() {
		for _, pkg := range frameworkPackages {
			if _, err := os.Stat(filepath.Join(FrameworksDir(), "node_modules", pkg, "package.json")); err != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error")
				cmd.Dir = FrameworksDir()
				cmd.WaitDelay = 5 * time.Second
				frameworksOnce.out, frameworksOnce.err = cmd.CombinedOutput()
				return
			}
		}
	})
	if frameworksOnce.err != nil {
		tb.Fatalf("npm ci in %s: %v\n%s", FrameworksDir(), frameworksOnce.err, frameworksOnce.out)
	}
}

// Check is one check a framework script reported.
type Check struct {
	Name  string `json:"check"`
	OK    bool   `json:"ok"`
	Error string `json:"error"`
}

// FrameworkRun is what a framework script did: its checks in order,
// whether it reached its end, and all it printed.
type FrameworkRun struct {
	Checks []Check
	Done   bool
	Output []byte
}

// RunFramework runs `node script` of FrameworksDir against env, with the
// model at modelURL (an OpenAI-compatible base URL ending in /v1) and
// marker as the argument its long-lived commands carry, and collects the
// checks it prints, one JSON line each.
func RunFramework(tb testing.TB, env Env, modelURL, marker string, timeout time.Duration, script string) (FrameworkRun, error) {
	tb.Helper()
	Frameworks(tb)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(FrameworksDir(), script))
	cmd.Dir = FrameworksDir()
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+env.URL, "E2B_SANDBOX_URL="+env.URL, "E2B_API_KEY="+env.Key,
		"OPENAI_BASE_URL="+modelURL, "OPENAI_API_KEY=sk-test",
		"FW_MARKER="+marker,
		// The frameworks' own telemetry stays off: nothing leaves the loopback.
		"MASTRA_TELEMETRY_DISABLED=true", "LANGSMITH_TRACING=false", "LANGCHAIN_TRACING_V2=false",
		"OPENAI_AGENTS_DISABLE_TRACING=1", "DO_NOT_TRACK=1", "COMPUTESDK_TELEMETRY=false")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	run := FrameworkRun{Output: out}
	lines := bufio.NewScanner(bytes.NewReader(out))
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		line := lines.Bytes()
		if !bytes.HasPrefix(line, []byte(`{"check"`)) && !bytes.HasPrefix(line, []byte(`{"done"`)) {
			continue
		}
		var c struct {
			Check
			Done bool `json:"done"`
		}
		if json.Unmarshal(line, &c) != nil {
			continue
		}
		if c.Done {
			run.Done = true
			continue
		}
		run.Checks = append(run.Checks, c.Check)
	}
	return run, err
}
