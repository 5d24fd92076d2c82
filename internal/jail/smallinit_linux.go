//go:build !sandloop_init

package jail

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The generated init (see initexe/README.md), when this binary was built
// after `go generate ./internal/jail`.
//
//go:embed initexe
var initexe embed.FS

const (
	// selfExe is what a jail executes as its init without the generated one.
	selfExe     = "/proc/self/exe"
	initexeName = "initexe/sandloop-init"
)

// initExecutable returns the program a jail executes as its init, and what
// it is: the generated small init, written once to a private cache
// directory, or else this binary itself (and why).
var initExecutable = sync.OnceValues(func() (path, about string) {
	// (Not ReadFile: it copies the whole file, faulting in every page of
	// it, which costs more than the init saves; it is read only to be
	// written to the cache, once.)
	fi, err := fs.Stat(initexe, initexeName)
	if err != nil {
		return selfExe, "this binary re-executes itself (built without `go generate ./internal/jail`)"
	}
	built, _ := initexe.ReadFile("initexe/source-hash")
	hash := string(bytes.TrimSpace(built))
	if hash != SourceHash() {
		return selfExe, "this binary re-executes itself (its generated init is stale: run `go generate ./internal/jail`)"
	}
	// The name carries the hash of the init itself (initgen wrote it).
	id, _ := initexe.ReadFile("initexe/init-hash")
	if id = bytes.TrimSpace(id); len(id) < 16 {
		return selfExe, "this binary re-executes itself (its generated init has no init-hash: run `go generate ./internal/jail`)"
	}
	path = filepath.Join(initCacheDir(), "sandloop-init-"+string(id[:16]))
	if err := ensureInit(path); err != nil {
		return selfExe, "this binary re-executes itself (" + err.Error() + ")"
	}
	now := time.Now()
	_ = os.Chtimes(path, now, now) // in use: not to be pruned (see ensureInit)
	return path, fmt.Sprintf("a small init (%.1f MB): %s", float64(fi.Size())/(1<<20), path)
})

// initPath is the program Start executes as a jail's init. The cached init
// is checked at every start: another sandloop may have pruned it.
func initPath() string {
	path, _ := initExecutable()
	if path == selfExe || initUnusable.Load() != nil || ensureInit(path) != nil {
		return selfExe
	}
	return path
}

// initUnusable holds why the cached init could not be executed (a parent
// directory the sandbox user may not traverse, a noexec mount): from then
// on this process's jails re-execute this binary.
var initUnusable atomic.Pointer[string]

// giveUpSmallInit records that the cached init could not be started.
func giveUpSmallInit(err error) {
	why := "this binary re-executes itself (the small init could not be started: " + err.Error() + ")"
	initUnusable.Store(&why)
}

// InitInfo says what program jails start as their init.
func InitInfo() string {
	if why := initUnusable.Load(); why != nil {
		return *why
	}
	_, about := initExecutable()
	return about
}

// InitCacheEnv, if set to an absolute path, is where the generated init is
// cached instead of the default (/run/sandloop for root): for a host whose
// /run is mounted noexec.
const InitCacheEnv = "SANDLOOP_INIT_CACHE"

// initCacheDir is where the generated init is written: a directory only
// this user may write to.
func initCacheDir() string {
	if d := os.Getenv(InitCacheEnv); filepath.IsAbs(d) {
		return d
	}
	uid := os.Geteuid()
	if uid == 0 {
		return "/run/sandloop"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		return filepath.Join(d, "sandloop")
	}
	return filepath.Join(os.TempDir(), "sandloop-"+strconv.Itoa(uid))
}

// ensureInit writes the generated init to path unless it is there.
func ensureInit(path string) error {
	return ensureCached(path, func() ([]byte, error) { return initexe.ReadFile(initexeName) })
}

// ensureCached writes the program read returns to path unless it is there
// (the name, PREFIX-HASH, says which program it is; only this user can
// have written it). The jail's user must be able to execute it: the file
// and its directory are readable by all, writable only by this user
// (checked, so that nobody else can have put a program there). Writing it
// prunes the programs of the same prefix of other builds that no sandloop
// has started using for an hour (one still running with its program
// writes it again when it next needs it).
func ensureCached(path string, read func() ([]byte, error)) error {
	if err := ownedByUs(path, false); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("init cache: %w", err)
	}
	if err := ownedByUs(dir, true); err != nil {
		return err
	}
	// The sandbox user must traverse it (whatever the umask made it).
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("init cache: %w", err)
	}
	bin, err := read()
	if err != nil {
		return err
	}
	base := filepath.Base(path)
	prefix := base[:strings.LastIndexByte(base, '-')+1] // "sandloop-init-"
	tmp, err := writeExecutable(dir, "."+prefix+"*", bin)
	if err == nil {
		err = os.Rename(tmp, path) // whole, or not there at all
	}
	if err != nil {
		if tmp != "" {
			os.Remove(tmp)
		}
		return fmt.Errorf("init cache: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	for _, o := range old {
		if fi, err := os.Lstat(o); err == nil && o != path && time.Since(fi.ModTime()) > time.Hour {
			os.Remove(o)
		}
	}
	return nil
}

// writeExecutable writes bin to a new file in dir (os.CreateTemp's
// pattern), executable, and returns its path. No process forks while the
// file is open for writing (syscall.ForkLock, which every fork of this
// process takes): a child forked meanwhile would hold the descriptor
// until its own exec, and executing the program then fails with "text
// file busy" (golang/go#22315; a jail's join failed so in a stressed CI
// run, a parallel test starting a jail as the join program was written).
func writeExecutable(dir, pattern string, bin []byte) (string, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	_, err = f.Write(bin)
	if err == nil {
		err = f.Chmod(0o755)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

// ownedByUs checks that path is a directory (or a regular file) that is
// not a link, belongs to this user and is writable by nobody else.
func ownedByUs(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case dir && !fi.IsDir(), !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("init cache: %s is not a plain %s", path, map[bool]string{true: "directory", false: "file"}[dir])
	case st == nil || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("init cache: %s belongs to another user", path)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("init cache: %s is writable by others", path)
	}
	return nil
}
