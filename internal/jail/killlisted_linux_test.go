package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// killListed kills what the list names at both readings, and spares a
// process listed only at the first: one that left the group (or ended and
// gave its number away) between the two.
func TestKillListedOnlyWhatIsStillListed(t *testing.T) {
	start := func() *exec.Cmd {
		c := exec.Command("sleep", "1004.5")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	a, b := start(), start()
	reads := 0
	killListed(func() string {
		reads++
		if reads == 1 {
			return strconv.Itoa(a.Process.Pid) + "\n" + strconv.Itoa(b.Process.Pid) + "\n"
		}
		return strconv.Itoa(a.Process.Pid) + "\n"
	})
	if reads != 2 {
		t.Fatalf("the list was read %d times, want 2 (once to pin each process, once to check)", reads)
	}
	done := make(chan error, 1)
	go func() { done <- a.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the process listed twice ended with %v, want SIGKILL", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the process listed twice was not killed")
	}
	if err := b.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the process listed only at the first reading was killed: %v", err)
	}
}

// A join kills its child through a pidfd taken when the child's PID was
// reported, and only if the process with that number then was the
// script's child: a number already another process's is never pinned,
// and killChild leaves that process alone.
func TestJoinPinsOnlyTheScriptsChild(t *testing.T) {
	script := exec.Command("/bin/sh", "-c", "sleep $N & wait")
	script.Env = append(os.Environ(), "N=1005.5") // not in the script's own arguments
	if err := script.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { script.Process.Kill(); script.Wait() })
	var kid int
	testutil.WaitFor(t, 30*time.Second, func() error {
		for _, pid := range testutil.PidsWithArg("1005.5") {
			if parentOf(pid) == script.Process.Pid {
				kid = pid
				return nil
			}
		}
		return fmt.Errorf("the script's sleep has not started")
	})
	t.Cleanup(func() { syscall.Kill(kid, syscall.SIGKILL) })
	stranger := exec.Command("sleep", "1006.5")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })

	j := &joining{cmd: script}
	j.joinPid = stranger.Process.Pid
	j.pinChild(stranger.Process.Pid)
	if j.child != nil {
		t.Fatal("a process that is not the script's child was pinned")
	}
	j.killChild()
	if err := stranger.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("killChild killed a stranger: %v", err)
	}

	j = &joining{cmd: script}
	j.joinPid = kid
	j.pinChild(kid)
	if j.child == nil {
		t.Fatal("the script's child was not pinned")
	}
	j.killChild()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if parentOf(kid) == script.Process.Pid {
			return fmt.Errorf("the script's child still runs")
		}
		return nil
	})
	j.unpinChild()
	if j.child != nil {
		t.Error("the pidfd is still held after unpinChild")
	}
}
