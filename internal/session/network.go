package session

import (
	"errors"

	"github.com/sandloop/sandloop/internal/egress"
)

// ErrNoEgress: the session has no egress proxy whose allowlist could be
// changed (it was started with loopback only, or with the host's network).
var ErrNoEgress = errors.New("the session has no egress allowlist")

// SetAllowlist replaces the allowlist of a session started with an egress
// proxy (Options.Egress, or armed), while it runs: its kernel's next
// connections are judged by al (nil allows nothing), connections under way
// that al no longer allows are cut (see egress.Gate.SetAllow). The proxy's
// variables are in the kernel's environment from its start, so a running
// kernel needs nothing new. A session without a proxy gets ErrNoEgress:
// one cannot be armed live, as its kernel's jail has no listener for it.
func (s *Session) SetAllowlist(al *egress.Allowlist) error {
	if s.gate == nil {
		return ErrNoEgress
	}
	s.gate.SetAllow(al)
	return nil
}

// Allowlist returns the allowlist in force, or nil if the session has no
// egress proxy.
func (s *Session) Allowlist() *egress.Allowlist {
	if s.gate == nil {
		return nil
	}
	return s.gate.Allowlist()
}
