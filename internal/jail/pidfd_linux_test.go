package jail

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// stranger is a program of nobody's that answers each line it reads.
type stranger struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// newStranger starts a stranger, after before.
func newStranger(t *testing.T, before func() error) *stranger {
	t.Helper()
	c := exec.Command("/bin/sh", "-c", "while read -r x; do echo \"$x\"; done")
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := before(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() }) // (os.Process signals through a pidfd)
	return &stranger{c, in, bufio.NewReader(out)}
}

// strangerAt starts a stranger (sh, leading a session and a process group
// of its own) that takes the number pid, free now: the PID reuse that a
// burst of sandboxes brings about when PIDs wrap, made at once by
// rewinding the kernel's PID cursor (ns_last_pid, root's) to just before
// pid. The cursor is put back where it was after, so the machine's other
// programs see no more reuse than they would anyway.
func strangerAt(t *testing.T, pid int) *stranger {
	t.Helper()
	const cursor = "/proc/sys/kernel/ns_last_pid"
	if os.Geteuid() != 0 {
		t.Skip("rewinding ns_last_pid takes root")
	}
	was, err := strconv.Atoi(strings.TrimSpace(readFileString(cursor)))
	if err != nil {
		t.Skipf("no %s: %v", cursor, err)
	}
	defer func() {
		if now, err := strconv.Atoi(strings.TrimSpace(readFileString(cursor))); err == nil && now < was {
			_ = os.WriteFile(cursor, []byte(strconv.Itoa(was)), 0)
		}
	}()
	// Another process (or a thread of ours) may take the number first:
	// then the number is freed again and the cursor rewound again.
	for range 500 {
		s := newStranger(t, func() error {
			if err := os.WriteFile(cursor, []byte(strconv.Itoa(pid-1)), 0); err != nil {
				t.Skipf("rewind %s: %v", cursor, err)
			}
			return nil
		})
		if s.cmd.Process.Pid == pid {
			return s
		}
		s.cmd.Process.Kill()
		s.cmd.Wait()
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Skipf("PID %d was taken by another program before the stranger", pid)
		}
	}
	t.Skipf("PID %d could not be given to a stranger in 500 tries (a machine forking hard)", pid)
	return nil
}

// unharmed fails t if the stranger was stopped, or killed: it must answer
// a line. (A fatal signal, once sent, ends the process before it runs
// any more of its own code; a stopped one answers nothing, and the wait
// for its answer is bounded.)
func unharmed(t *testing.T, what string, s *stranger) {
	t.Helper()
	if st := procState(s.cmd.Process.Pid); st == 'T' || st == 't' {
		t.Fatalf("%s: stopped", what)
	}
	answer := make(chan string, 1)
	go func() {
		line, err := s.out.ReadString('\n')
		if err != nil {
			line = err.Error()
		}
		answer <- line
	}()
	if _, err := io.WriteString(s.in, "ping\n"); err != nil {
		t.Fatalf("%s: killed: %v", what, err)
	}
	select {
	case a := <-answer:
		if a != "ping\n" {
			t.Fatalf("%s: killed: %s", what, a)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: does not answer (state %q)", what, procState(s.cmd.Process.Pid))
	}
}

// scriptEnded waits until a join's host-side process has ended (a zombie:
// we have not waited for it), which it does after it reaped the program
// and reported its end: the program's number is free.
func scriptEnded(t *testing.T, pid int) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if st := procState(pid); st != 'Z' {
			return fmt.Errorf("the join's host-side process %d is in state %q", pid, st)
		}
		return nil
	})
}

// Once a joined program has ended, the join signals nothing by the
// number it had: not the join's own kill (its timer's, or abandon's after
// the configuration closed), nor the Process's Kill, Signal or Freeze. A
// stranger holding that number is left alone. (By number, each of these
// killed or stopped it.)
func TestJoinSignalsNoStrangerWithItsProgramsNumber(t *testing.T) {
	a, target := liveTarget(t, "stranger")
	for _, script := range []bool{false, true} {
		useJoinScript(t, script)
		name := map[bool]string{false: "the join program", true: "the join script"}[script]
		// ended is a join whose program has ended and been reaped, and
		// a stranger now holding its number.
		ended := func() (*joining, *stranger) {
			j, err := spawnJoin(target, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { j.cmd.Process.Kill(); j.wait(); j.stR.Close() })
			setup, _ := target.setup(false)
			if err := j.enter(setup); err != nil {
				t.Fatal(err)
			}
			if err := j.send(joinCommandOf(&Config{Path: "/bin/true"})); err != nil {
				t.Fatal(err)
			}
			if err := j.await(true); err != nil {
				t.Fatal(err)
			}
			scriptEnded(t, j.cmd.Process.Pid)
			return j, strangerAt(t, j.joinPid)
		}
		j, s := ended()
		j.kill()
		unharmed(t, name+": kill: the stranger that took the program's number", s)
		j, s = ended()
		j.abandon()
		unharmed(t, name+": abandon: the stranger that took the program's number", s)

		p, err := Start(context.Background(), &Config{Path: "/bin/true", Join: target})
		if err != nil {
			t.Fatal(err)
		}
		scriptEnded(t, p.Pid())
		s = strangerAt(t, p.joinPid)
		if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("%s: Signal of a program that ended: %v, want os.ErrProcessDone", name, err)
		}
		unharmed(t, name+": Signal: the stranger that took the program's number", s)
		p.Kill()
		unharmed(t, name+": Kill: the stranger that took the program's number", s)
		if r, err := p.Wait(); err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: %+v, %v", name, r, err)
		}
	}

	// Paused by SIGSTOP (a jail without a cgroup: every process descends
	// from the program).
	bare, err := NewJoinTarget(target.pidfd, a.Pid(), Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	p, err := Start(context.Background(), &Config{Path: "/bin/true", Join: bare})
	if err != nil {
		t.Fatal(err)
	}
	scriptEnded(t, p.Pid())
	s := strangerAt(t, p.joinPid)
	if err := p.Freeze(); err != nil {
		t.Fatal(err)
	}
	unharmed(t, "Freeze: the stranger that took the program's number", s)
	if err := p.Thaw(); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(); err != nil || r.ExitCode != 0 {
		t.Fatalf("%+v, %v", r, err)
	}
}

// A join's kill reaches its program while it runs, and the program's
// process group (a job it started) through the same pidfd; the Process's
// Kill its session, Signal the program.
func TestJoinKillsItsProgramAndGroupThroughThePidfd(t *testing.T) {
	_, target := liveTarget(t, "group")
	// jobs waits for the program's two sleeps (one a job of its shell).
	jobs := func(tag string) []int {
		var pids []int
		testutil.WaitFor(t, 60*time.Second, func() error {
			pids = append(testutil.PidsWithArg("1014."+tag), testutil.PidsWithArg("1015."+tag)...)
			if len(pids) != 2 {
				return fmt.Errorf("the program's sleeps: %v", pids)
			}
			return nil
		})
		return pids
	}
	cfg := func(tag string) *Config {
		return &Config{Path: "/bin/sh", Args: []string{"sh", "-c", "sleep 1014." + tag + " & exec sleep 1015." + tag}}
	}

	j, err := spawnJoin(target, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	setup, _ := target.setup(false)
	if err := j.enter(setup); err != nil {
		t.Fatal(err)
	}
	if err := j.send(joinCommandOf(cfg("1"))); err != nil {
		t.Fatal(err)
	}
	if err := j.await(true); err != nil {
		t.Fatal(err)
	}
	pids := jobs("1")
	j.kill()
	gone(t, pids...)
	j.wait()
	j.stR.Close()

	c := cfg("2")
	c.Join = target
	p, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	pids = jobs("2")
	p.Kill()
	r, err := p.Wait()
	if err != nil || r.Signal != "SIGKILL" {
		t.Errorf("Kill: %+v, %v", r, err)
	}
	gone(t, pids...)

	c = &Config{Path: "/bin/sleep", Args: []string{"sleep", "1016.5"}, Join: target}
	if p, err = Start(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(); err != nil || r.Signal != "SIGTERM" {
		t.Errorf("Signal: %+v, %v", r, err)
	}
}

// stopPids and contPids signal what the list names at both readings, and
// spare a process listed only at the first (one that left the group, or
// ended and gave its number away, between the two).
func TestStopPidsOnlyWhatIsStillListed(t *testing.T) {
	none := func() error { return nil }
	a, b := newStranger(t, none), newStranger(t, none)
	reads := 0
	list := func() []int {
		reads++
		if reads%2 == 1 {
			return []int{a.cmd.Process.Pid, b.cmd.Process.Pid}
		}
		return []int{a.cmd.Process.Pid}
	}
	if err := stopPids(list); err != nil {
		t.Fatal(err)
	}
	if st := procState(a.cmd.Process.Pid); st != 'T' {
		t.Errorf("the process listed at both readings is in state %q, want T (stopped)", st)
	}
	unharmed(t, "stopPids: the process listed only at the first reading", b)
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if st := procState(b.cmd.Process.Pid); st != 'T' {
			return fmt.Errorf("state %q", st)
		}
		return nil
	})
	contPids(list)
	// (SIGCONT wakes a stopped process as it is sent.)
	unharmed(t, "contPids: the process listed at both readings", a)
	if st := procState(b.cmd.Process.Pid); st != 'T' {
		t.Errorf("the process listed only at the first reading was continued (state %q)", st)
	}
}

// pinChildOf pins a process only while it is the expected parent's
// child: the number a join script reports for its child may be a
// stranger's by the time it is read (the child ended, the script reaped
// it, and the number was handed out again).
func TestPinChildOfOnlyTheParentsChild(t *testing.T) {
	parent := exec.Command("/bin/sh", "-c", "sleep 1018.5 & wait")
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parent.Process.Kill(); parent.Wait() })
	var kid *pinned
	testutil.WaitFor(t, 30*time.Second, func() error {
		for _, pid := range testutil.PidsWithArg("1018.5") {
			if kid = pinChildOf(pid, parent.Process.Pid); kid != nil {
				return nil
			}
		}
		return fmt.Errorf("the parent's sleep has not started")
	})
	t.Cleanup(func() { kid.signal(syscall.SIGKILL); kid.release() })
	if !kid.alive() {
		t.Error("the parent's child was pinned, but is not alive through its pin")
	}
	s := newStranger(t, func() error { return nil })
	if c := pinChildOf(s.cmd.Process.Pid, parent.Process.Pid); c != nil {
		c.release()
		t.Fatal("a process that is not the parent's child was pinned")
	}
}
