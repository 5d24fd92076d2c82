package kernel

import (
	"fmt"
	"strings"
)

// capture keeps the head and the tail of a stream of text, counting what it
// drops in between, so a flood of output cannot exhaust memory and the end of
// the output (often a traceback) is never lost.
type capture struct {
	limit   int // head and tail get half each
	head    strings.Builder
	tail    []byte // ring buffer of the last limit/2 bytes
	start   int    // index of the oldest byte in tail once full
	full    bool
	dropped int64
}

func (c *capture) write(s string) {
	half := c.limit / 2
	if n := half - c.head.Len(); n > 0 {
		if len(s) <= n {
			c.head.WriteString(s)
			return
		}
		c.head.WriteString(s[:n])
		s = s[n:]
	}
	if half <= 0 {
		c.dropped += int64(len(s))
		return
	}
	for len(s) > 0 {
		if !c.full {
			n := min(half-len(c.tail), len(s))
			c.tail = append(c.tail, s[:n]...)
			s = s[n:]
			if len(c.tail) == half {
				c.full = true
			}
			continue
		}
		// Overwrite the oldest bytes.
		n := min(half-c.start, len(s))
		c.dropped += int64(n)
		copy(c.tail[c.start:], s[:n])
		c.start = (c.start + n) % half
		s = s[n:]
	}
}

func (c *capture) truncated() bool { return c.dropped > 0 }

func (c *capture) String() string {
	var b strings.Builder
	b.WriteString(c.head.String())
	if c.dropped > 0 {
		fmt.Fprintf(&b, "\n[... %d bytes dropped ...]\n", c.dropped)
	}
	if c.full {
		b.Write(c.tail[c.start:])
		b.Write(c.tail[:c.start])
	} else {
		b.Write(c.tail)
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
