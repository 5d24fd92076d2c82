// Package cbuild builds the project's small C programs for `go generate`
// (the jail's join program, the zygote's reaper and trampoline) and
// writes the hashes the packages that embed them check.
package cbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build compiles src with the C compiler ($CC, or gcc) and flags, the
// warnings as errors, into dir/out (through dir/out.tmp: a failed build
// leaves the last good one), writes the source's hash to dir/hashFile
// (WriteHash), and returns the program's bytes. what names it in errors.
func Build(src, dir, out, hashFile, what string, flags ...string) ([]byte, error) {
	source, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return nil, fmt.Errorf("%s not found: install gcc and libc6-dev (scripts/deps.sh does)", cc)
	}
	tmp := filepath.Join(dir, out+".tmp")
	args := append(flags, "-Wall", "-Wextra", "-Werror", "-o", tmp, src)
	cmd := exec.Command(cc, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("build %s: %w", what, err)
	}
	bin, err := os.ReadFile(tmp)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, out)); err != nil {
		return nil, err
	}
	return bin, WriteHash(filepath.Join(dir, hashFile), source)
}

// WriteHash writes the hex SHA-256 of data, and a newline, to path.
func WriteHash(path string, data []byte) error {
	sum := sha256.Sum256(data)
	return os.WriteFile(path, []byte(hex.EncodeToString(sum[:])+"\n"), 0o644)
}
