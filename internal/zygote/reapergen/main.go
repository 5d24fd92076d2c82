// Command reapergen builds a forked session's small reaper
// (../reaperexe/reaper.c) into ../reaperexe (run by `go generate ./internal/zygote`, from that
// directory) and records the hash of the source it was built from.
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
}

func generate(src, dir string) error {
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
	tmp := filepath.Join(dir, "sandloop-reaper.tmp")
	// Static: it runs in the jail's root, whatever libraries that has.
	build := exec.Command(cc, "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o", tmp, src)
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build the reaper (needs gcc and libc6-dev's static libc): %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "sandloop-reaper")); err != nil {
		return err
	}
	sum := sha256.Sum256(source)
	return os.WriteFile(filepath.Join(dir, "source-hash"), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644)
}
