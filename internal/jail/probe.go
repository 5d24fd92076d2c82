package jail

// HostReport says which isolation layers this host offers.
type HostReport struct {
	UserNamespaces Check
	Namespaces     Check // pid, mount, network, ipc, uts, cgroup
	Seccomp        Check
	Landlock       Check
	Cgroups        Check
	Root           bool
	HostID         int // host uid the sandbox user maps to
}

// Check is one capability of the host.
type Check struct {
	OK     bool
	Detail string
}
