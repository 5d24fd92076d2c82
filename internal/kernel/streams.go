package kernel

import (
	"fmt"
	"unicode/utf8"
)

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

// CutMiddle keeps the first and last max/2 bytes of s, on character
// boundaries, and puts between them marker, a format with one %d for the
// number of bytes cut. The start shows what happened; the end holds the
// traceback. s is returned whole if it fits.
func CutMiddle(s string, max int, marker string) string {
	if len(s) <= max {
		return s
	}
	head := max / 2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	start := len(s) - max/2
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	return s[:head] + fmt.Sprintf(marker, start-head) + s[start:]
}
