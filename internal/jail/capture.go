package jail

import (
	"bytes"
	"fmt"
	"sync"
)

// Capture is an io.Writer that keeps the first Head bytes and the last Tail
// bytes written to it and counts what fell in between, so a flood cannot
// exhaust memory and the end of the output (where a traceback usually is)
// is never lost. It is safe for concurrent use.
type Capture struct {
	mu      sync.Mutex
	headCap int
	tailCap int
	head    []byte
	tail    []byte // ring buffer of tailCap bytes
	tailPos int    // next write position in tail once it is full
	full    bool
	total   int64
}

// NewCapture returns a Capture keeping head bytes from the start and tail
// bytes from the end. If both are zero, 64 KiB each.
func NewCapture(head, tail int) *Capture {
	if head == 0 && tail == 0 {
		head, tail = 64<<10, 64<<10
	}
	return &Capture{headCap: head, tailCap: tail}
}

// Write never fails and never blocks on the size of p.
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	c.total += int64(n)
	if room := c.headCap - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 || c.tailCap == 0 {
		return n, nil
	}
	if len(p) >= c.tailCap {
		// Only the last tailCap bytes can survive.
		if c.tail == nil {
			c.tail = make([]byte, c.tailCap)
		}
		copy(c.tail, p[len(p)-c.tailCap:])
		c.tailPos, c.full = 0, true
		return n, nil
	}
	if !c.full {
		if c.tail == nil {
			c.tail = make([]byte, 0, c.tailCap)
		}
		room := c.tailCap - len(c.tail)
		if len(p) <= room {
			c.tail = append(c.tail, p...)
			if len(c.tail) == c.tailCap {
				c.full, c.tailPos = true, 0
			}
			return n, nil
		}
		c.tail = append(c.tail, p[:room]...)
		p = p[room:]
		c.full, c.tailPos = true, 0
	}
	for len(p) > 0 {
		k := copy(c.tail[c.tailPos:], p)
		p = p[k:]
		c.tailPos = (c.tailPos + k) % c.tailCap
	}
	return n, nil
}

// Total is the number of bytes written.
func (c *Capture) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Dropped is the number of bytes written but not kept.
func (c *Capture) Dropped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total - int64(len(c.head)) - int64(c.tailLen())
}

func (c *Capture) tailLen() int {
	if c.full {
		return c.tailCap
	}
	return len(c.tail)
}

// Head returns the kept beginning of the output.
func (c *Capture) Head() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.head)
}

// Tail returns the kept end of the output (after Head).
func (c *Capture) Tail() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.full {
		return bytes.Clone(c.tail)
	}
	out := make([]byte, 0, c.tailCap)
	out = append(out, c.tail[c.tailPos:]...)
	return append(out, c.tail[:c.tailPos]...)
}

// String returns head and tail joined by a marker that says how many bytes
// were dropped, or the whole output if nothing was.
func (c *Capture) String() string {
	head, tail, dropped := c.Head(), c.Tail(), c.Dropped()
	if dropped == 0 {
		return string(head) + string(tail)
	}
	return fmt.Sprintf("%s\n... [%d bytes truncated] ...\n%s", head, dropped, tail)
}
