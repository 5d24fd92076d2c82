package sessiontest

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// spinCode starts a spinning thread in the kernel and a spinning child
// process (named by its argument, so the host can find it), and sets x.
const spinCode = `import subprocess, sys, threading
spin_n = [0]
def _spin():
    while True: spin_n[0] += 1
threading.Thread(target=_spin, daemon=True).start()
spin_child = subprocess.Popen([sys.executable, "-c", "while True: pass", %q])
x = 42
`

func execOK(t *testing.T, s *session.Session, code string) string {
	t.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: code, Timeout: time.Minute}, nil)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	if r.Status != kernel.StatusOK {
		t.Fatalf("execute %q: status %s, %+v", code, r.Status, r.Error)
	}
	return r.MainResult()["text/plain"]
}

// CheckPause checks on s (whose sandbox a cgroup measures) that a paused
// session, with a thread and a child process spinning, uses no CPU by its
// cgroup's count over 500 ms; that pausing is idempotent and refused
// mid-execution (ErrBusy); that an Execute resumes it with its variables,
// the thread having gone on; and that closing it while paused leaves none
// of its processes and none of its cgroups (frozen ones included). It
// closes s.
func CheckPause(t *testing.T, s *session.Session) {
	t.Helper()
	token := "sandloop-pause-" + rand.Text()
	execOK(t, s, strings.Replace(spinCode, "%q", strconv.Quote(token), 1))
	before, _ := strconv.Atoi(execOK(t, s, "spin_n[0]"))
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatalf("pausing a paused session: %v", err)
	}
	if got := s.State(); got != session.StatePaused {
		t.Errorf("state %q, want paused", got)
	}
	u1, err := s.Resources()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	u2, _ := s.Resources()
	if u1.CPU != u2.CPU {
		t.Errorf("paused, the session used %v of CPU in 500 ms", u2.CPU-u1.CPU)
	}
	// Execute resumes it, state and all.
	if got := execOK(t, s, "import time; time.sleep(0.2); x, spin_n[0] > "+strconv.Itoa(before)); got != "(42, True)" {
		t.Errorf("after resuming: %s, want (42, True): the variables and the thread go on", got)
	}
	if got := s.State(); got != session.StateRunning {
		t.Errorf("state %q after an execute, want running", got)
	}
	// Its spinners run again: its cgroup counts CPU (waited for, not
	// timed: a loaded machine may not schedule them for a while).
	u3, _ := s.Resources()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if u4, _ := s.Resources(); u4.CPU <= u3.CPU {
			return errors.New("resumed, the session uses no CPU")
		}
		return nil
	})

	// Mid-execution (the cell has said it runs): refused, clearly.
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := s.Execute(context.Background(), kernel.Request{Code: "import time; print('in', flush=True); time.sleep(1.5)", Timeout: time.Minute},
			func(ev kernel.Event) {
				if ev.Type == "stdout" {
					once.Do(func() { close(started) })
				}
			})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the cell ended before it printed: %v", err)
	}
	if err := s.Pause(); !errors.Is(err, session.ErrBusy) {
		t.Errorf("pause mid-execution: %v, want ErrBusy", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Closed while paused: nothing left.
	pids := pidsWith(token)
	if len(pids) != 1 {
		t.Fatalf("found %d host processes of the session's child, want 1", len(pids))
	}
	groups := groupsOf(t, pids[0])
	if len(groups) == 0 {
		t.Fatalf("found no cgroup of the session's child %d", pids[0])
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("closing the paused session took %v", time.Since(start).Round(time.Microsecond))
	case <-time.After(30 * time.Second):
		t.Fatal("closing a paused session did not end")
	}
	for _, pid := range pidsWith(token) {
		t.Errorf("process %d of the closed session is left", pid)
	}
	// Groups are removed as the sandbox's end is collected (at once for a
	// cold jail, by the zygote's reaper for a fork): a bounded wait.
	deadline := time.Now().Add(10 * time.Second)
	for _, g := range groups {
		for exists(g) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if exists(g) {
			t.Errorf("cgroup %s of the closed session is left", g)
		}
	}
	if got := s.State(); got != session.StateClosed {
		t.Errorf("state %q after Close", got)
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// pidsWith lists the host processes whose command line holds token.
func pidsWith(token string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); strings.Contains(string(b), token) {
			out = append(out, pid)
		}
	}
	return out
}

// groupsOf returns the directories of the sandbox groups process pid is
// in (sandloop-* under /sys/fs/cgroup, at any depth up to four).
func groupsOf(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		name := filepath.Base(parts[2])
		if !strings.HasPrefix(name, "sandloop-") || name == "sandloop-supervisor" {
			continue
		}
		for _, pattern := range []string{"/sys/fs/cgroup/*/" + name, "/sys/fs/cgroup/*/*/" + name, "/sys/fs/cgroup/*/*/*/" + name, "/sys/fs/cgroup/*/*/*/*/" + name} {
			found, _ := filepath.Glob(pattern)
			for _, f := range found {
				if !contains(out, f) {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
