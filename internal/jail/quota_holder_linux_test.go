package jail

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
	"golang.org/x/sys/unix"
)

const holderChildEnv = "SANDLOOP_HOLDER_CHILD"

// TestQuotaHolder runs TestQuotaHolderWorkspace, and the attack tests
// on workspaces the holder made, as an unprivileged user, with the holder (quota_holder_linux.go): on a kernel that cannot clone
// a detached mount (before 6.15) because that is how workspaces are capped
// there, on newer ones because HolderForceEnv asks for it.
func TestQuotaHolder(t *testing.T) {
	if os.Getenv(holderChildEnv) != "" {
		t.Skip("run by the parent")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	bin, tmp := testutil.CopyForNobody(t, "sandloop-holder-", "jail.test")
	// With the rootless subset of TestRootless, whose jails the holder
	// then starts (testWorkspace): the same protections hold.
	tests := []string{"TestQuotaHolderWorkspace", "TestRlimitsBindTheProgramNotTheInit", "TestAttacksFail", "TestForkBombStoppedByPidsLimit", "TestCPUSpinStoppedAtTimeout", "TestDoubleForkedDaemonGone", "TestNoInheritedDescriptors"}
	cmd := exec.Command(bin, "-test.run", "^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1")
	cmd.Env = []string{holderChildEnv + "=1", HolderForceEnv + "=1", "SANDLOOP_ROOTLESS_CHILD=1", "TMPDIR=" + tmp, "PATH=/usr/bin:/bin", "HOME=" + tmp}
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	for _, name := range tests {
		if !bytes.Contains(out, []byte("--- PASS: "+name+" ")) {
			t.Errorf("%s did not pass with the holder's jails", name)
		}
	}
	t.Logf("%s", out)
	// Nothing is left: the holder died with the test binary, and its
	// base directory is swept by the next sandloop.
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if strings.Contains(e.Name(), "-holder-") {
			if n := sweepQuotaDirs(tmp); n != 1 {
				t.Errorf("the holder's base %s was not swept (%d removed)", e.Name(), n)
			}
		}
	}
}

// TestQuotaHolderWorkspace (as nobody) checks a workspace the holder
// made: the kernel stops the sandbox at the cap with ENOSPC and the host's
// free space does not drop; the jail is this process's child (waited for,
// with its exit status); uploads and the sandbox's files are shared; a
// removed workspace is gone.
func TestQuotaHolderWorkspace(t *testing.T) {
	if os.Getenv(holderChildEnv) == "" {
		t.Skip("run by TestQuotaHolder, as nobody")
	}
	if got := rootlessQuota(); got != quotaHeld {
		t.Fatalf("workspaces are made by %q, not the holder (detached: %q; holder: %q)", got, usernsQuotaUnsupported(), holderQuotaUnsupported())
	}
	t.Logf("the detached tmpfs here: %s", cmp.Or(usernsQuotaUnsupported(), "works (the holder is forced)"))
	const disk, files = 8 << 20, 50
	q, err := NewQuotaDir(disk, files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Remove() })
	if !q.Enforced || q.holderName == "" || !strings.HasPrefix(q.Path, "/proc/self/fd/") {
		t.Fatalf("workspace %+v", q)
	}
	if err := os.WriteFile(filepath.Join(q.Path, "up.txt"), []byte("uploaded"), 0o644); err != nil {
		t.Fatal(err)
	}
	var host unix.Statfs_t
	unix.Statfs(os.TempDir(), &host)
	freeBefore := int64(host.Bavail) * host.Bsize

	code := `
import errno, os, sys
def stop(f):
    try:
        f()
    except OSError as e:
        return errno.errorcode[e.errno]
print(open('up.txt').read())
print(stop(lambda: open('big', 'wb').write(b'x' * (64 << 20))))
os.remove('big')
print(stop(lambda: [open(f'f{i}', 'w').close() for i in range(1000)]))
for f in os.listdir('.'):
    if f.startswith('f'):
        os.remove(f)
open('res.txt', 'w').write('from the sandbox')
sys.stdout.flush()
sys.stdin.read()
sys.exit(3)
`
	var out, errb bytes.Buffer
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	defer stdinW.Close()
	p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", code}, Workspace: q.Path,
		Stdin: stdinR, Stdout: &out, Stderr: &errb, Limits: Limits{Timeout: 120 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	stdinR.Close()
	// The jail is ours, not the holder's.
	status := readFileString("/proc/" + strconv.Itoa(p.Pid()) + "/status")
	if !strings.Contains(status, "\nPPid:\t"+strconv.Itoa(os.Getpid())+"\n") {
		t.Errorf("the jail's init is not this process's child:\n%s", status)
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(q.Path, "res.txt")); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	unix.Statfs(os.TempDir(), &host)
	freeFull := int64(host.Bavail) * host.Bsize
	stdinW.Close()
	res, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "uploaded\nENOSPC\nENOSPC\n"; got != want || res.ExitCode != 3 {
		t.Fatalf("exit %d, stdout %q (want %q, exit 3), stderr %q", res.ExitCode, got, want, errb.String())
	}
	// (The cap is 8 MiB; the sandbox tried 64.)
	t.Logf("host free space with the workspace full: %+d MiB", (freeFull-freeBefore)>>20)
	if freeFull < freeBefore-(disk+(4<<20)) {
		t.Errorf("the host's free space dropped by %d MiB with an 8 MiB workspace", (freeBefore-freeFull)>>20)
	}
	if b, err := os.ReadFile(filepath.Join(q.Path, "res.txt")); err != nil || string(b) != "from the sandbox" {
		t.Errorf("the server read %q, %v", b, err)
	}
	if u, err := q.Usage(); err != nil || u.Files != 2 {
		t.Errorf("usage %+v, %v: want 2 files", u, err)
	}
	if err := q.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(q.Path); err == nil {
		t.Errorf("%s is still there after Remove", q.Path)
	}
	_, err = Start(context.Background(), &Config{Path: "/bin/true", Workspace: q.Path})
	if ae := (*ArgumentError)(nil); !errors.As(err, &ae) {
		t.Errorf("a jail on a removed workspace: %v", err)
	}
}
