package jail

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// capLast is the highest capability number the kernel knows.
func capLast() int {
	var last int
	if _, err := fmt.Sscan(readFileString("/proc/sys/kernel/cap_last_cap"), &last); err != nil || last <= 0 {
		return 63
	}
	return last
}

// dropPrivileges empties the bounding, ambient, inheritable, permitted and
// effective capability sets and locks the securebits, so neither the init
// nor anything it starts can hold or regain a capability, even in the
// jail's own user namespace.
func dropPrivileges() error {
	for c := 0; c <= capLast(); c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// From linux/securebits.h: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off) and
	// NO_CAP_AMBIENT_RAISE, each with its lock bit.
	const (
		secNoRoot            = 1 << 0
		secNoRootLocked      = 1 << 1
		secNoSetuidFixup     = 1 << 2
		secNoSetuidFixupLock = 1 << 3
		secKeepCapsLocked    = 1 << 5
		secNoAmbientRaise    = 1 << 6
		secNoAmbientLocked   = 1 << 7
	)
	const secbits = secNoRoot | secNoRootLocked | secNoSetuidFixup | secNoSetuidFixupLock |
		secKeepCapsLocked | secNoAmbientRaise | secNoAmbientLocked
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbits, 0, 0, 0); err != nil {
		return fmt.Errorf("set securebits: %w", err)
	}
	// The init's memory and /proc entries stay out of the program's reach.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set not dumpable: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	// Every thread of the init, not only this one. AllThreadsSyscall is
	// unavailable in cgo binaries; then this thread (the one that forks the
	// program) is what matters.
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno == syscall.ENOTSUP {
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
	} else if errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	return nil
}
