// Package e2btest drives sandloop's E2B-compatible face with E2B's own npm
// SDKs (internal/e2b/testdata/sdk, installed from its committed lock file):
// the end-to-end tests and the benchmark of cmd/sandloop use it.
package e2btest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Dir is internal/e2b/testdata/sdk, found from this file.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "sdk")
}

var npmOnce struct {
	sync.Once
	err error
	out []byte
}

// SDK returns the path of e2e.mjs, installing the SDKs with `npm ci` the
// first time. Without node and npm the test is skipped.
func SDK(tb testing.TB) string {
	tb.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("the E2B SDK tests need %s (Node.js 20 or newer) on PATH", tool)
		}
	}
	npmOnce.Do(func() {
		for _, pkg := range []string{"e2b", "e2b-2.45", "@e2b/code-interpreter"} {
			if _, err := os.Stat(filepath.Join(Dir(), "node_modules", pkg, "package.json")); err != nil {
				cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
				cmd.Dir = Dir()
				npmOnce.out, npmOnce.err = cmd.CombinedOutput()
				return
			}
		}
	})
	if npmOnce.err != nil {
		tb.Fatalf("npm ci in %s: %v\n%s", Dir(), npmOnce.err, npmOnce.out)
	}
	return filepath.Join(Dir(), "e2e.mjs")
}

// Env is what the SDKs need to reach a server.
type Env struct {
	URL, Key string
	// Vars are more environment variables for the script (NAME=value).
	Vars []string
}

// Run runs `node e2e.mjs args...` against env and returns its output.
func Run(tb testing.TB, env Env, timeout time.Duration, args ...string) ([]byte, error) {
	tb.Helper()
	return RunScript(tb, env, timeout, "e2e.mjs", args...)
}

// RunScript runs `node name args...`, name being a script of Dir(),
// against env and returns its output.
func RunScript(tb testing.TB, env Env, timeout time.Duration, name string, args ...string) ([]byte, error) {
	tb.Helper()
	script := filepath.Join(filepath.Dir(SDK(tb)), name)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = Dir()
	cmd.Env = append(append(os.Environ(), "E2B_API_URL="+env.URL, "E2B_SANDBOX_URL="+env.URL, "E2B_API_KEY="+env.Key), env.Vars...)
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}
