package zygote

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// Made by the trampoline (the default): the spare's reaper is the
	// program from the start, never a copy of the template.
	t.Run("trampoline", func(t *testing.T) {
		z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv()})
		if pids := z.armedSparePids(t); len(pids) == 0 {
			t.Fatal("no armed spare")
		} else if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pids[0]))); comm != "reaper" {
			t.Fatalf("an armed spare's reaper runs %q, want the small reaper", comm)
		}
		testReaper(t, z, true)
	})
	// Without the trampoline, executed by the reaper (a copy of the
	// template) right after the kernel's fork.
	t.Run("early", func(t *testing.T) {
		z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), earlyReaper: true, noTrampoline: true})
		if pids := z.armedSparePids(t); len(pids) == 0 {
			t.Fatal("no armed spare")
		} else if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pids[0]))); comm != "reaper" {
			t.Fatalf("an armed spare's reaper runs %q, want the small reaper", comm)
		}
		testReaper(t, z, true)
	})
	// Without the trampoline, executed after the take (the default: a few
	// seconds after; here at once).
	t.Run("late", func(t *testing.T) {
		testReaper(t, newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), reaperDelay: time.Millisecond, noTrampoline: true}), true)
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

// Where the trampoline was generated, the template uses it: each armed
// spare's reaper (PID 1) is the small reaper before any session takes it,
// its kernel (PID 2, the reaper's child) a copy of the template, and the
// template itself never left its PID namespace. Without it (noTrampoline,
// as a binary built without `go generate`), the reaper is a copy of the
// template until the take.
func TestTrampoline(t *testing.T) {
	if so, why := trampolineProgram(); so == nil {
		t.Fatalf("no trampoline in this test binary: %s (make gen)", why)
	}
	for _, with := range []bool{true, false} {
		t.Run(fmt.Sprint("trampoline=", with), func(t *testing.T) {
			z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), Spares: 2, noTrampoline: !with})
			pids := z.armedSparePids(t)
			if len(pids) < 4 {
				t.Fatalf("armed spares' pids %v, want two spares", pids)
			}
			want := "python3"
			if with {
				want = "reaper"
			}
			for i := 0; i+1 < len(pids); i += 2 {
				reaper, kpid := pids[i], pids[i+1]
				exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", reaper))
				if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", reaper))); comm != want || !strings.Contains(exe, want) {
					t.Errorf("an armed spare's reaper runs %q (%s), want %s", comm, exe, want)
				}
				if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", kpid))); comm != "python3" {
					t.Errorf("an armed spare's kernel runs %q, want python3", comm)
				}
				if r, k := nsPid(reaper), nsPid(kpid); r != 1 || k != 2 {
					t.Errorf("the reaper is PID %d and the kernel PID %d in their namespace, want 1 and 2", r, k)
				}
				if ppid := statusField(readFile(fmt.Sprintf("/proc/%d/status", kpid)), "PPid"); strings.TrimSpace(ppid) != strconv.Itoa(reaper) {
					t.Errorf("the kernel's parent is %s, want the reaper %d", ppid, reaper)
				}
				// Of the template's descriptors the kernel holds only its
				// own (the template's control socket was closed before its
				// fork): 0-2 and its two sockets.
				if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", kpid)); err != nil || len(fds) != 5 {
					t.Errorf("the armed kernel holds %d descriptors (%v), want 5", len(fds), err)
				}
			}
			z.mu.Lock()
			init := z.cur.proc.Pid()
			z.mu.Unlock()
			mine, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", z.Pid()))
			jails, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init))
			if mine == "" || mine != jails {
				t.Errorf("the template's PID namespace is %q, its jail's %q", mine, jails)
			}
		})
	}
}

// A trampoline the template cannot load (a libc too old for it) leaves
// spares made the old way: the reaper a copy of the template, sessions
// that work.
func TestTrampolineUnloadable(t *testing.T) {
	if so, why := trampolineProgram(); so == nil {
		t.Fatalf("no trampoline in this test binary: %s (make gen)", why)
	}
	z := newZygoteWith(t, &Options{Modules: light, Env: session.KernelEnv(), brokenTrampoline: true})
	if pids := z.armedSparePids(t); len(pids) == 0 {
		t.Fatal("no armed spare")
	} else if comm := strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pids[0]))); comm != "python3" {
		t.Fatalf("an armed spare's reaper runs %q, want a copy of the template (python3)", comm)
	}
	s := newSession(t, z, session.Options{})
	if got := out(t, s.Session, "import os; x = 41; print(x + 1, os.getpid(), os.getppid())"); got != "42 2 1" {
		t.Fatalf("got %q, want 42 2 1", got)
	}
}

// A session forked through the trampoline runs code as one forked the
// other way does: its variables, threads, subprocesses (SIGCHLD is not the
// template's), the same descriptors, PID 2 with the reaper as parent;
// and random generators (Python's and numpy's) are reseeded differently in
// each fork.
func TestTrampolineSession(t *testing.T) {
	if so, why := trampolineProgram(); so == nil {
		t.Fatalf("no trampoline in this test binary: %s (make gen)", why)
	}
	const code = `
import os, random, subprocess, threading, numpy as np
x = 41
got = []
th = threading.Thread(target=lambda: got.append(threading.get_native_id() != os.getpid()))
th.start(); th.join()
p = subprocess.run(["/bin/sh", "-c", "exit 3"])
print(x + 1, os.getpid(), os.getppid(), threading.get_native_id(), threading.main_thread() is threading.current_thread(),
      got, p.returncode, sorted(int(f) for f in os.listdir("/proc/self/fd")))`
	const draw = `print(random.random(), np.random.rand(), np.random.default_rng().random())`
	var results []string
	for _, with := range []bool{true, false} {
		z := newZygoteWith(t, &Options{Modules: []string{"numpy"}, Env: session.KernelEnv(), noTrampoline: !with})
		if pids := z.armedSparePids(t); len(pids) == 0 || (strings.TrimSpace(readFile(fmt.Sprintf("/proc/%d/comm", pids[0]))) == "reaper") != with {
			t.Fatalf("trampoline %v: the armed spare's reaper is not what was asked for", with)
		}
		a := newSession(t, z, session.Options{})
		b := newSession(t, z, session.Options{})
		got := out(t, a.Session, code)
		if want := "42 2 1 2 True [True] 3 ["; !strings.HasPrefix(got, want) {
			t.Errorf("trampoline %v: %q, want %q and the descriptors", with, got, want)
		}
		out(t, b.Session, code)
		x, y := out(t, a.Session, draw), out(t, b.Session, draw)
		if x == y {
			t.Errorf("trampoline %v: two forks drew the same random numbers: %s", with, x)
		}
		ax, bx := strings.Fields(x), strings.Fields(y)
		for i := range ax {
			if i < len(bx) && ax[i] == bx[i] {
				t.Errorf("trampoline %v: generator %d drew %s in both forks", with, i, ax[i])
			}
		}
		results = append(results, got)
	}
	if results[0] != results[1] {
		t.Errorf("the trampoline's session printed %q, the other way's %q", results[0], results[1])
	}
}
