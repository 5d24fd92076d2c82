package zygote

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// Soon after its session has taken it, a forked session's PID 1 is the
// small reaper rather than a copy of the template: it keeps only a few pages,
// its descriptors stay out of the session's reach, it forwards signals to
// the kernel, and it reports how the kernel ended as the Python loop did.
// The Python loop (without the program) does the same.
func TestSmallReaper(t *testing.T) {
	if bin, why := reaperProgram(); bin == nil {
		t.Fatalf("no small reaper in this test binary: %s (make gen)", why)
	}
	// Executed right after the kernel's fork: the spare's reaper is the
	// program from the start (it prepared the spare and is armed).
	t.Run("early", func(t *testing.T) {
		z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), earlyReaper: true})
		if pids := z.armedSparePids(t); len(pids) == 0 {
			t.Fatal("no armed spare")
		} else if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pids[0]))); comm != "reaper" {
			t.Fatalf("an armed spare's reaper runs %q, want the small reaper", comm)
		}
		testReaper(t, z, true)
	})
	// Executed after the take (the default: a few seconds after; here at
	// once).
	t.Run("late", func(t *testing.T) {
		testReaper(t, newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), reaperDelay: time.Millisecond}), true)
	})
	t.Run("python", func(t *testing.T) {
		testReaper(t, newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), reaperDelay: time.Millisecond, pythonReaper: true}), false)
	})
}

func testReaper(t *testing.T, z *Zygote, small bool) {
	cases := []struct {
		name, code, want string
	}{
		{"exit code", "import os; os._exit(3)", "exited with status 3"},
		{"signal", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by signal SIGSEGV"},
		{"kill -9", "", "killed by signal SIGKILL"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ws := t.TempDir()
			s := newSession(t, z, session.Options{Workspace: ws})
			pids := s.proc.HostPids()
			reaper, kpid := pids[0], pids[1]
			if small {
				testutil.WaitFor(t, z.patience(30*time.Second), func() error {
					if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", reaper))); comm != "reaper" {
						return fmt.Errorf("the session's PID 1 runs %q, want the small reaper", comm)
					}
					return nil
				})
				// A copy of the template holds ~1.4 MiB of its own; this
				// one, pages.
				if rss := statusKB(reaper, "RssAnon:"); rss == 0 || rss > 512 {
					t.Errorf("the reaper's RssAnon is %d kB, want a few pages", rss)
				}
			} else if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", reaper))); comm != "python3" {
				t.Fatalf("the session's PID 1 runs %q, want the Python reaper", comm)
			}
			// Not dumpable: the session cannot reach its PID 1's
			// descriptors (the socket to the host).
			if got := out(t, s.Session, "import os\ntry:\n    print(os.listdir('/proc/1/fd'))\nexcept PermissionError:\n    print('denied')"); got != "denied" {
				t.Errorf("the session lists its reaper's descriptors: %s", got)
			}
			if i == 0 {
				// The host reaches the session's loopback through its
				// PID 1 (its ports, a connection).
				out(t, s.Session, "import socket\nl = socket.socket()\nl.bind(('127.0.0.1', 8123))\nl.listen()")
				if ports, err := s.proc.ListeningPorts(); err != nil || !slices.Contains(ports, 8123) {
					t.Errorf("listening ports %v, %v: want 8123", ports, err)
				}
				c, err := s.proc.DialLoopback(t.Context(), 8123)
				if err != nil {
					t.Fatalf("dial the session's loopback: %v", err)
				}
				c.Close()
				// A signal sent to the reaper reaches the kernel: SIGINT
				// interrupts the running cell.
				done := make(chan *kernel.Result, 1)
				go func() {
					res, _ := s.Execute(t.Context(), kernel.Request{Code: "import time\nopen('started', 'w').close()\nwhile True: time.sleep(0.05)", Timeout: 5 * time.Minute}, nil)
					done <- res
				}()
				testutil.WaitFor(t, z.patience(30*time.Second), func() error {
					_, err := os.Stat(filepath.Join(ws, "started"))
					return err
				})
				if err := syscall.Kill(reaper, syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
				if res := <-done; res == nil || res.Status != kernel.StatusInterrupted {
					t.Fatalf("SIGINT to the reaper: %+v, want the cell interrupted", res)
				}
			}
			if c.code != "" {
				s.Execute(t.Context(), kernel.Request{Code: c.code, Timeout: time.Minute}, nil)
			} else if err := syscall.Kill(kpid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := s.proc.Wait(); err == nil || err.Error() != c.want {
				t.Errorf("the session's end: %v, want %s", err, c.want)
			}
		})
	}
}
