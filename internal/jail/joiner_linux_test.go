package jail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// prepared makes a Joiner of p's jail.
func prepared(t *testing.T, p *Process) *Joiner {
	t.Helper()
	target, err := p.JoinTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close() // the Joiner needs nothing more of it
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := PrepareJoin(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// procField is a field of /proc/pid/status ("" if the process is gone).
func procField(pid int, name string) string {
	for _, l := range strings.Split(readFileString(fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// gone waits until no process has one of pids' numbers (a zombie counts).
func gone(t *testing.T, pids ...int) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, func() error {
		for _, pid := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return fmt.Errorf("process %d is still there: %s", pid, procField(pid, "State"))
			}
		}
		return nil
	})
}

// A prepared join waits confined as the jail's programs are, and the
// command it is given runs in that very process, inside the jail.
func TestJoinerRunsTheCommandInThePreparedProcess(t *testing.T) {
	a := liveJail(t, "warm", Limits{})
	testutil.WaitFor(t, 60*time.Second, func() error {
		_, err := os.Stat(fmt.Sprintf("/proc/%d/root/tmp/kernel", a.Pid()))
		return err
	})
	w := prepared(t, a)
	pid, script := w.Pid(), w.ScriptPid()
	if pid == 0 || script == 0 {
		t.Fatalf("pids %d and %d", pid, script)
	}
	// Waiting, it holds no capability, and is under the jail's filter.
	for field, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
		if got := procField(pid, field); got != want {
			t.Errorf("the waiting joiner's %s is %q, want %q", field, got, want)
		}
	}
	// What it costs while it waits (a figure for the package doc).
	for _, pid := range []int{pid, script} {
		var mem []string
		for _, l := range strings.Split(readFileString(fmt.Sprintf("/proc/%d/smaps_rollup", pid)), "\n") {
			if f := strings.Fields(l); len(f) == 3 && (f[0] == "Rss:" || f[0] == "Pss:" || f[0] == "Private_Dirty:") {
				mem = append(mem, f[0]+" "+f[1]+" kB")
			}
		}
		t.Logf("waiting process %d: %s, %s threads", pid, strings.Join(mem, ", "), procField(pid, "Threads"))
	}
	var out, errb bytes.Buffer
	p, err := w.Start(context.Background(), &Config{Path: "/bin/sh",
		Args:  []string{"sh", "-c", `cat /tmp/kernel; echo " $(pwd)"; echo oops >&2; cat; exec sleep 1003`},
		Stdin: strings.NewReader("typed"), Stdout: &out, Stderr: &errb, Dir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		if cmd := readFileString(fmt.Sprintf("/proc/%d/cmdline", pid)); cmd != "sleep\x001003\x00" {
			return fmt.Errorf("the prepared process runs %q", cmd)
		}
		return nil
	})
	p.Kill()
	r, err := p.Wait()
	if err != nil || r.Signal != "SIGKILL" {
		t.Fatalf("killed: %+v %v", r, err)
	}
	if out.String() != "warm /tmp\ntyped" || errb.String() != "oops\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
	if _, err := w.Start(context.Background(), &Config{Path: "/bin/true"}); !errors.Is(err, ErrJoinerUsed) {
		t.Errorf("a second start: %v, want ErrJoinerUsed", err)
	}
	gone(t, pid, script)
	select {
	case <-a.Done():
		t.Fatal("the joined command's end ended its jail")
	default:
	}
}

// A Joiner closed unused leaves no process; one whose jail ends dies with
// it, and its Start then fails.
func TestJoinerEndsWithoutACommand(t *testing.T) {
	a := liveJail(t, "warm", Limits{})
	unused := prepared(t, a)
	pids := []int{unused.Pid(), unused.ScriptPid()}
	unused.Close()
	// Reaped by the script before it ended, which Close waited for: not
	// left a zombie of the host's init, which the jail's end would wait
	// for.
	if st := procField(pids[0], "State"); st != "" {
		t.Errorf("the closed joiner's init is still there: %s", st)
	}
	gone(t, pids...)
	if _, err := unused.Start(context.Background(), &Config{Path: "/bin/true"}); !errors.Is(err, ErrJoinerUsed) {
		t.Errorf("start after close: %v, want ErrJoinerUsed", err)
	}

	w := prepared(t, a)
	pids = []int{w.Pid(), w.ScriptPid()}
	a.Kill()
	a.Wait()
	gone(t, pids...)
	if p, err := w.Start(context.Background(), &Config{Path: "/bin/true"}); err == nil {
		p.Wait()
		t.Fatal("a joiner of an ended jail started a command")
	}
	if _, err := w.Start(context.Background(), &Config{Path: "/bin/true", Terminal: &WindowSize{Cols: 80, Rows: 24}}); err == nil {
		t.Error("a terminal was accepted")
	}
}

// A Joiner's watch (which reaps a Joiner whose jail ended unused) leaves
// alone a join that Start took, even when it first runs once the program
// has ended too (under load, it may): the command's end is reported as it
// was. (Released there, the join's status pipe was closed under the
// Process's wait: 137, SIGKILL, for a command that exited 0, its output
// complete: the rare burst command of docs/benchmarks.md.)
func TestJoinerWatchLeavesAStartedJoin(t *testing.T) {
	a := liveJail(t, "watch", Limits{})
	var watches []func()
	saved := watchJoiner
	watchJoiner = func(w *Joiner, j *joining) { watches = append(watches, func() { w.watch(j) }) }
	t.Cleanup(func() { watchJoiner = saved })
	// Both of watch's cases are ready: select takes either at random.
	for i := range 12 {
		w := prepared(t, a)
		watch := watches[len(watches)-1]
		j := w.j
		var out bytes.Buffer
		p, err := w.Start(context.Background(), &Config{Path: "/bin/echo", Args: []string{"echo", "done"}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		<-j.outs[0].done // the program has ended
		watch()
		r, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 || r.Signal != "" || r.Unreported || out.String() != "done\n" {
			t.Fatalf("command %d: %+v, output %q, want exit code 0", i, r, out.String())
		}
	}
	// An unused Joiner whose jail ended is still reaped by its watch.
	b := liveJail(t, "watch-unused", Limits{})
	w := prepared(t, b)
	watch := watches[len(watches)-1]
	pids := []int{w.Pid(), w.ScriptPid()}
	b.Kill()
	b.Wait()
	watch()
	if w.take() != nil {
		t.Error("the unused Joiner of a jail that ended was not released")
	}
	gone(t, pids...)
}
