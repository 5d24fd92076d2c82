package e2b

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// E2B's aptInstall step, as its SDK writes it, and what is not one.
func TestAptInstallArgs(t *testing.T) {
	cases := []struct {
		cmd  string
		want []string // nil: not an apt-get install
	}{
		{"apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y s3fs fuse", []string{"s3fs", "fuse"}},
		{"apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y --no-install-recommends --fix-missing libgl1", []string{"libgl1"}},
		{"sudo apt install -y python3.11 g++", []string{"python3.11", "g++"}},
		{"apt-get install curl && apt-get install -qq jq", []string{"curl", "jq"}},
		{"apt-get update", nil},
		{"apt-get install -y", nil},
		{"apt-get remove -y curl", nil},
		{"apt-get install -y curl=7.88.1-10", nil},
		{"apt-get install -y ./local.deb", nil},
		{"apt-get install -y --allow-unauthenticated curl", nil},
		{"apt-get update; apt-get install -y curl", nil},
		{"apt-get install -y curl && rm -rf /var/lib/apt/lists/*", nil},
		{"apt-get install -y $(cat list)", nil},
		{"pip install pandas", nil},
	}
	for _, c := range cases {
		got, ok := aptInstallArgs(c.cmd)
		if ok != (c.want != nil) || !slices.Equal(got, c.want) {
			t.Errorf("%q: got %q, %v; want %q", c.cmd, got, ok, c.want)
		}
	}
}

// An apt-get install step passes when dpkg has every package installed
// (or one that provides it), and is refused naming the others.
func TestBuildSpecAptStep(t *testing.T) {
	status := filepath.Join(t.TempDir(), "status")
	os.WriteFile(status, []byte(`Package: curl
Status: install ok installed
Version: 7.88.1-10
Description: a tool
 Package: continuation lines are not fields

Package: fuse3
Status: install ok installed
Provides: fuse (= 2.9), libfuse-dev

Package: s3fs
Status: deinstall ok config-files

Package: jq
Status: install ok half-installed
`), 0o644)
	apt := func(pkgs string) buildStep {
		return buildStep{Type: "RUN", Args: []string{"apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y " + pkgs, "root"}}
	}
	pip := buildStep{Type: "RUN", Args: []string{"pip install requests", "root"}}
	base := func(steps ...buildStep) *buildStart { return &buildStart{FromTemplate: "base", Steps: steps} }

	spec, err := buildSpec(base(apt("curl fuse libfuse-dev"), pip), status)
	if err != nil || !slices.Equal(spec.Pip, []string{"requests"}) {
		t.Errorf("packages installed: %+v, %v", spec, err)
	}
	for _, c := range []struct {
		pkgs, missing string
	}{
		{"curl s3fs", "s3fs is not installed"},          // removed, its configuration left
		{"jq continuation", "jq, continuation are not"}, // half-installed; a description's line
	} {
		_, err := buildSpec(base(apt(c.pkgs), pip), status)
		if err == nil || !strings.Contains(err.Error(), "step 1, apt-get install "+c.pkgs+": "+c.missing) ||
			!strings.Contains(err.Error(), "sandloop cannot install Debian packages into a template") || !strings.Contains(err.Error(), "--image") {
			t.Errorf("apt-get install %s: %v", c.pkgs, err)
		}
	}
	// Nothing but packages there already: the sandbox's environment as
	// it is, under the template's name.
	if spec, err := buildSpec(base(apt("curl")), status); err != nil || !spec.AsIs || len(spec.Pip) != 0 {
		t.Errorf("only an apt step of installed packages: %+v %v", spec, err)
	}
	// A root whose packages cannot be read refuses, saying so.
	if _, err := buildSpec(base(apt("curl"), pip), filepath.Join(t.TempDir(), "none")); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("no dpkg status: %v", err)
	}

	// The host's own root, the default sandboxes': python3 is there (the
	// sandbox's Python is Debian's).
	if _, err := buildSpec(base(apt("python3"), pip), hostDpkgStatus); err != nil {
		t.Errorf("python3 on the host: %v", err)
	}
}
