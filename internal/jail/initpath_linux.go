package jail

import (
	"bytes"
	"debug/elf"
	"os"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	initOnce sync.Once
	initExe  string
)

// initPath is the program a new jail executes as its init: the embedded
// small init, from a sealed memfd, or (if there is none for this
// architecture) this binary itself. Loading the whole sandloop binary,
// SDKs and all, costs tens of milliseconds per jail; the small init, a few.
func initPath() string {
	initOnce.Do(func() {
		initExe = "/proc/self/exe"
		if len(initBinary) == 0 || !elfMatches(initBinary) {
			return
		}
		fd, err := unix.MemfdCreate("sandloop-jail-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return
		}
		f := os.NewFile(uintptr(fd), "sandloop-jail-init")
		if _, err := f.Write(initBinary); err != nil {
			f.Close()
			return
		}
		// Sealed: nothing in this process can change what jails run.
		seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			f.Close()
			return
		}
		// The descriptor stays open for the life of the process. It is
		// close-on-exec; a new jail execs it by path before that applies.
		initExe = "/proc/self/fd/" + strconv.Itoa(fd)
		runtime.KeepAlive(f)
		keepInit = f
	})
	return initExe
}

var keepInit *os.File

// elfMatches reports whether b is an executable for this architecture.
func elfMatches(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "riscv64": elf.EM_RISCV}
	m, ok := want[runtime.GOARCH]
	return ok && f.Machine == m
}
