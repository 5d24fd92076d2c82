package tools

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/kernel"
)

// InstallInput is install_packages's arguments.
type InstallInput struct {
	Names []string `json:"names" jsonschema:"distribution names, e.g. [\"flask\", \"requests\"]"`
}

//go:embed install_packages.md
var installPackagesMD string

// sitePackages is where install_packages puts what pip installs: in the
// workspace, so it survives a kernel restart.
const sitePackages = "/workspace/.sandloop/site-packages"

var pipSpec = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!_-]+)?$`)

var installPackages = define(spec{
	name:        InstallPackages,
	description: installPackagesMD,
	annotations: sandboxHints("Install Python packages"),
}, func(ctx context.Context, c *call, in InstallInput) (*Result, error) {
	if len(in.Names) == 0 {
		return nil, argErr("names", `"names" must list at least one package`)
	}
	for _, n := range in.Names {
		if !pipSpec.MatchString(n) {
			return nil, argErr("names", "%q is not a package name", n)
		}
	}
	names, _ := json.Marshal(in.Names)
	var st struct {
		Present map[string]string `json:"present"`
		Missing []string          `json:"missing"`
	}
	code := fmt.Sprintf(`
import json, re, importlib.metadata as md
present, missing = {}, []
for spec in %s:
    name = re.split(r"[<>=!~\[]", spec)[0]
    try:
        present[spec] = md.version(name)
    except md.PackageNotFoundError:
        missing.append(spec)
print(json.dumps({"present": present, "missing": missing}))
`, names)
	if err := KernelCall(ctx, c.sess, code, c.cfg.DefaultTimeout, &st); err != nil {
		return nil, fmt.Errorf("could not check the installed packages: %w", err)
	}
	var b strings.Builder
	for _, n := range in.Names {
		if v, ok := st.Present[n]; ok {
			fmt.Fprintf(&b, "%s: already installed (version %s)\n", n, v)
		}
	}
	if len(st.Missing) == 0 {
		return textResult(strings.TrimRight(b.String(), "\n")), nil
	}
	cfg := c.cfg
	if !cfg.Network && !indexAllowed(cfg.Allow) && cfg.PackageIndex == "" && cfg.WheelDir == "" {
		why := "this sandbox has no network access and no package source is configured"
		if len(cfg.Allow) > 0 {
			why = "this sandbox may reach only " + strings.Join(cfg.Allow, ", ") + ", which does not include the package index (the pypi preset), and no package source is configured"
		}
		fmt.Fprintf(&b, "%s: NOT installed, and it cannot be: %s. "+
			"Do not retry. Use what is installed instead (the standard library, numpy, pandas, matplotlib, flask, requests, pytest and PIL are), "+
			"or write the needed code yourself.", strings.Join(st.Missing, ", "), why)
		return &Result{Text: b.String(), IsError: true}, nil
	}
	args := []string{"-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--target", sitePackages}
	if cfg.WheelDir != "" {
		args = append(args, "--no-index", "--find-links", cfg.WheelDir)
	} else if cfg.PackageIndex != "" {
		args = append(args, "--index-url", cfg.PackageIndex)
	}
	cmd := "python3"
	for _, x := range append(args, st.Missing...) {
		cmd += " " + ShellQuote(x)
	}
	sh, err := shellCode(cmd)
	if err != nil {
		return nil, err
	}
	res, err := c.sess.Execute(ctx, kernel.Request{Code: sh + "\nimport site; site.addsitedir(" + PyString(sitePackages) + ")", Timeout: cfg.MaxTimeout}, nil)
	if err != nil {
		return nil, err
	}
	if res.Status != kernel.StatusOK {
		fmt.Fprintf(&b, "pip could not install %s:\n%s", strings.Join(st.Missing, ", "), CutMiddle(res.Stdout+res.Stderr, cfg.MaxTextBytes))
		return &Result{Text: b.String(), IsError: true}, nil
	}
	fmt.Fprintf(&b, "installed %s into %s (on sys.path now; for scripts run with run_shell, set PYTHONPATH=%s)", strings.Join(st.Missing, ", "), sitePackages, sitePackages)
	return textResult(b.String()), nil
})

// indexAllowed reports whether the allowlist includes the Python package
// index's hosts (the pypi preset), so pip can install through the egress
// proxy.
func indexAllowed(allow []string) bool {
	if len(allow) == 0 {
		return false
	}
	for _, h := range egress.Presets["pypi"] {
		if !slices.Contains(allow, h) {
			return false
		}
	}
	return true
}
