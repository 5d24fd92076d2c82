package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asNobody returns the CLI as a command run by an unprivileged user (a
// copy of this test binary it can execute), with a home of its own.
func asNobody(t *testing.T, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	dir, err := os.MkdirTemp("", "sandloop-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandloop")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	os.Mkdir(home, 0o700)
	os.Chown(home, 65534, 65534)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{asCLI + "=1", "TMPDIR=" + home, "HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// A zygote asked for explicitly on a host that cannot run one (here: not
// root) is a startup error: exit 2, one line.
func TestZygoteOnWithoutRootFails(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--zygote=on", "--addr", "127.0.0.1:0", "--data-dir", "data"},
		{"mcp", "--zygote"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := asNobody(t, ctx, args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 ||
			!strings.Contains(string(out), "--zygote=on: the zygote needs root") {
			t.Errorf("%v as nobody: %v %q; want exit 2 and one line saying the zygote needs root", args, err, out)
		}
	}
}

// By default a host that cannot run the zygote serves cold sessions, after
// one log line saying why.
func TestZygoteAutoFallsBackToCold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := asNobody(t, ctx, "serve", "--addr", "127.0.0.1:0", "--pool", "0", "--data-dir", "data")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "sandloop serving on http://") {
		t.Fatalf("serve as nobody: %q %v; stderr %s", line, err, stderr.String())
	}
	cmd.Cancel()
	cmd.Wait()
	if n := strings.Count(stderr.String(), "sessions start cold: the zygote needs root"); n != 1 {
		t.Errorf("want one line saying sessions start cold, got %d:\n%s", n, stderr.String())
	}
}
