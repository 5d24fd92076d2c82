// Command joingen builds the jail's join program (../joinexe/join.c) into
// ../joinexe (run by `go generate ./internal/jail`, from that directory)
// and records the hashes of the source it was built from and of the
// program itself.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandloop/sandloop/internal/cbuild"
)

func main() {
	if err := generate("joinexe/join.c", "joinexe"); err != nil {
		fmt.Fprintln(os.Stderr, "joingen:", err)
		os.Exit(1)
	}
}

func generate(src, dir string) error {
	// Static: it runs after a chroot into the jail's root, whatever
	// libraries that has (and loads none: nothing of the jail's is read).
	bin, err := cbuild.Build(src, dir, "sandloop-join", "source-hash", "the join program (needs gcc and libc6-dev's static libc)",
		"-static", "-Os", "-s")
	if err != nil {
		return err
	}
	// The cache names the program by its own hash.
	return cbuild.WriteHash(filepath.Join(dir, "join-hash"), bin)
}
