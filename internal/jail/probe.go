package jail

// HostReport says which isolation layers this host offers.
type HostReport struct {
	UserNamespaces Check
	Namespaces     Check // pid, mount, network, ipc, uts, cgroup
	Seccomp        Check
	Landlock       Check
	Cgroups        Check
	Root           bool
	HostID         int    // host uid the sandbox user maps to
	Container      string // the container runtime this runs in ("podman", "docker", "container"), or ""
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
