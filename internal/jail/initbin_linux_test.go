package jail

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestEmbeddedInitIsCurrent rebuilds the small init exactly as go:generate
// does and compares it with the embedded one, so a change to the jail's
// init code cannot ship with a stale init.
func TestEmbeddedInitIsCurrent(t *testing.T) {
	if len(initBinary) == 0 {
		t.Skip("no embedded init in this build")
	}
	out := filepath.Join(t.TempDir(), "jailinit.bin")
	cmd := exec.Command("go", append(append([]string{}, initBuildArgs...), "-o", out, "./cmd/jailinit")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the init: %v\n%s", err, b)
	}
	fresh, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, initBinary) {
		t.Fatalf("internal/jail/jailinit.bin is stale (%d bytes embedded, %d built): run `go generate ./internal/jail` and commit it", len(initBinary), len(fresh))
	}
}

func TestJailsUseTheSmallInit(t *testing.T) {
	if len(initBinary) == 0 {
		t.Skip("no embedded init in this build")
	}
	if p := initPath(); p == "/proc/self/exe" {
		t.Fatalf("jails start this binary instead of the embedded init")
	}
	got := mustPrint(t, `print(open('/proc/self/status').read().count('\n') > 0)`)
	if got != "True" {
		t.Errorf("a jail started through the small init: %q", got)
	}
}
