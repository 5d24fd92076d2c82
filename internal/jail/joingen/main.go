// Command joingen builds the jail's join program (../joinexe/join.c) into
// ../joinexe (run by `go generate ./internal/jail`, from that directory)
// and records the hashes of the source it was built from and of the
// program itself.
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
	if err := generate("joinexe/join.c", "joinexe"); err != nil {
		fmt.Fprintln(os.Stderr, "joingen:", err)
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
	tmp := filepath.Join(dir, "sandloop-join.tmp")
	// Static: it runs after a chroot into the jail's root, whatever
	// libraries that has (and loads none: nothing of the jail's is read).
	build := exec.Command(cc, "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o", tmp, src)
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build the join program (needs gcc and libc6-dev's static libc): %w", err)
	}
	bin, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "sandloop-join")); err != nil {
		return err
	}
	// The cache names the program by its own hash.
	sum := sha256.Sum256(bin)
	if err := os.WriteFile(filepath.Join(dir, "join-hash"), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644); err != nil {
		return err
	}
	sum = sha256.Sum256(source)
	return os.WriteFile(filepath.Join(dir, "source-hash"), []byte(hex.EncodeToString(sum[:])+"\n"), 0o644)
}
