// Command jailinit is the jail's init on its own: a small program the
// sandloop binary embeds and executes in each new jail, so that starting a
// jail does not pay for loading (and initializing every package of) the
// whole sandloop binary. Build it with `go generate ./internal/jail`.
package main

import (
	"fmt"
	"os"

	"github.com/sandloop/sandloop/internal/jail"
)

func main() {
	jail.MaybeInit() // does not return when started as a jail's init
	fmt.Fprintln(os.Stderr, "jailinit: this program is started by sandloop inside a new jail; it does nothing on its own")
	os.Exit(2)
}
