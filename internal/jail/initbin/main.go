// Command initbin is the jail's init on its own: package jail embeds it
// (see ../initexe) so that a jail starts a small program rather than the
// whole sandloop binary. It is nothing else.
package main

import (
	"fmt"
	"os"

	"github.com/sandloop/sandloop/internal/jail"
)

func main() {
	jail.MaybeInit() // never returns when started by Start
	fmt.Fprintln(os.Stderr, "sandloop-init: the init of sandloop's jails; it runs only when sandloop starts a jail")
	os.Exit(2)
}
