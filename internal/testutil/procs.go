package testutil

import (
	"bytes"
	"os"
	"strconv"
)

// PidsWithArg lists the host's processes whose command line (its
// arguments joined by NULs) contains arg: what a test marks the commands
// it starts in a sandbox with, to check none is left behind. A marker
// must not be something a hex string holds (digits alone): a zygote
// spare's reaper carries its seccomp filter in hex in its arguments.
func PidsWithArg(arg string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(b, []byte(arg)) {
			out = append(out, pid)
		}
	}
	return out
}
