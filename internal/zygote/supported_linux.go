package zygote

import (
	"fmt"

	"github.com/sandloop/sandloop/internal/jail"
)

// Supported returns nil if this host can run a zygote, or an error
// wrapping jail.ErrUnsupported that says what it lacks. It is cheap (no
// template is started): callers that made the zygote optional start
// sessions cold instead and say why; New fails with it at once rather
// than with every fork. Without root it needs a delegated cgroup; the
// template's user namespace is tried only when it starts.
func Supported() error {
	if err := jail.GroupsSupported(); err != nil {
		// RLIMIT_NPROC counts all forks of one template together: only a
		// cgroup bounds one session's processes.
		return fmt.Errorf("the zygote needs cgroups: %w", err)
	}
	return nil
}
