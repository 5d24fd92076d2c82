package zygote

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// TestCloseKillsWhatTheGroupHolds: a session's Kill signals its PID
// namespace's init (and the kernel) without reading the session's cgroup,
// so a process in the group but outside that namespace (which a session
// cannot make: a host process is moved there here) must still die when
// the session closes, by the group's removal, and the group must go, in
// every hierarchy.
func TestCloseKillsWhatTheGroupHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("moves a host process into a session's cgroup: needs root")
	}
	z := newZygote(t, light)
	s := newSession(t, z, session.Options{})
	dirs := sessionGroups(t, s.proc.HostPids()[1])
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the process in the session's group ended with %v, want killed by SIGKILL", err)
		}
	case <-time.After(z.patience(30 * time.Second)):
		t.Fatal("the process in the session's group still runs after the session closed")
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s still exists", d)
		}
	}
}

// sessionGroups returns the session's cgroup directories of a host
// process: one per hierarchy it is in (v1), or its v2 group.
func sessionGroups(t *testing.T, pid int) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "/sandloop-") {
			continue
		}
		controllers := strings.TrimPrefix(parts[1], "name=")
		for _, d := range []string{filepath.Join("/sys/fs/cgroup", controllers, parts[2]), filepath.Join("/sys/fs/cgroup", parts[2])} {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				dirs = append(dirs, d)
				break
			}
		}
	}
	if len(dirs) == 0 {
		t.Fatalf("no session cgroup found in %q", data)
	}
	return dirs
}
