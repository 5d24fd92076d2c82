package session_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/session/sessiontest"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/workspace"
)

const testDisk, testFiles = 48 << 20, 2000

// rootlessEnv marks the run of TestQuotaRootless's subset as nobody.
const rootlessEnv = "SANDLOOP_SESSION_ROOTLESS"

// skipWithoutQuota skips where workspaces cannot be capped (no root, and
// no tmpfs in a user namespace either: an older kernel). In the rootless
// run that must be the only reason.
func skipWithoutQuota(t *testing.T) {
	t.Helper()
	c := jail.QuotaSupport()
	if !c.OK {
		t.Skip("workspace quotas: " + c.Detail)
	}
	if os.Getenv(rootlessEnv) != "" {
		if os.Geteuid() == 0 {
			t.Fatal("the rootless run is root")
		}
		t.Logf("workspace quota: %s", c.Detail)
	}
}

func TestQuotaColdSession(t *testing.T) {
	skipWithoutQuota(t)
	// The default quota, large enough for the check that the host's free
	// space is unchanged to tell a leaked workspace from other activity.
	s, err := session.New(context.Background(), &session.Options{Limits: jail.Limits{Files: testFiles}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sessiontest.CheckQuota(t, s, jail.DefaultDisk, testFiles)
}

func TestQuotaPooledSession(t *testing.T) {
	skipWithoutQuota(t)
	m := session.NewManager(&session.ManagerOptions{PoolSize: 1, Defaults: jail.Limits{Disk: testDisk, Files: testFiles}})
	t.Cleanup(func() { m.Close() })
	testutil.WaitFor(t, 30*time.Second, func() error {
		if m.Stats().PoolReady == 0 {
			return errors.New("no pooled kernel is ready")
		}
		return nil
	})
	ms, err := m.Create(context.Background(), session.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ms.FromPool {
		t.Fatal("the session did not come from the pool")
	}
	sessiontest.CheckQuota(t, ms.Session, testDisk, testFiles)
}

// The server's own access to a capped workspace (the files API, archives)
// works as on any directory: an upload is seen by the code, the code's
// files by the server and in the archive, an upload past the quota is
// refused by the file system and stores nothing, and a restart (a new
// jail on the same workspace) keeps the files.
func TestQuotaFiles(t *testing.T) {
	skipWithoutQuota(t)
	ctx := context.Background()
	s, err := session.New(ctx, &session.Options{Limits: jail.Limits{Disk: 8 << 20, Files: 50}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Caps of its own above the quota: only the file system refuses.
	w, err := session.OpenWorkspace(s.Workspace(), workspace.Options{MaxFileBytes: 64 << 20, MaxTotalBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write("in/data.txt", strings.NewReader("uploaded")); err != nil {
		t.Fatal(err)
	}
	if out := sessiontest.Output(t, s, "import os\nos.mkdir('res')\nopen('res/out.txt', 'w').write('from the sandbox')\nprint(open('in/data.txt').read())"); out != "uploaded" {
		t.Fatalf("the code read %q", out)
	}
	if b, err := w.ReadFile("res/out.txt", 1<<20); err != nil || string(b) != "from the sandbox" {
		t.Fatalf("the server read %q, %v", b, err)
	}
	var arch bytes.Buffer
	if err := w.Archive(ctx, &arch, workspace.FormatTarGz, ""); err != nil {
		t.Fatal(err)
	}
	if names := tarNames(t, &arch); !slices.Contains(names, "in/data.txt") || !slices.Contains(names, "res/out.txt") {
		t.Fatalf("archive holds %v", names)
	}
	before, _ := s.Usage()
	_, err = w.Write("new/big.bin", bytes.NewReader(make([]byte, 9<<20)))
	var le *workspace.LimitError
	if !errors.As(err, &le) || le.What != "quota" {
		t.Fatalf("upload past the quota: %v (want the file system's refusal)", err)
	}
	if _, err := w.Stat("new"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("the refused upload left something: %v", err)
	}
	if u, _ := s.Usage(); u != before {
		t.Errorf("usage %+v after a refused upload, was %+v", u, before)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if out := sessiontest.Output(t, s, "print(open('res/out.txt').read())"); out != "from the sandbox" {
		t.Fatalf("after a restart the code read %q", out)
	}
}

// TestQuotaRootless runs the quota tests as an unprivileged user, whose
// workspaces are tmpfs mounts made in a user namespace (detached, or
// before 6.15 held by the holder).
func TestQuotaRootless(t *testing.T) { quotaRootless(t) }

func quotaRootless(t *testing.T) string {
	out := sessiontest.AsNobody(t, rootlessEnv, "^(TestQuotaColdSession|TestQuotaPooledSession|TestQuotaFiles)$")
	for _, name := range []string{"TestQuotaColdSession", "TestQuotaPooledSession", "TestQuotaFiles"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass rootless:\n%s", name, out)
		}
	}
	t.Logf("%s", out)
	return out
}

// TestQuotaRootlessHolder is TestQuotaRootless with the workspaces
// mounted by the holder, as kernels before 6.15 have them, on any kernel.
func TestQuotaRootlessHolder(t *testing.T) {
	if testutil.KernelBefore(6, 15) {
		t.Skip("TestQuotaRootless uses the holder on this kernel already")
	}
	t.Setenv(jail.HolderForceEnv, "1")
	if out := quotaRootless(t); !strings.Contains(out, "held there by a helper process") {
		t.Errorf("the workspaces were not the holder's:\n%s", out)
	}
}

func tarNames(t *testing.T, r io.Reader) []string {
	t.Helper()
	gz, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}
