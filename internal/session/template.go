package session

import (
	"cmp"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// Templates resolves the template a session asks for (package template's
// Pool): its environment, mounted read-only, and the zygote that forks
// its kernels.
type Templates interface {
	// Use returns what a session of the template named needs, marking
	// the template in use until TemplateUse.Release. An unknown name is
	// an error the caller can tell apart (template.ErrNotFound).
	Use(ctx context.Context, name string) (*TemplateUse, error)
}

// TemplateUse is one session's use of a template.
type TemplateUse struct {
	// Name is the template's name.
	Name string
	// Python is the kernel's interpreter (the template's environment's).
	Python string
	// Mounts are bound into the kernel's jail (read-only).
	Mounts []jail.Mount
	// Env is the kernel's environment on top of KernelEnv's, before the
	// session's own variables.
	Env []string
	// Limits are the template's default limits (zero fields: the
	// server's).
	Limits jail.Limits
	// Zygote forks the template's kernels; nil: they start cold.
	Zygote Zygote
	// PythonVersion and Packages describe the environment (what a model
	// is told it has: Session.Environment).
	PythonVersion string
	Packages      []Package
	// Seed, if set, is what every session of the template starts with
	// (a template built from a snapshot): files and variables.
	Seed *TemplateSeed
	// Release ends the use; Session.Close calls it. Safe to call twice.
	Release func()
}

// TemplateSeed is the workspace and the variables a template built from a
// snapshot gives each of its sessions before it is handed out.
type TemplateSeed struct {
	// Files is a read-only tree on the host, copied into the session's
	// workspace (a writable copy of its own).
	Files string
	// State, if set, is the variables: a sealed kernel.NewStateFile that
	// every session's kernel maps copy-on-write (kernel.ImportStateFile),
	// so they share its pages. It stays the Templates' (never closed by
	// a session).
	State *os.File
	// Variables are the names State holds.
	Variables []string
	// NotSaved are the variables the snapshot could not carry
	// ("name: reason").
	NotSaved []string
}

// Package is a distribution a template installed.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Environment is what a session's Python has, as a model is told it.
type Environment struct {
	// Python is the interpreter's version ("3.11.2").
	Python string
	// Template is the session's template ("" for none) and Packages the
	// distributions it installed (the system's are visible too).
	Template string
	Packages []Package
}

// Environment describes the session's Python: its version and its
// template's packages.
func (s *Session) Environment() Environment {
	if u := s.opts.Template; u != nil {
		return Environment{Python: cmp.Or(u.PythonVersion, SystemPythonVersion()), Template: u.Name, Packages: u.Packages}
	}
	return Environment{Python: SystemPythonVersion()}
}

// TemplateJail is what another process of the session (an E2B command)
// needs to see its template as the kernel does: the mounts, and the
// environment to add after KernelEnv's. Both nil without a template.
func (s *Session) TemplateJail() (mounts []jail.Mount, env []string) {
	if u := s.opts.Template; u != nil {
		return u.Mounts, u.Env
	}
	return nil, nil
}

var systemPython struct {
	once    sync.Once
	version string
}

// SystemPythonVersion is the version of the sandboxes' own Python (the
// host's jail.DefaultPython, which sandboxes see read-only), or "3" where
// it cannot be run.
func SystemPythonVersion() string {
	systemPython.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, jail.DefaultPython, "-c", "import sys; print(sys.version.split()[0])").Output()
		systemPython.version = strings.TrimSpace(string(out))
		if err != nil || systemPython.version == "" {
			systemPython.version = "3"
		}
	})
	return systemPython.version
}

func (u *TemplateUse) python() string {
	if u == nil {
		return jail.DefaultPython
	}
	return cmp.Or(u.Python, jail.DefaultPython)
}

func (u *TemplateUse) mounts() []jail.Mount {
	if u == nil {
		return nil
	}
	return u.Mounts
}

func (u *TemplateUse) release() {
	if u != nil && u.Release != nil {
		u.Release()
	}
}

// withTemplateDefaults fills the zero fields of a session's requested
// limits from its template's.
func withTemplateDefaults(req jail.Limits, u *TemplateUse) jail.Limits {
	if u == nil {
		return req
	}
	t := u.Limits
	req.Memory, req.CPUs, req.Pids = cmp.Or(req.Memory, t.Memory), cmp.Or(req.CPUs, t.CPUs), cmp.Or(req.Pids, t.Pids)
	req.TmpSize, req.FileSize = cmp.Or(req.TmpSize, t.TmpSize), cmp.Or(req.FileSize, t.FileSize)
	req.NoFile, req.Stack = cmp.Or(req.NoFile, t.NoFile), cmp.Or(req.Stack, t.Stack)
	req.Disk, req.Files = cmp.Or(req.Disk, t.Disk), cmp.Or(req.Files, t.Files)
	return req
}

// useTemplate resolves opts.Template (nil for none).
func (m *Manager) useTemplate(ctx context.Context, name string) (*TemplateUse, error) {
	if name == "" {
		return nil, nil
	}
	if m.opts.Templates == nil {
		return nil, ErrNoTemplates
	}
	return m.opts.Templates.Use(ctx, name)
}

// templateName is the session's template's name ("" for none).
func (s *Session) templateName() string {
	if u := s.opts.Template; u != nil {
		return u.Name
	}
	return ""
}
