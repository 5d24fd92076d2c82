package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// becomeSubreaper makes orphaned descendants this process's children
// instead of init's, so a sandbox process that escaped its jail's kill
// is still found among our descendants.
func becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	return nil
}

// reapZombies collects exited children nobody waits for (escaped
// processes that died after being counted).
func reapZombies() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err != nil || pid <= 0 {
			return
		}
	}
}
