package jail

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A mount is readable and executable where it is placed, and neither
// writable (not even by a file the sandbox user owns) nor a way to gain
// privileges; a writable one takes writes.
func TestMountsReadOnlyNoSuid(t *testing.T) {
	// A private parent (0700, as the data directory is): the jail's user
	// cannot traverse it, the host's clone of the mount does not need to.
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "env")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("from the template"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "hello.txt"), 0o666); err != nil {
		t.Fatal(err)
	}
	code := `
import os
print(open("/opt/sandloop/env/hello.txt").read())
for p in ["/opt/sandloop/env/hello.txt", "/opt/sandloop/env/new.txt"]:
    try:
        open(p, "a").write("x"); print("WROTE", p)
    except OSError as e:
        print("refused", e.errno)
st = os.statvfs("/opt/sandloop/env")
print("rdonly", bool(st.f_flag & os.ST_RDONLY), "nosuid", bool(st.f_flag & os.ST_NOSUID), "nodev", bool(st.f_flag & os.ST_NODEV))
`
	r := runPy(t, code, func(c *Config) { c.Mounts = []Mount{{Host: dir, Path: "/opt/sandloop/env"}} })
	if r.res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", r.res.ExitCode, r.stderr)
	}
	for _, want := range []string{"from the template", "refused 30\nrefused 30", "rdonly True nosuid True nodev True"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "WROTE") {
		t.Errorf("wrote through a read-only mount:\n%s", r.stdout)
	}

	w := t.TempDir()
	if os.Geteuid() == 0 {
		os.Chown(w, HostID, HostID)
	}
	r = runPy(t, `open("/opt/build/out.txt", "w").write("built"); print("ok")`, func(c *Config) { c.Mounts = []Mount{{Host: w, Path: "/opt/build", Writable: true}} })
	if got, err := os.ReadFile(filepath.Join(w, "out.txt")); err != nil || string(got) != "built" {
		t.Fatalf("writable mount: %q %v (%s)", got, err, r.stderr)
	}
}

func TestMountsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{"/usr/lib", "/opt", "opt/x", "/opt/../usr", "/opt/sandloop/workspaces", "/etc/x"} {
		_, err := Start(t.Context(), &Config{Path: DefaultPython, Workspace: testWorkspace(t), Mounts: []Mount{{Host: dir, Path: path}}})
		var ae *ArgumentError
		if !errors.As(err, &ae) {
			t.Errorf("mount at %s: %v, want an ArgumentError", path, err)
		}
	}
}

func TestRootMountRefused(t *testing.T) {
	dir := t.TempDir()
	for name, ms := range map[string][]Mount{
		"root at /opt/x":      {{Host: dir, Path: "/opt/x", Root: true}},
		"a writable root":     {{Host: dir, Path: "/", Root: true, Writable: true}},
		"two roots":           {{Host: dir, Path: "/", Root: true}, {Host: dir, Path: "/", Root: true}},
		"a root that is gone": {{Host: filepath.Join(dir, "nope"), Path: "/", Root: true}},
		"a plain mount at /":  {{Host: dir, Path: "/"}},
	} {
		_, err := Start(t.Context(), &Config{Path: DefaultPython, Workspace: testWorkspace(t), Mounts: ms})
		var ae *ArgumentError
		if !errors.As(err, &ae) {
			t.Errorf("%s: %v, want an ArgumentError", name, err)
		}
	}
}

// An image root replaces the host's system directories: a root holding
// only a static program (built here, it needs no library) and a marker
// runs that program, which sees the marker and no host /usr; a link in
// the image aimed at the host through the init's build directory
// resolves inside the image.
func TestRootMountReplacesSystem(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/share", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/share/marker"), []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/oldroot/etc/hostname", filepath.Join(root, "etc/ld.so.cache")); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "main.go")
	os.WriteFile(src, []byte(`package main

import (
	"fmt"
	"os"
)

func main() {
	m, err := os.ReadFile("/usr/share/marker")
	fmt.Println("marker", string(m), err)
	_, err = os.Stat("/usr/bin/python3")
	fmt.Println("host python", err == nil)
	c, err := os.ReadFile("/etc/ld.so.cache")
	fmt.Printf("ld.so.cache %q %v\n", c, err)
	l, _ := os.Readlink("/bin")
	fmt.Println("bin ->", l)
}
`), 0o644)
	build := exec.Command("go", "build", "-o", filepath.Join(root, "usr/bin/probe"), src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build a static program here: %v %s", err, out)
	}
	var stdout, stderr strings.Builder
	res, err := Run(t.Context(), &Config{Path: "/usr/bin/probe", Workspace: testWorkspace(t), Stdout: &stdout, Stderr: &stderr,
		Mounts: []Mount{{Host: root, Path: "/", Root: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s %s", res.ExitCode, stdout.String(), stderr.String())
	}
	for _, want := range []string{"marker image <nil>", "host python false", "ld.so.cache \"\" open /etc/ld.so.cache: no such file or directory", "bin -> usr/bin"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("missing %q in:\n%s", want, stdout.String())
		}
	}
}
