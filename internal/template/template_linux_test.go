package template_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	code := m.Run()
	for _, d := range tempDirs {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// runIn runs code with the template's Python (or the sandbox's, t nil)
// in a fresh jail.
func runIn(t *testing.T, tm *template.Template, code string) (string, int) {
	t.Helper()
	ws, err := os.MkdirTemp("", "sandloop-test-ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	var out bytes.Buffer
	cfg := &jail.Config{Path: jail.DefaultPython, Args: []string{"python3", "-c", code}, Workspace: ws, Stdout: &out, Stderr: &out, Limits: jail.Limits{Timeout: time.Minute}}
	if tm != nil {
		cfg.Path, cfg.Env, cfg.Mounts = tm.PythonPath(), tm.SessionEnv(), []jail.Mount{tm.Mount()}
	}
	res, err := jail.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), res.ExitCode
}

func TestBuildFromRequirements(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-demo", "from the template")
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := st.Build(context.Background(), "demo", template.Spec{Requirements: "# ours\nsandloop-tmpl-demo==1.0\n", Preload: []string{"sandloop_tmpl_demo", "numpy"}, Env: map[string]string{"DEMO": "1"}}, ix.BuildOptions())
	if err != nil {
		t.Fatal(err)
	}
	if tm.Python != "3.11.2" && !strings.HasPrefix(tm.Python, "3.11") || len(tm.Packages) != 1 || tm.Packages[0] != (template.Package{Name: "sandloop-tmpl-demo", Version: "1.0"}) || tm.Size == 0 || len(tm.ID) != 64 {
		t.Fatalf("manifest: %+v", tm.Manifest)
	}
	got, err := st.Get("demo")
	if err != nil || got.ID != tm.ID {
		t.Fatalf("Get: %+v %v", got, err)
	}

	// On the host: read-only, root's, nothing set-id.
	filepath.WalkDir(tm.Dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := d.Info()
		if fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm()&0o222 != 0 {
			t.Errorf("%s is writable: %v", p, fi.Mode())
		}
		return nil
	})

	code := `
import os, sys, sandloop_tmpl_demo, numpy
print("VALUE", sandloop_tmpl_demo.VALUE, sys.prefix, os.environ["DEMO"])
import subprocess
r = subprocess.run(["sh", "-c", "python -c 'import sys, sandloop_tmpl_demo; print(sys.prefix)'"], capture_output=True, text=True)
print("PYTHON", r.stdout.strip(), r.stderr)
for p in [sandloop_tmpl_demo.__file__, "/opt/sandloop/env/new.py"]:
    try:
        open(p, "a").write("x"); print("WROTE", p)
    except OSError as e:
        print("refused", e.errno)
`
	out, code1 := runIn(t, tm, code)
	if code1 != 0 || !strings.Contains(out, "VALUE from the template /opt/sandloop/env 1") || !strings.Contains(out, "PYTHON /opt/sandloop/env") || strings.Contains(out, "WROTE") || strings.Count(out, "refused") != 2 {
		t.Fatalf("in a sandbox of the template (exit %d):\n%s", code1, out)
	}
	// Without the template, the package is not there.
	out, _ = runIn(t, nil, "import sandloop_tmpl_demo")
	if !strings.Contains(out, "No module named 'sandloop_tmpl_demo'") {
		t.Fatalf("the default sandbox sees the template's package:\n%s", out)
	}

	// The same tree under another name is stored once.
	tm2, err := st.Build(context.Background(), "demo2", template.Spec{Pip: []string{"sandloop-tmpl-demo==1.0"}}, ix.BuildOptions())
	if err != nil {
		t.Fatal(err)
	}
	if tm2.ID != tm.ID {
		out, _ := exec.Command("diff", "-r", tm.Dir, tm2.Dir).CombinedOutput()
		t.Errorf("the same environment got another id: %s, %s\n%s", tm2.ID, tm.ID, out)
	}

	// In use: not removed.
	_, release, err := st.Acquire("demo")
	if err != nil {
		t.Fatal(err)
	}
	var inUse *template.InUseError
	if err := st.Remove("demo"); !errors.As(err, &inUse) || inUse.Sessions != 1 {
		t.Fatalf("Remove in use: %v", err)
	}
	release()
	for _, n := range []string{"demo", "demo2"} {
		if err := st.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Get("demo"); !errors.Is(err, template.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
	if _, err := os.Stat(tm.Dir); !os.IsNotExist(err) {
		t.Errorf("the tree is left: %v", err)
	}
}

func TestBuildFailsClearly(t *testing.T) {
	ix := templatetest.NewIndex(t, "sandloop-tmpl-demo", "x")
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var be *template.BuildError
	_, err = st.Build(context.Background(), "bad", template.Spec{Pip: []string{"no-such-package-here"}}, ix.BuildOptions())
	if !errors.As(err, &be) || be.Step != "pip install" || !strings.Contains(be.Output, "No matching distribution found for no-such-package-here") {
		t.Fatalf("missing package: %v", err)
	}
	_, err = st.Build(context.Background(), "bad", template.Spec{Pip: []string{"sandloop-tmpl-demo"}, Preload: []string{"not_a_module_at_all"}}, ix.BuildOptions())
	if !errors.As(err, &be) || be.Step != "import the preloads" || !strings.Contains(be.Output, "No module named 'not_a_module_at_all'") {
		t.Fatalf("bad preload: %v", err)
	}
	var ae *template.ArgumentError
	for _, name := range []string{"", "../x", "UPPER", "a/b"} {
		if _, err := st.Build(context.Background(), name, template.Spec{Pip: []string{"x"}}, nil); !errors.As(err, &ae) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	if _, err := st.Build(context.Background(), "x", template.Spec{Pip: []string{"--index-url=http://evil"}}, nil); !errors.As(err, &ae) {
		t.Errorf("an option as a package: %v", err)
	}
	if ts, _ := st.List(); len(ts) != 0 {
		t.Errorf("failed builds left templates: %v", ts)
	}
}

// makeTempDir is a directory removed when the tests end (TestMain).
func makeTempDir() (string, error) {
	d, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err == nil {
		tempDirs = append(tempDirs, d)
	}
	return d, err
}

var tempDirs []string
