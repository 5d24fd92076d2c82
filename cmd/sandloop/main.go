// Command sandloop runs Python in a sandbox and drives a write-run-fix agent
// on top of it.
package main

import (
	"os"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/keeper"
)

func main() {
	// Inside a jail this binary is the jail's init: it never returns.
	jail.MaybeInit()
	// Started as a keeper (serve --keep-sessions): it never returns.
	keeper.MaybeRun()
	os.Exit(execute(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
