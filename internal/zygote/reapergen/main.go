// Command reapergen builds a forked session's small reaper
// (../reaperexe/reaper.c) and the template's trampoline
// (../reaperexe/trampoline.c, a shared object) into ../reaperexe (run by
// `go generate ./internal/zygote`, from that directory) and records the
// hash of the source each was built from.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	return build(src, dir, "sandloop-reaper", "source-hash", "the reaper (needs gcc and libc6-dev's static libc)",
		"-static", "-Os", "-s")
}

// generateTrampoline builds the shared object the template loads into
// itself (it uses the template's own libc: glibc 2.35 or later). Without
// _FORTIFY_SOURCE: its longjmp goes from one stack to another, which the
// checking longjmp refuses.
func generateTrampoline(src, dir string) error {
	return build(src, dir, "sandloop-trampoline.so", "trampoline-hash", "the trampoline (needs gcc and glibc 2.35 or later)",
		"-shared", "-fPIC", "-O2", "-s", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0")
}

// build compiles src into dir/out and writes the source's hash to
// dir/hashFile.
func build(src, dir, out, hashFile, what string, flags ...string) error {
	source, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return fmt.Errorf("%s not found: install gcc and libc6-dev (scripts/deps.sh does)", cc)
	}
	tmp := filepath.Join(dir, out+".tmp")
	args := append(flags, "-Wall", "-Wextra", "-Werror", "-o", tmp, src)
	cmd := exec.Command(cc, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s: %w", what, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, out)); err != nil {
		return err
	}
	sum := sha256.Sum256(source)
	return os.WriteFile(filepath.Join(dir, hashFile), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644)
}
