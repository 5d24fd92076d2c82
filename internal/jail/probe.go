package jail

// HostReport says which isolation layers this host offers.
type HostReport struct {
	UserNamespaces Check
	Namespaces     Check // pid, mount, network, ipc, uts, cgroup
	Seccomp        Check
	Landlock       Check
	Cgroups        Check
	// Pause is how a paused session is stopped (FreezeMethod).
	Pause     Check
	Root      bool
	HostID    int    // host uid the sandbox user maps to
	Container string // the container runtime this runs in ("podman", "docker", "container"), or ""
}

// Check is one capability of the host.
type Check struct {
	OK bool
	// Fallback reports that the layer is missing but a documented weaker
	// one stands in (cgroups: rlimits): a warning, not a failure.
	Fallback bool
	Detail   string
	// Fix is the exact step that provides the missing layer, or "".
	Fix string
}

// Confinement is how the runtime around this process confines it, in the
// terms of the settings that change it (for doctor inside a container or
// pod).
type Confinement struct {
	// OwnUserNS reports that this process runs in a user namespace of its
	// own (not the host's identity mapping): root here is not root there.
	OwnUserNS bool
	// MaskedProc lists the paths under /proc the runtime over-mounted
	// (masked or made read-only); while any exist the kernel refuses a
	// sandbox a fresh procfs.
	MaskedProc []string
	// SeccompBlocked lists the jail's system calls that the seccomp
	// filter this process runs under refuses (unshare, mount, setns).
	SeccompBlocked []string
	// AppArmor is the AppArmor profile confining this process
	// ("unconfined" when none), or "" when the kernel has no AppArmor.
	AppArmor string
}
