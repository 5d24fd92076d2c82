package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/sandloop/sandloop/internal/jail"
)

// Inside a Kubernetes pod, doctor names the pod settings the jail needs
// (docs/kubernetes.md, deploy/helm/sandloop) instead of container flags:
// each failing layer is mapped to the setting that provides it, with the
// chart value where there is one.

// serviceAccountDir is where Kubernetes mounts a pod's service account
// (the chart's hosts have none: they are found by KUBERNETES_SERVICE_HOST).
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// inKubernetes says how this process knows it runs in a Kubernetes pod,
// or "" when it does not.
func inKubernetes() string {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return "KUBERNETES_SERVICE_HOST is set"
	}
	if exists(serviceAccountDir) {
		return "a service account is mounted"
	}
	return ""
}

// podFacts is what doctor found, as far as the pod's settings matter.
type podFacts struct {
	jail.Confinement
	Cgroups jail.Check // the cgroups layer
	// NamespacesRefused: new namespaces could not be made; JailFailed: a
	// sandbox could not be started.
	NamespacesRefused, JailFailed bool
}

// namedCheck is one line of doctor's report.
type namedCheck struct {
	name string
	jail.Check
	info bool // a note, neither ok nor a failure
}

// podChecks maps the facts to one line per pod setting: ok when it is
// set, FAIL when its absence stops the jail, warn when the jail works
// without it but the pod is weaker than it should be.
func podChecks(f podFacts) []namedCheck {
	masked := len(f.MaskedProc) > 0
	blocked := len(f.SeccompBlocked) > 0
	var out []namedCheck
	add := func(name string, c jail.Check) { out = append(out, namedCheck{name: name, Check: c}) }

	hostUsers := jail.Check{Detail: "the pod shares the node's user namespace (hostUsers is true or unset): root in this pod is root on the node",
		Fix: "set hostUsers: false in the pod spec (the chart's host Deployment does; Kubernetes >= 1.30 with user namespaces on the nodes)"}
	switch {
	case f.OwnUserNS:
		hostUsers = jail.Check{OK: true, Detail: "hostUsers: false: the pod has its own user namespace, root here is an unprivileged uid on the node"}
	case masked:
		// Kubernetes unmasks /proc only for pods with their own user
		// namespace, so without one the jail cannot mount a /proc.
		hostUsers.Detail += ", and Kubernetes allows procMount: Unmasked only with hostUsers: false"
	default:
		hostUsers.Fallback = true
		hostUsers.Detail += "; the jail starts, but an escape from it would be root on the node"
	}
	add("pod hostUsers", hostUsers)

	if masked {
		add("pod procMount", jail.Check{Detail: fmt.Sprintf("/proc has %d masked or read-only paths (%s): the kernel refuses each sandbox a fresh /proc", len(f.MaskedProc), abbreviate(f.MaskedProc, 3)),
			Fix: "set securityContext.procMount: Unmasked on the container (the chart's host Deployment does; it needs hostUsers: false)"})
	} else {
		add("pod procMount", jail.Check{OK: true, Detail: "procMount: Unmasked: /proc is not masked"})
	}

	if blocked {
		add("pod seccomp", jail.Check{Detail: "the pod's seccomp profile refuses " + strings.Join(f.SeccompBlocked, ", ") + ", which the jail needs (the runtime's default profile does)",
			Fix: "set securityContext.seccompProfile: {type: Localhost, localhostProfile: sandloop.json} (chart value host.seccompProfile) and copy deploy/seccomp/sandloop.json to /var/lib/kubelet/seccomp/sandloop.json on every node"})
	} else {
		add("pod seccomp", jail.Check{OK: true, Detail: "unshare, mount and setns are allowed (seccompProfile: Localhost sandloop.json, or none)"})
	}

	apparmorFix := "set securityContext.appArmorProfile: {type: Localhost, localhostProfile: sandloop} (chart value host.appArmorProfile) and load deploy/apparmor/sandloop on every node (apparmor_parser -r)"
	switch p := f.AppArmor; {
	case p == "":
		out = append(out, namedCheck{name: "pod AppArmor", Check: jail.Check{Detail: "not in this kernel: nothing to set"}, info: true})
	case strings.Contains(p, "sandloop"):
		add("pod AppArmor", jail.Check{OK: true, Detail: "confined by " + p})
	case (f.NamespacesRefused || f.JailFailed) && !blocked && !masked:
		// Nothing else explains the refusal: the runtime's default
		// profile (cri-containerd.apparmor.d, crio-default) denies mount.
		add("pod AppArmor", jail.Check{Detail: "confined by " + p + ", which refuses the jail's namespaces or mounts", Fix: apparmorFix})
	case p == "unconfined":
		add("pod AppArmor", jail.Check{OK: true, Detail: "unconfined"})
	default:
		add("pod AppArmor", jail.Check{OK: true, Detail: "confined by " + p + ", which lets the jail start"})
	}

	switch {
	case f.Cgroups.OK:
		add("pod cgroups", jail.Check{OK: true, Detail: "writable: " + f.Cgroups.Detail})
	default:
		add("pod cgroups", jail.Check{Fallback: true, Detail: "the runtime mounts the pod's cgroups read-only, so sessions' limits are rlimits (no CPU limit); the pod's memory limit still bounds the whole host",
			Fix: "no pod field makes them writable: on cgroup v2 nodes set cgroup_writable = true on containerd's runtime handler (containerd >= 2.1), or on CRI-O allow and set the pod annotation io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw: \"true\""})
	}
	return out
}

// abbreviate joins the first n of list and says how many more there are.
func abbreviate(list []string, n int) string {
	if len(list) <= n {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:n], ", "), len(list)-n)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
