// Package template keeps sessions' environments: a template is a Python
// virtual environment (on the sandbox's own /usr/bin/python3, with the
// system's packages visible) built once in a sandbox, frozen read-only,
// stored content-addressed and mounted read-only at EnvDir in every
// session that uses it, with its own zygote (Pool) importing its preloads.
//
// An image template is an OCI image's root file system instead
// (Store.BuildImage): read with go-containerregistry, every digest
// checked, its layers unpacked (whiteouts applied) into the same
// read-only, content-addressed storage by an unpacker that resolves every
// path inside the tree and refuses or neutralises what an image may not
// bring (unpack_linux.go). Its sessions run with that tree as their
// system root (jail.Mount.Root) and the image's own Python; the jail's
// layers are the same as for any session.
package template

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// EnvDir is where a template's tree is in a sandbox (and where it was
// built: a virtual environment's scripts name their own path).
const EnvDir = "/opt/sandloop/env"

// Python is the interpreter of a session of a template: the environment's
// own, a link to the sandbox's /usr/bin/python3 that makes the
// environment sys.prefix.
const Python = EnvDir + "/bin/python3"

// Errors callers may branch on.
var (
	// ErrNotFound: no template of that name.
	ErrNotFound = errors.New("template not found")
)

// InUseError is a removal refused because sessions use the template.
type InUseError struct {
	Name     string
	Sessions int
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("template %s is used by %d session(s): close them first", e.Name, e.Sessions)
}

// ArgumentError is a bad template name or build specification.
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return "invalid " + e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// BuildError is a build that failed because of what was asked (a package
// pip cannot find or install, a preload that does not import): Output is
// the end of what the build printed.
type BuildError struct {
	Step   string
	Output string
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("template build failed (%s):\n%s", e.Step, strings.TrimSpace(e.Output))
}

// Spec is what a template is built from.
type Spec struct {
	// Requirements is the text of a pip requirements file.
	Requirements string
	// Pip are requirement specifiers (`pandas==2.2`, `./x.whl` is not
	// allowed: nothing of the host reaches the build).
	Pip []string
	// Preload are the modules the template's zygote imports (each
	// must import at build time). If nil, the zygote's defaults.
	Preload []string
	// Env is added to the environment of the template's sessions.
	Env map[string]string
	// Limits are the default limits of its sessions (zero fields: the
	// server's defaults). Stored only; see Manifest.
	Limits jail.Limits
	// AsIs allows a template with nothing to install: the sandbox's own
	// environment under a name, with Env and Preload (E2B's builds of
	// Debian packages the sandbox has already). Otherwise a build without
	// requirements or packages is refused.
	AsIs bool
}

// Package is one distribution installed in a template.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Kinds of template (Manifest.Kind).
const (
	KindVenv  = "" // a virtual environment at EnvDir
	KindImage = "image"
)

// Manifest describes a built template.
type Manifest struct {
	Name string `json:"name"`
	// Kind is KindVenv (empty) or KindImage.
	Kind string `json:"kind,omitempty"`
	// Image is where an image template came from, and ImageDigest its
	// manifest's digest (empty for a docker save tarball, whose
	// manifest.json has none: its layers are checked against the
	// configuration's diff_ids).
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Interpreter is the kernel's Python in the sandbox (image templates;
	// a virtual environment's is Python).
	Interpreter string `json:"interpreter,omitempty"`
	// Neutralised says what unpacking the image changed (set-id bits
	// dropped, device nodes not made, links made absolute).
	Neutralised []string `json:"neutralised,omitempty"`
	// ColdStart, if set, is why the template's sessions start cold: its
	// Python could not run a zygote when it was built.
	ColdStart string `json:"cold_start,omitempty"`
	// ID is the sha256 of the tree (paths, modes, link targets and
	// contents): templates with the same tree share it.
	ID       string            `json:"id"`
	Python   string            `json:"python"`
	Packages []Package         `json:"packages"`
	Preload  []string          `json:"preload,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Limits   jail.Limits       `json:"limits"`
	Size     int64             `json:"size"`
	Files    int               `json:"files"`
	Created  time.Time         `json:"created"`
	// Snapshot, if set, is the snapshot the template was built from
	// (BuildFromSnapshot): the files and variables each of its sessions
	// starts with.
	Snapshot *FromSnapshot `json:"snapshot,omitempty"`
}

// Template is a stored template.
type Template struct {
	Manifest
	// Dir is its tree on the host (read-only, owned by root).
	Dir string
}

// Mount is how a sandbox sees the template: at EnvDir, or as the
// sandbox's system root (an image). A KindSnapshot template has no
// environment to mount: see Mounts.
func (t *Template) Mount() jail.Mount {
	if t.Kind == KindImage {
		return jail.Mount{Host: t.Dir, Path: "/", Root: true}
	}
	return jail.Mount{Host: t.Dir, Path: EnvDir}
}

// Mounts are the template's mounts in a sandbox (none for KindSnapshot).
func (t *Template) Mounts() []jail.Mount {
	if t.Kind == KindSnapshot {
		return nil
	}
	return []jail.Mount{t.Mount()}
}

// PythonPath is the interpreter of the template's kernels.
func (t *Template) PythonPath() string {
	if t.Kind == KindSnapshot {
		return jail.DefaultPython
	}
	if t.Kind == KindImage {
		return t.Interpreter
	}
	return Python
}

// Modules are what the template's zygote imports (an image's: its
// preloads only, never the host's default numpy and pandas).
func (t *Template) Modules() []string {
	if t.Kind == KindImage && t.Preload == nil {
		return []string{}
	}
	return t.Preload
}

// imagePath is an image template's PATH unless its image sets one.
const imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" + jail.ToolsDir

// SessionEnv is the environment a session of the template gets on top of
// the kernel's: the environment's bin first on PATH, VIRTUAL_ENV (or an
// image's PATH), and the template's own variables in key order.
func (t *Template) SessionEnv() []string {
	env := []string{"PATH=" + EnvDir + "/bin:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV=" + EnvDir}
	switch t.Kind {
	case KindImage:
		env = []string{"PATH=" + imagePath}
	case KindSnapshot:
		env = nil
	}
	keys := make([]string, 0, len(t.Env))
	for k := range t.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+t.Env[k])
	}
	return env
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName reports a name that cannot be a template's.
func ValidName(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return &ArgumentError{"template name", fmt.Errorf("%q: use 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", name)}
	}
	return nil
}

var moduleRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

func (s *Spec) validate() error {
	if strings.TrimSpace(s.Requirements) == "" && len(s.Pip) == 0 && !s.AsIs {
		return &ArgumentError{"build", errors.New("nothing to install: give a requirements file or packages")}
	}
	for _, p := range s.Pip {
		if p == "" || strings.HasPrefix(p, "-") || strings.ContainsAny(p, "\n\r") {
			return &ArgumentError{"package", fmt.Errorf("%q is not a requirement specifier (pip options go in the requirements file)", p)}
		}
	}
	for _, line := range strings.Split(s.Requirements, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "-e" || f[0] == "--editable" || strings.HasPrefix(f[0], "--editable=")) {
			return &ArgumentError{"requirements", errors.New("editable installs (-e) cannot go into a read-only template")}
		}
	}
	for _, m := range s.Preload {
		if !moduleRE.MatchString(m) {
			return &ArgumentError{"preload", fmt.Errorf("%q is not a module name", m)}
		}
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &ArgumentError{"env", fmt.Errorf("%q is not a variable name", k)}
		}
	}
	return nil
}
