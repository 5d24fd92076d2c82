// Package sessiontest holds checks shared by the tests of packages that
// make sessions in different ways (cold, pooled, forked from a zygote).
package sessiontest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
	"golang.org/x/sys/unix"
)

// fillBytes writes up to 1 GiB in 16 MiB blocks and reports where it stopped.
const fillBytes = `
import errno
written, err = 0, None
try:
    with open('big.bin', 'wb', buffering=0) as f:
        for _ in range(64):
            written += f.write(b'x' * (16 << 20))
except OSError as e:
    err = errno.errorcode[e.errno]
print(err, written)
`

// fillFiles creates up to 50,000 empty files and reports where it stopped.
const fillFiles = `
import errno, os
os.remove('big.bin')
os.mkdir('many')
made, err = 0, None
try:
    for i in range(50000):
        open(f'many/{i}', 'w').close()
        made += 1
except OSError as e:
    err = errno.errorcode[e.errno]
print(err, made)
`

// CheckQuota checks that s's workspace, capped at disk bytes (at most 256
// MiB) and files files (at most 5,000), stops a 1 GiB write and 50,000
// file creations inside the sandbox with ENOSPC, that the workspace is a
// tmpfs (so the host's disk is not written), that usage is reported, and
// that Close removes it. With a disk of at least twice hostFreeTolerance
// it also checks that the free space of the host's file system holding
// the temporary directory is the same, within the tolerance, while the
// workspace is full and after Close. It closes s.
func CheckQuota(t *testing.T, s *session.Session, disk int64, files int) {
	t.Helper()
	checkFree := disk >= 2*hostFreeTolerance
	var free0 int64
	if checkFree {
		free0 = hostFree(t)
	}
	q := s.Quota()
	if !q.Enforced || q.Disk != disk || q.Files != files {
		t.Fatalf("quota %+v, want enforced %d bytes, %d files", q, disk, files)
	}
	ws := s.Workspace()
	var st unix.Statfs_t
	if err := unix.Statfs(ws, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("workspace %s is not a tmpfs: type %#x, %v", ws, st.Type, err)
	}
	out := Output(t, s, fillBytes)
	var errName string
	var n int64
	if _, err := fmt.Sscan(out, &errName, &n); err != nil || errName != "ENOSPC" || n > disk || n < disk-(16<<20)-(1<<20) {
		t.Fatalf("1 GiB write into a %d-byte workspace: %q (want ENOSPC near the cap)", disk, out)
	}
	u, err := s.Usage()
	if err != nil || u.Bytes < n || u.Bytes > disk || u.Files != 1 {
		t.Fatalf("usage after the write: %+v, %v (want ≥%d bytes, 1 file)", u, err, n)
	}
	if checkFree {
		checkHostFree(t, "with the workspace full", free0, disk)
	}
	out = Output(t, s, fillFiles)
	var made int
	if _, err := fmt.Sscan(out, &errName, &made); err != nil || errName != "ENOSPC" || made > files || made < files-2 {
		t.Fatalf("50,000 files in a workspace of %d: %q (want ENOSPC near the cap)", files, out)
	}
	if u, err = s.Usage(); err != nil || u.Files < int64(made) || u.Files > int64(files) {
		t.Fatalf("usage after the files: %+v, %v", u, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ws); err == nil {
		t.Fatalf("workspace %s left after Close", ws)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), ws) {
		t.Fatalf("workspace still mounted after Close (%v)", err)
	}
	// Without root the workspace is a directory of a tmpfs held by a
	// descriptor (its path is under /proc/self/fd/): no descriptor of
	// this process may still reach it.
	if strings.HasPrefix(ws, "/proc/self/fd/") {
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			if _, err := os.Lstat("/proc/self/fd/" + fd.Name() + "/" + filepath.Base(ws)); err == nil {
				t.Fatalf("descriptor %s still holds the workspace's tmpfs after Close", fd.Name())
			}
		}
	}
	if checkFree {
		checkHostFree(t, "after Close", free0, disk)
	}
}

// hostFreeTolerance is the least drop of the host's free space a quota
// check tolerates for activity that is not the session's (other tests'
// files; see checkHostFree).
const hostFreeTolerance = 100 << 20

// hostFree is the space free to unprivileged users on the host file
// system that holds the temporary directory, where workspaces are made.
func hostFree(t *testing.T) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(os.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// checkHostFree fails if the host's free space is more than a tolerance
// below free0: three quarters of disk, the workspace's cap, which the
// check's write fills to within 17 MiB, so a workspace leaked onto the
// host's disk is still caught; other tests' files (go test runs packages
// side by side, some writing hundreds of MiB) are not taken for it. It
// measures again over ~10 s before it fails: such files come and go, the
// session's would stay.
func checkHostFree(t *testing.T, when string, free0, disk int64) {
	t.Helper()
	tolerance := max(hostFreeTolerance, disk*3/4)
	var free int64
	for i := range 8 {
		if free = hostFree(t); free0-free <= tolerance {
			t.Logf("host free space %s: %+d MiB", when, (free-free0)>>20)
			return
		}
		time.Sleep(time.Duration(i+1) * 300 * time.Millisecond)
	}
	t.Fatalf("the host's file system holding %s lost %d MiB of free space %s (tolerance %d MiB)", os.TempDir(), (free0-free)>>20, when, tolerance>>20)
}

// Output runs code in s and returns its stdout, trimmed; it fails t
// unless the code ran to its end.
func Output(t *testing.T, s *session.Session, code string) string {
	t.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != kernel.StatusOK {
		t.Fatalf("status %s: %+v %q", r.Status, r.Error, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// AsNobody runs the tests of this test binary that match pattern as the
// unprivileged user nobody (uid 65534), with a temporary directory of its
// own, and returns their verbose output; it fails t if they fail. The
// tests see env set to "1" (to tell that they are the rootless run). It
// needs root (it skips otherwise).
func AsNobody(t *testing.T, env, pattern string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	bin, tmp := testutil.CopyForNobody(t, "sandloop-rootless-", "rootless.test")
	cmd := exec.Command(bin, "-test.run", pattern, "-test.v", "-test.count=1")
	cmd.Env = []string{env + "=1", "TMPDIR=" + tmp, "PATH=/usr/bin:/bin", "HOME=" + tmp}
	if v := os.Getenv(jail.HolderForceEnv); v != "" {
		cmd.Env = append(cmd.Env, jail.HolderForceEnv+"="+v)
	}
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nPASS")) {
		t.Fatalf("the tests as nobody failed: %v\n%s", err, out)
	}
	return string(out)
}
