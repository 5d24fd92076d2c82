package zygote

import (
	"fmt"
	"os"

	"github.com/sandloop/sandloop/internal/jail"
)

// Supported returns nil if this host can run a zygote, or an error
// wrapping jail.ErrUnsupported that says what it lacks. It is cheap (no
// template is started): callers that made the zygote optional start
// sessions cold instead and say why; New fails with it at once rather
// than with every fork.
func Supported() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: the zygote needs root (a forked session's workspace is a clone of its mount, which only root may make)", jail.ErrUnsupported)
	}
	if err := jail.GroupsSupported(); err != nil {
		// RLIMIT_NPROC counts all forks of one template together: only a
		// cgroup bounds one session's processes.
		return fmt.Errorf("the zygote needs cgroups: %w", err)
	}
	return nil
}
