package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// Commands started with `stdin: true` (as Mastra's E2B workspace starts
// every command), through E2B's own SDK against a real `sandloop serve`:
// their ends and kills are reported at once, a sandbox holding one is
// killed and timed out on time without holding up others, nothing is
// left behind, and SIGTERM of serve with one open exits within the drain
// timeout (issue 24: each hung on the old code).
func TestE2BStdinCommands(t *testing.T) {
	e2btest.SDK(t)
	const drain = 2 * time.Second
	marker := fmt.Sprintf("sandloop-stdin-%d-%d", os.Getpid(), time.Now().UnixNano())
	cmd, env, stderr := startServeCmd(t, "--token", e2bTestToken, "--pool", "1", "--drain-timeout", drain.String())
	// The script stays attached to the last command's stream, so serve's
	// SIGTERM below finds a client waiting on a stuck command.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", e2btest.SDK(t), "stdin", marker)
	node.Dir = e2btest.Dir()
	node.Env = append(os.Environ(), "E2B_API_URL="+env.URL, "E2B_SANDBOX_URL="+env.URL, "E2B_API_KEY="+env.Key)
	node.WaitDelay = 5 * time.Second
	var out syncBuffer
	pr, pw := io.Pipe()
	node.Stdout, node.Stderr = io.MultiWriter(&out, pw), &out
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan error, 1)
	go func() { err := node.Wait(); pw.Close(); nodeDone <- err }()
	sc := bufio.NewScanner(pr)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "left ") {
	}
	go io.Copy(io.Discard, pr)
	if !strings.Contains(out.String(), "\nleft ") {
		<-nodeDone
		t.Fatalf("node e2e.mjs stdin:\n%s", out.String())
	}
	if pids := testutil.PidsWithArg(marker + "-k\x00"); len(pids) > 0 {
		t.Errorf("killed and timed-out sandboxes left their commands running: pids %v", pids)
	}
	// (The start event may come a moment before the command has exec'd.)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(testutil.PidsWithArg(marker+"-left\x00")) == 0 {
			return errors.New("the sandbox left for SIGTERM holds no command (the test would check nothing)")
		}
		return nil
	})
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		took := time.Since(start)
		t.Logf("SIGTERM to exit: %v (drain timeout %v)", took.Round(time.Millisecond), drain)
		if err != nil {
			t.Errorf("serve exited with %v\n%s", err, stderr.String())
		}
		if took > drain+5*time.Second {
			t.Errorf("serve took %v to exit after SIGTERM, drain timeout %v", took, drain)
		}
	case <-time.After(drain + 30*time.Second):
		cmd.Process.Kill()
		t.Fatalf("serve ignored SIGTERM with a stdin command open\n%s", stderr.String())
	}
	if pids := testutil.PidsWithArg(marker); len(pids) > 0 {
		t.Errorf("serve's shutdown left sandboxed commands running: pids %v", pids)
	}
	select {
	case <-nodeDone:
	case <-time.After(30 * time.Second):
		t.Error("the SDK's stream of the left command did not end with the server")
	}
	t.Logf("node e2e.mjs stdin:\n%s", out.String())
	if !strings.Contains(out.String(), "left command ended: ") {
		t.Errorf("the SDK was not told the left command ended")
	}
}

// startServeCmd starts `sandloop serve args...` and returns it with what
// it says to export for E2B's SDKs; the caller may signal and wait for it
// (the cleanup kills it if it is still running).
func startServeCmd(tb testing.TB, args ...string) (*exec.Cmd, e2btest.Env, *syncBuffer) {
	tb.Helper()
	cmd := cliCommand(context.Background(), append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", tb.TempDir()}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if tb.Failed() {
			tb.Logf("sandloop serve stderr (tail):\n%s", tail(stderr.String(), 60))
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := exportRE.FindStringSubmatch(lines.Text()); m != nil {
			go io.Copy(io.Discard, stdout)
			return cmd, e2btest.Env{URL: m[1], Key: m[3]}, stderr
		}
	}
	tb.Fatalf("sandloop serve printed no E2B variables\n%s", stderr.String())
	return nil, e2btest.Env{}, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
