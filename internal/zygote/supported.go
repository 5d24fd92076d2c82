package zygote

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/sandloop/sandloop/internal/jail"
)

// Supported returns nil if this host can run a zygote, or an error saying
// what it lacks (callers that made the zygote optional start sessions cold
// instead, and say why).
func Supported() error {
	switch {
	case runtime.GOOS != "linux":
		return errors.New("the zygote needs Linux")
	case os.Geteuid() != 0:
		// Each fork is handed its workspace as a detached mount (open_tree).
		return errors.New("the zygote needs root")
	}
	if r := jail.Probe(); !r.Cgroups.OK {
		// Forks share one user namespace: only a cgroup bounds each one.
		return fmt.Errorf("the zygote needs cgroups (%s)", r.Cgroups.Detail)
	}
	return nil
}
