// Command initgen builds the jail's small init into ../initexe (run by
// `go generate ./internal/jail`, from that directory) and records the hash
// of the sources it was built from.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/sandloop/sandloop/internal/cbuild"
	"github.com/sandloop/sandloop/internal/jail"
)

func main() {
	if err := generate("initexe"); err != nil {
		fmt.Fprintln(os.Stderr, "initgen:", err)
		os.Exit(1)
	}
}

func generate(dir string) error {
	tmp := filepath.Join(dir, "sandloop-init.tmp")
	// The tag leaves out what only the programs that start jails need (the
	// embedded init itself, the package's sources).
	build := exec.Command("go", "build", "-trimpath", "-tags", "sandloop_init", "-ldflags=-s -w", "-o", tmp, "./initbin")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build the init: %w", err)
	}
	bin, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "sandloop-init")); err != nil {
		return err
	}
	// The cache names the init by its own hash (a new toolchain or module
	// version changes the program, not the jail's sources): computed here,
	// as reading it whole at run time costs more than the init saves.
	if err := cbuild.WriteHash(filepath.Join(dir, "init-hash"), bin); err != nil {
		return err
	}
	// This program was compiled from the sources it hashes, as the init was.
	return os.WriteFile(filepath.Join(dir, "source-hash"), []byte(jail.SourceHash()+"\n"), 0o644)
}
