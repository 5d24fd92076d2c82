//go:build !linux

package template

import (
	"context"
	"log/slog"

	"github.com/sandloop/sandloop/internal/jail"
)

// ImageBuildOptions say how an image template is built.
type ImageBuildOptions struct {
	Logger        *slog.Logger
	NoZygoteCheck bool
}

// BuildImage needs Linux (openat2, the jail).
func (s *Store) BuildImage(ctx context.Context, name string, spec ImageSpec, o *ImageBuildOptions) (*Template, error) {
	return nil, jail.ErrUnsupported
}
