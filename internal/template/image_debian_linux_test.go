package template_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

// debianMirror is the Debian archive this machine's apt already uses
// (its sources, read now): the main archive's URI, not a security or
// updates suite's.
func debianMirror() string {
	var files []string
	d, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, d...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, block := range strings.Split(string(b), "\n\n") {
			var uris, suites []string
			for _, line := range strings.Split(block, "\n") {
				k, v, ok := strings.Cut(line, ":")
				if !ok || strings.HasPrefix(line, "#") {
					continue
				}
				switch strings.TrimSpace(k) {
				case "URIs":
					uris = strings.Fields(v)
				case "Suites":
					suites = strings.Fields(v)
				}
			}
			for _, s := range suites {
				if !strings.Contains(s, "-") && len(uris) > 0 {
					return uris[0]
				}
			}
		}
	}
	f, err := os.Open("/etc/apt/sources.list")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 3 && fs[0] == "deb" {
			i := 1
			if strings.HasPrefix(fs[1], "[") {
				for i < len(fs) && !strings.HasSuffix(fs[i], "]") {
					i++
				}
				i++
			}
			if i+1 < len(fs) && !strings.Contains(fs[i+1], "-") {
				return fs[i]
			}
		}
	}
	return ""
}

// TestDebianTrixieImage builds a Debian 13 root with mmdebstrap (minbase
// and python3, from the archive apt uses here), makes it an OCI layout
// with go-containerregistry, builds a template from it and runs a
// session in it: the session's Python is the image's 3.13, not the
// host's 3.11. Slow (a download and an unpack of ~150 MB): `make
// test-images` runs it; `make test` does not.
func TestDebianTrixieImage(t *testing.T) {
	if os.Getenv("SANDLOOP_TEST_IMAGES") == "" {
		t.Skip("slow: set SANDLOOP_TEST_IMAGES=1 (make test-images)")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("no mmdebstrap (apt-get install mmdebstrap)")
	}
	mirror := debianMirror()
	if mirror == "" {
		t.Skip("no Debian archive in apt's sources")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "trixie.tar")
	cmd := exec.Command("mmdebstrap", "--variant=minbase", "--include=python3", "--format=tar", "trixie", root, "deb "+mirror+" trixie main")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmdebstrap: %v\n%s", err, lastLinesOf(string(out), 30))
	}
	st, err := template.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tm := range must(st.List()) {
			st.Remove(tm.Name)
		}
	})
	tm, err := st.BuildImage(context.Background(), "trixie", template.ImageSpec{Ref: writeLayout(t, imageOf(t, root))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("trixie: python %s (%s), %d MiB in %d files, neutralised %v, cold start %q", tm.Python, tm.Interpreter, tm.Size>>20, tm.Files, tm.Neutralised, tm.ColdStart)
	if !strings.HasPrefix(tm.Python, "3.13") {
		t.Fatalf("the image's python is %s, want 3.13", tm.Python)
	}
	if len(tm.Neutralised) == 0 {
		t.Errorf("a Debian root has set-user-id programs (su, mount...): none were neutralised")
	}
	t.Run("attacks", func(t *testing.T) {
		// The jail's red-team suite again, with this tree as the system
		// root of every jail it starts (internal/jail's runPy).
		gobin, err := exec.LookPath("go")
		if err != nil {
			t.Skip("no go command to run internal/jail's attacks")
		}
		cmd := exec.Command(gobin, "test", "-count=1", "-run", "TestAttacksFail", "../jail")
		cmd.Env = append(os.Environ(), "SANDLOOP_JAIL_TEST_ROOT="+tm.Dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the jail's attacks in the Debian 13 root: %v\n%s", err, lastLinesOf(string(out), 40))
		}
		t.Logf("%s", strings.TrimSpace(string(out)))
	})
	for _, mode := range []string{"cold", "forked"} {
		t.Run(mode, func(t *testing.T) {
			opts := &template.PoolOptions{MaxWarm: -1}
			if mode == "forked" {
				if err := zygote.Supported(); err != nil {
					t.Skip(err)
				}
				if tm.ColdStart != "" {
					t.Fatalf("Debian 13's python3 could not run a zygote: %s", tm.ColdStart)
				}
				opts = nil
			}
			pool := template.NewPool(st, opts)
			t.Cleanup(pool.Close)
			if mode == "forked" {
				if err := pool.Warm(context.Background(), []string{"trixie"}); err != nil {
					t.Fatal(err)
				}
			}
			m := session.NewManager(&session.ManagerOptions{Templates: pool})
			t.Cleanup(func() { m.Close() })
			s, err := m.Create(context.Background(), session.CreateOptions{Template: "trixie"})
			if err != nil {
				t.Fatal(err)
			}
			r := execute(t, s, `
import sys, os, stat
print("VERSION", sys.version.split()[0])
print("DEBIAN", open("/etc/debian_version").read().strip() if os.path.exists("/etc/debian_version") else "-", open("/usr/lib/os-release").read().count("trixie") > 0)
print("SETID", [p for p in ("/usr/bin/su", "/usr/bin/mount", "/usr/bin/passwd") if os.path.exists(p) and os.stat(p).st_mode & (stat.S_ISUID | stat.S_ISGID)])
print("DEV", sorted(os.listdir("/dev")))
try:
    open("/usr/lib/python3.13/os.py", "a"); print("WROTE")
except OSError as e:
    print("RO", type(e).__name__)
x = 6 * 7
x`)
			if r.Status != "ok" {
				t.Fatalf("status %s: %s %s %v", r.Status, r.Stdout, r.Stderr, r.Error)
			}
			for _, want := range []string{"VERSION 3.13", " True", "SETID []", "RO "} {
				if !strings.Contains(r.Stdout, want) {
					t.Errorf("missing %q in:\n%s", want, r.Stdout)
				}
			}
			if mr := r.MainResult(); mr["text/plain"] != "42" {
				t.Errorf("main result %v, want 42", mr)
			}
		})
	}
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
