// Package testutil holds test helpers that import nothing of sandloop's,
// so that the tests of any package, the jail's own included, may use them.
// (Helpers that need the jail are in jail/jailtest.)
package testutil

import (
	"testing"
	"time"
)

// WaitFor calls try until it returns nil, and fails tb with try's last
// error if that has not happened within d. Between calls it sleeps a
// little longer each time (5 ms, doubling up to 50 ms). It must be called
// from the goroutine running the test, as tb.Fatal must.
func WaitFor(tb testing.TB, d time.Duration, try func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	pause := 5 * time.Millisecond
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("still waiting after %v: %v", d, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}
