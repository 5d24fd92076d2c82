package jail

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls are refused with EPERM: nothing a Python program needs,
// and each is a known way to attack the kernel, other processes or the
// jail itself.
var deniedSyscalls = []string{
	// Other processes' memory.
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
	// The mount tree and namespaces the jail built.
	"mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	// Kernel attack surface with a long CVE history.
	"bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// The machine itself.
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"open_by_handle_at", "name_to_handle_at", "syslog", "acct", "swapon", "swapoff", "reboot",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "quotactl", "lookup_dcookie",
	"iopl", "ioperm", "vhangup", "sethostname", "setdomainname", "uselib", "personality",
}

// namespaceFlags are the clone flags that create namespaces.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccompPolicy is the jail's filter: allow by default, refuse the list
// above, namespace-creating clone flags, clone3 (its flags are behind a
// pointer the filter cannot read; libc falls back to clone on ENOSYS),
// and socket families other than unix, inet, inet6 and netlink (route
// only). The ioctls it refuses (refusedIoctls) are checked ahead of it, by
// assembleSeccomp.
func seccompPolicy() seccomp.Policy {
	eperm := seccomp.ActionErrno | seccomp.Action(unix.EPERM)
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: eperm, Names: deniedSyscalls},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
			{Action: eperm, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: namespaceFlags}}},
			}},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.EAFNOSUPPORT), NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "socket", Conditions: seccomp.ArgumentConditions{
					{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_UNIX},
					{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_INET},
					{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_INET6},
					{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_NETLINK},
				}},
				// Netlink: only NETLINK_ROUTE, which lists the jail's own
				// network namespace's interfaces and addresses
				// (if_nameindex, getifaddrs, ip addr); changing them needs
				// CAP_NET_ADMIN, which the program does not have. Every
				// other protocol (audit, uevents, netfilter, xfrm, ...)
				// reaches the host's kernel state or a long CVE history.
				// (One group: the filter checks the rules of one system
				// call in one group only.)
				{Name: "socket", Conditions: seccomp.ArgumentConditions{
					{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_NETLINK},
					{Argument: 2, Operation: seccomp.NotEqual, Value: unix.NETLINK_ROUTE},
				}},
			}},
		},
	}
}

// loadSeccomp installs the filter on every thread of the init; the program
// inherits it across fork and exec. no_new_privs is set first.
func loadSeccomp() error {
	raw, err := assembleSeccomp()
	if err != nil {
		return err
	}
	filter := make([]syscall.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = syscall.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := syscall.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := seccomp.SetNoNewPrivs(); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("load seccomp filter: %w", errno)
	}
	return nil
}

// assembleSeccomp assembles the jail's filter, guarded against foreign ABIs.
func assembleSeccomp() ([]bpf.RawInstruction, error) {
	policy := seccompPolicy()
	prog, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	// The library lets syscalls of a foreign ABI (int 0x80 on x86_64)
	// through to the default action, which is allow: kill them instead.
	guard := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)},
	}
	guard = append(guard, ioctlFilter()...)
	raw, err := bpf.Assemble(append(guard, prog...))
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	return raw, nil
}

// refusedIoctls are the ioctls the filter refuses with EPERM: TIOCSTI and
// TIOCLINUX push input into a terminal, TIOCSETD would attach another line
// discipline (n_gsm, n_hdlc: a history of kernel CVEs) to a jail's own
// terminal (Config.Terminal).
var refusedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD}

// ioctlFilter refuses refusedIoctls, comparing the low 32 bits of the
// request only: the kernel reads it as an unsigned int, so a request with
// high bits set is the same ioctl to it, and a 64-bit comparison (the
// policy library's Equal) would let it through (CVE-2019-10063). It
// leaves other calls to the instructions after it.
func ioctlFilter() []bpf.Instruction {
	// seccomp_data: nr at 0, args[] at 16; the low half of args[1]
	// is its first word on a little-endian machine.
	lo := uint32(24)
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		lo = 28
	}
	n := len(refusedIoctls)
	out := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(unix.SYS_IOCTL), SkipTrue: uint8(n + 3)},
		bpf.LoadAbsolute{Off: lo, Size: 4},
	}
	for i, req := range refusedIoctls {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: req, SkipTrue: uint8(n - i)})
	}
	return append(out,
		bpf.Jump{Skip: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionErrno) | uint32(unix.EPERM)},
	)
}

// SeccompSupported reports whether the kernel can filter system calls.
func SeccompSupported() bool { return seccomp.Supported() }
