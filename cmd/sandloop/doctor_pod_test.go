package main

import (
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
)

// TestPodChecks covers the mapping from what doctor found to pod settings,
// including what TestDoctorInPod cannot produce on this kernel (AppArmor).
func TestPodChecks(t *testing.T) {
	ok := podFacts{Confinement: jail.Confinement{OwnUserNS: true, AppArmor: "unconfined"}, Cgroups: jail.Check{OK: true, Detail: "cgroup v2"}}
	with := func(f func(*podFacts)) podFacts { p := ok; f(&p); return p }
	for _, tc := range []struct {
		name  string
		facts podFacts
		line  string // the pod line to look at
		mark  string // "ok", "warn", "FAIL", "info"
		fix   string // a part of its fix
	}{
		{"own user namespace", ok, "pod hostUsers", "ok", ""},
		{"node's user namespace, jail works", with(func(p *podFacts) { p.OwnUserNS = false }), "pod hostUsers", "warn", "hostUsers: false"},
		{"node's user namespace, /proc masked", with(func(p *podFacts) { p.OwnUserNS, p.MaskedProc, p.JailFailed = false, []string{"/proc/kcore"}, true }), "pod hostUsers", "FAIL", "hostUsers: false"},
		{"masked /proc", with(func(p *podFacts) { p.MaskedProc, p.JailFailed = []string{"/proc/kcore"}, true }), "pod procMount", "FAIL", "procMount: Unmasked"},
		{"seccomp blocks unshare", with(func(p *podFacts) { p.SeccompBlocked, p.NamespacesRefused = []string{"unshare"}, true }), "pod seccomp", "FAIL", "host.seccompProfile"},
		{"runtime's AppArmor profile stops the jail", with(func(p *podFacts) { p.AppArmor, p.JailFailed = "cri-containerd.apparmor.d (enforce)", true }), "pod AppArmor", "FAIL", "chart value host.appArmorProfile"},
		{"runtime's AppArmor profile refuses namespaces", with(func(p *podFacts) { p.AppArmor, p.NamespacesRefused = "crio-default (enforce)", true }), "pod AppArmor", "FAIL", "apparmor_parser"},
		// Seccomp explains the failure: AppArmor is not blamed.
		{"AppArmor and seccomp", with(func(p *podFacts) {
			p.AppArmor, p.SeccompBlocked, p.JailFailed = "cri-containerd.apparmor.d (enforce)", []string{"mount"}, true
		}), "pod AppArmor", "ok", ""},
		{"sandloop's AppArmor profile", with(func(p *podFacts) { p.AppArmor = "sandloop (enforce)" }), "pod AppArmor", "ok", ""},
		{"no AppArmor", with(func(p *podFacts) { p.AppArmor = "" }), "pod AppArmor", "info", ""},
		{"read-only cgroups", with(func(p *podFacts) { p.Cgroups = jail.Check{Fallback: true} }), "pod cgroups", "warn", "cgroup_writable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := podChecks(tc.facts)
			if len(checks) != 5 {
				t.Fatalf("%d lines, want 5", len(checks))
			}
			for _, c := range checks {
				if c.name != tc.line {
					continue
				}
				mark := "FAIL"
				switch {
				case c.info:
					mark = "info"
				case c.OK:
					mark = "ok"
				case c.Fallback:
					mark = "warn"
				}
				if mark != tc.mark || !strings.Contains(c.Fix, tc.fix) || (mark == "ok" || mark == "info") != (c.Fix == "") {
					t.Errorf("%s: %s %q (fix %q), want %s with a fix naming %q", c.name, mark, c.Detail, c.Fix, tc.mark, tc.fix)
				}
				return
			}
			t.Fatalf("no line %q", tc.line)
		})
	}
}

func TestInKubernetes(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if exists(serviceAccountDir) {
		t.Skip("this test runs in a pod")
	}
	if got := inKubernetes(); got != "" {
		t.Errorf("outside a pod: %q", got)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	if got := inKubernetes(); got == "" {
		t.Error("KUBERNETES_SERVICE_HOST set: not seen as a pod")
	}
}
