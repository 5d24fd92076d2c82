package kernel

import "unicode/utf8"

// The kernel's three output channels, as indexed by the pipes.
const (
	streamEvents = 0
	streamStdout = 1
	streamStderr = 2
)

// sink receives what the kernel says, in order.
type sink interface {
	text(stream int, s string)
	// event handles one event; true stops the current step (the end).
	event(ev *wireEvent) bool
}

// runeBoundary returns the length of b without a trailing incomplete UTF-8
// sequence, so a character split across two reads is not mangled.
func runeBoundary(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		c := b[i]
		if c < utf8.RuneSelf {
			return len(b)
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}
