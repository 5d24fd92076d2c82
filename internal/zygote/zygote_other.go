//go:build !linux

package zygote

import (
	"context"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// Zygote forks kernels (never, on this system).
type Zygote struct{}

// New fails: the zygote needs Linux namespaces.
func New(context.Context, *Options) (*Zygote, error) { return nil, jail.ErrUnsupported }

// Launcher returns a launcher that fails.
func (*Zygote) Launcher(string, jail.Limits, []string, int) kernel.Launcher {
	return func(context.Context, kernel.Files) (kernel.Process, error) { return nil, jail.ErrUnsupported }
}

// Pid is 0.
func (*Zygote) Pid() int { return 0 }

// SparesReady is 0.
func (*Zygote) SparesReady() int { return 0 }

// Close does nothing.
func (*Zygote) Close() error { return nil }

// Supported fails: the zygote needs Linux namespaces.
func Supported() error { return jail.ErrUnsupported }

// ReaperInfo is empty: no zygote here.
func ReaperInfo() string { return "" }
