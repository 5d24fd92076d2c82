package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b"
	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/jail"
)

const e2bTestToken = "e2b-test-token-0123456789"

var exportRE = regexp.MustCompile(`E2B SDKs: export E2B_API_URL=(\S+) E2B_SANDBOX_URL=(\S+) E2B_API_KEY=(\S+)`)

// startServe starts `sandloop serve args...` and returns what it says to
// export for E2B's SDKs.
func startServe(tb testing.TB, args ...string) e2btest.Env {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := cliCommand(ctx, append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", tb.TempDir()}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cancel()
		cmd.Wait()
		if tb.Failed() {
			tb.Logf("sandloop serve stderr:\n%s", stderr.String())
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := exportRE.FindStringSubmatch(lines.Text()); m != nil {
			if m[1] != m[2] {
				tb.Fatalf("E2B_API_URL %s and E2B_SANDBOX_URL %s differ", m[1], m[2])
			}
			go io.Copy(io.Discard, stdout)
			return e2btest.Env{URL: m[1], Key: m[3]}
		}
	}
	tb.Fatalf("sandloop serve printed no E2B variables")
	return e2btest.Env{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestE2BSDKs drives a real `sandloop serve` with E2B's official npm SDKs,
// unchanged: @e2b/code-interpreter (on e2b latest) for the whole tour, and
// e2b 2.45 for lifecycle, files and commands (see testdata/sdk/e2e.mjs of
// package e2b).
func TestE2BSDKs(t *testing.T) {
	e2btest.SDK(t)
	env := startServe(t, "--token", e2bTestToken, "--pool", "1")
	if env.Key != e2b.KeyForToken(e2bTestToken) {
		t.Errorf("printed key %s, want the token's", env.Key)
	}
	for _, tc := range []struct {
		mode  string
		steps int
	}{{"interpreter", 25}, {"e2b-2.45", 14}, {"lifecycle", 6}, {"fork", 3}, {"snapshots", 4}} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			out, err := e2btest.Run(t, env, 5*time.Minute, tc.mode)
			ok := strings.Count(string(out), "\nok ") + boolInt(strings.HasPrefix(string(out), "ok "))
			if err != nil || !strings.HasSuffix(string(out), "done\n") || ok != tc.steps {
				t.Fatalf("node e2e.mjs %s: %v (%d steps ok, want %d)\n%s", tc.mode, err, ok, tc.steps, out)
			}
		})
	}
}

// TestE2BKeepAlive: E2B's JS SDK keeps its connections to the server
// across a pause longer than its HTTP client's (undici's) own idle default
// of 4 s, since the server says in each response how long it keeps them
// (host.IdleKeep): an agent framework's next sandbox, seconds later, opens
// no connection (BenchmarkE2BBurst100's repeated burst paid ~200).
func TestE2BKeepAlive(t *testing.T) {
	e2btest.SDK(t)
	env := startServe(t, "--token", e2bTestToken, "--pool", "1")
	out, err := e2btest.Run(t, env, 2*time.Minute, "keepalive", "5000")
	if err != nil || !strings.HasSuffix(string(out), "done\n") || strings.Count(string(out), "ok keepalive") != 2 {
		t.Fatalf("node e2e.mjs keepalive: %v\n%s", err, out)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestServeE2BKey: without tokens serve makes a key for the run and
// refuses others; --e2b=false serves no E2B routes.
func TestServeE2BKey(t *testing.T) {
	env := startServe(t, "--pool", "0")
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(env.Key) {
		t.Errorf("key %q is not in the form the SDKs accept", env.Key)
	}
	for key, want := range map[string]int{env.Key: 200, "e2b_00": 401} {
		req, _ := http.NewRequest("GET", env.URL+"/v2/sandboxes", nil)
		req.Header.Set("X-API-KEY", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("list with key %s: %d, want %d", key, resp.StatusCode, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := cliCommand(ctx, "serve", "--addr", "127.0.0.1:0", "--pool", "0", "--data-dir", t.TempDir(), "--e2b=false")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cancel()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+`).FindString(line)
	resp, err := http.Get(url + "/v2/sandboxes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("--e2b=false: /v2/sandboxes answered %d", resp.StatusCode)
	}
}

// BenchmarkE2BCreateRunCode compares Sandbox.create() + the first
// runCode('1+1') through E2B's SDK with the same through sandloop's own
// API (create a session, execute), alternating the two against one
// `sandloop serve` (each once its warm pool is full again), and reports the
// ratio of the medians. With the zygote (when this host can run it) the
// first cell also imports pandas.
//
//	go test ./cmd/sandloop -run '^$' -bench E2BCreateRunCode -benchtime 1x
func BenchmarkE2BCreateRunCode(b *testing.B) {
	e2btest.SDK(b)
	b.Setenv("SANDLOOP_TOKEN", e2bTestToken) // for the script's native calls
	const runs = 15
	for _, v := range []struct {
		name, code string
		args       []string
	}{{"pool", "1+1", nil}, {"zygote-pandas", "import pandas; 1+1", []string{"--zygote"}}} {
		b.Run(v.name, func(b *testing.B) {
			if v.args != nil && !jail.Probe().Cgroups.OK {
				b.Skip("the zygote needs cgroups")
			}
			env := startServe(b, append([]string{"--token", e2bTestToken, "--pool", "2"}, v.args...)...)
			for i := 0; i < b.N; i++ {
				out, err := e2btest.Run(b, env, 5*time.Minute, "bench", fmt.Sprint(runs), v.code)
				var res struct {
					SDKMS    float64 `json:"sdk_ms"`
					NativeMS float64 `json:"native_ms"`
				}
				if err != nil || json.Unmarshal(bytes.SplitN(out, []byte("\n"), 2)[0], &res) != nil || res.NativeMS == 0 {
					b.Fatalf("node e2e.mjs bench: %v\n%s", err, out)
				}
				ratio := res.SDKMS / res.NativeMS
				b.ReportMetric(res.SDKMS, "sdk-ms")
				b.ReportMetric(res.NativeMS, "native-ms")
				b.ReportMetric(ratio, "ratio")
				b.Logf("%s: median create + first runCode(%q): E2B SDK %.1f ms, native API %.1f ms: %.2fx (target <= 2x)", v.name, v.code, res.SDKMS, res.NativeMS, ratio)
			}
		})
	}
}
