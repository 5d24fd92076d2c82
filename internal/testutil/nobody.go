package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Nobody is the uid and gid the rootless tests (of the jail, session and
// zygote packages) run a copy of themselves as.
const Nobody = 65534

// ReadableTempDir is a temporary directory an unprivileged user may
// enter (t.TempDir's parent is private to root), removed at cleanup.
func ReadableTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	return dir
}

// CopyForNobody copies the running test binary (as name) where Nobody may
// run it, and makes that user a temporary directory of its own (tmp), both
// in one readable temporary directory (filepath.Dir(tmp)).
func CopyForNobody(t testing.TB, prefix, name string) (bin, tmp string) {
	t.Helper()
	dir := ReadableTempDir(t, prefix)
	self, _ := os.Executable()
	bin = filepath.Join(dir, name)
	data, err := os.ReadFile(self)
	if err == nil {
		err = os.WriteFile(bin, data, 0o755)
	}
	if err != nil {
		t.Fatal("copy the test binary:", err)
	}
	tmp = filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, Nobody, Nobody); err != nil {
		t.Fatal(err)
	}
	return bin, tmp
}

// KernelBefore reports whether the running kernel is older than
// major.minor (false if its release cannot be read).
func KernelBefore(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var maj, min int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj < major || maj == major && min < minor
}
