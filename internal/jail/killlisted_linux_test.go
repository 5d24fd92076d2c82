package jail

import (
	"errors"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
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
