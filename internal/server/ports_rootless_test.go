package server

import (
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session/sessiontest"
)

// TestPortsRootless runs the port tests as an unprivileged user: a server
// that is not root cannot enter its jails' network namespaces from its
// own threads, and reaches their ports through a helper that joins the
// jail's user namespace first (jail.DialLoopback).
func TestPortsRootless(t *testing.T) {
	names := []string{"TestPortsReachAnAppInTheSandbox", "TestPublicPortsNeedNoToken"}
	out := sessiontest.AsNobody(t, "SANDLOOP_PORTS_ROOTLESS", "^("+strings.Join(names, "|")+")$")
	for _, name := range names {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass rootless:\n%s", name, out)
		}
	}
}
