package jail

import (
	"errors"
	"os"
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
