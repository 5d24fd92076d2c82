package workspace

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// asIDs runs fn on a thread whose filesystem uid and gid are uid and gid
// (they are per thread), then gives the thread back its own. A thread
// whose ids cannot be restored is never used again (it ends with this
// goroutine).
func asIDs(uid, gid int, fn func() error) error {
	runtime.LockOSThread()
	unix.Setfsgid(gid)
	unix.Setfsuid(uid)
	err := fn()
	unix.Setfsuid(os.Geteuid())
	unix.Setfsgid(os.Getegid())
	if u, _ := unix.SetfsuidRetUid(-1); u != os.Geteuid() {
		return err // locked: the thread goes with the goroutine
	}
	if g, _ := unix.SetfsgidRetGid(-1); g != os.Getegid() {
		return err
	}
	runtime.UnlockOSThread()
	return err
}
