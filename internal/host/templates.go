package host

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/template"
)

// openTemplates opens the templates' store and pool (none where the host
// has no directory for them) and warms Config.WarmTemplates.
func (h *Host) openTemplates(ctx context.Context) error {
	dir := h.cfg.TemplatesDir
	if dir == "" && h.cfg.DataDir != "" {
		dir = filepath.Join(h.cfg.DataDir, "templates")
	}
	if dir == "" {
		if len(h.cfg.WarmTemplates) > 0 {
			return &ArgumentError{"warm-templates", errNoTemplatesDir}
		}
		if h.cfg.DefaultTemplate != "" {
			return &ArgumentError{"default-template", errNoTemplatesDir}
		}
		return nil
	}
	st, err := template.Open(dir)
	if err != nil {
		return &ArgumentError{"templates-dir", err}
	}
	maxWarm := h.cfg.MaxWarmTemplates
	if h.cfg.Zygote == "" || h.cfg.Zygote == "off" || h.zy == nil {
		maxWarm = -1 // no zygotes: template sessions start cold too
	}
	warm := h.cfg.WarmTemplates
	if d := h.cfg.DefaultTemplate; d != "" {
		if _, err := st.Get(d); err != nil {
			return &ArgumentError{"default-template", fmt.Errorf("%w (sandloop template ls lists them)", err)}
		}
		if !slices.Contains(warm, d) {
			warm = append([]string{d}, warm...)
		}
	}
	h.tmpl = template.NewPool(st, &template.PoolOptions{MaxWarm: maxWarm, Logger: h.log})
	if len(warm) > 0 {
		if maxWarm < 0 {
			h.log.Warn("--warm-templates: no zygotes on this host (or --zygote off): template sessions start cold")
		} else if err := h.tmpl.Warm(ctx, warm); err != nil {
			h.tmpl.Close()
			h.tmpl = nil
			return &ArgumentError{"warm-templates", err}
		}
	}
	return nil
}

type constError string

func (e constError) Error() string { return string(e) }

const errNoTemplatesDir = constError("no templates directory: give --templates-dir or --data-dir")

// templateBuilder builds templates for E2B's template API: through the
// server's default allowlist where it has one (serve --network allow
// --allow ...), else PyPI through the wheel cache; never to the server's
// own addresses.
func (h *Host) templateBuilder(eg server.EgressOptions) func(ctx context.Context, name string, spec template.Spec) (*template.Template, error) {
	pol := eg.DefaultPolicy()
	if pol == nil {
		al, err := egress.ParseAllowlist([]string{"pypi"})
		if err != nil {
			panic(err) // a preset
		}
		p := eg.Policy
		p.Allow = al
		pol = &p
	}
	return func(ctx context.Context, name string, spec template.Spec) (*template.Template, error) {
		return h.tmpl.Store().Build(ctx, name, spec, &template.BuildOptions{Egress: pol, Cache: h.cfg.WheelCache, Logger: h.log})
	}
}
