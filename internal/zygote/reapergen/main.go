// Command reapergen builds a forked session's small reaper
// (../reaperexe/reaper.c) and the template's trampoline
// (../reaperexe/trampoline.c, a shared object) into ../reaperexe (run by
// `go generate ./internal/zygote`, from that directory) and records the
// hash of the source each was built from.
package main

import (
	"fmt"
	"os"

	"github.com/sandloop/sandloop/internal/cbuild"
)

func main() {
	if err := generate("reaperexe/reaper.c", "reaperexe"); err != nil {
		fmt.Fprintln(os.Stderr, "reapergen:", err)
		os.Exit(1)
	}
	if err := generateTrampoline("reaperexe/trampoline.c", "reaperexe"); err != nil {
		fmt.Fprintln(os.Stderr, "reapergen:", err)
		os.Exit(1)
	}
}

func generate(src, dir string) error {
	// Static: it runs in the jail's root, whatever libraries that has.
	_, err := cbuild.Build(src, dir, "sandloop-reaper", "source-hash", "the reaper (needs gcc and libc6-dev's static libc)",
		"-static", "-Os", "-s")
	return err
}

// generateTrampoline builds the shared object the template loads into
// itself (it uses the template's own libc: glibc 2.35 or later). Without
// _FORTIFY_SOURCE: its longjmp goes from one stack to another, which the
// checking longjmp refuses.
func generateTrampoline(src, dir string) error {
	_, err := cbuild.Build(src, dir, "sandloop-trampoline.so", "trampoline-hash", "the trampoline (needs gcc and glibc 2.35 or later)",
		"-shared", "-fPIC", "-O2", "-s", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0")
	return err
}
