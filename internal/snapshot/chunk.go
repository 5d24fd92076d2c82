package snapshot

import (
	"io"
)

// Content-defined chunking (a gear hash, as FastCDC): a cut is made where
// the rolling hash of the last bytes has its low bits zero, so cuts follow
// the content, not offsets. A change in the middle of a file (even an
// insertion, which shifts everything after it) changes only the chunks
// around it; the others keep their hashes and are not stored again.
const (
	minChunk = 128 << 10         // no cut before: the bytes up to it are not even hashed
	maxChunk = 2 << 20           // a cut here at the latest
	cutMask  = (1<<19 - 1) << 45 // 19 high bits (they depend on the last 64 bytes): ~512 KiB between min and the cut on average
)

// Why these sizes: a change rewrites the chunks it touches and the ones
// up to the next cut after it, so what a 1 MB change costs grows with the
// chunks' size. A 1 MiB random overwrite at 30 random places of a 20 MiB
// random file rewrote 1.4 to 6.2 MiB (mean 3.1) with 256 KiB-4 MiB chunks,
// 1.1 to 3.4 MiB (mean 2.0) with these: the issue bounds it at 5 MB.
// Smaller ones would cost more objects (requests to S3) for little.

// gear is fixed forever (a fixed seed): changing it changes every cut,
// which stays correct but stops deduplicating against older snapshots.
var gear = func() (g [256]uint64) {
	x := uint64(0x5a17_1005_c0de_2026)
	for i := range g {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		g[i] = z ^ (z >> 31)
	}
	return g
}()

// cut returns the length of the first chunk of b (all of b if b holds no
// cut and is shorter than maxChunk).
func cut(b []byte) int {
	n := len(b)
	if n <= minChunk {
		return n
	}
	if n > maxChunk {
		n = maxChunk
	}
	var h uint64
	for i := minChunk; i < n; i++ {
		h = h<<1 + gear[b[i]]
		if h&cutMask == 0 {
			return i + 1
		}
	}
	return n
}

// chunker splits a stream into content-defined chunks.
type chunker struct {
	r   io.Reader
	buf []byte
	n   int // bytes of buf in use
	eof bool
}

func newChunker(r io.Reader) *chunker {
	return &chunker{r: r, buf: make([]byte, maxChunk)}
}

// reset starts on r, keeping the buffer (a 4 MiB allocation per small
// file made a snapshot of thousands of them crawl).
func (c *chunker) reset(r io.Reader) {
	c.r, c.n, c.eof = r, 0, false
}

// next returns the next chunk as a fresh slice (the caller may keep it)
// after rawHead bytes of room (encodeBlob's), or io.EOF after the last one.
func (c *chunker) next() ([]byte, error) {
	for !c.eof && c.n < len(c.buf) {
		m, err := c.r.Read(c.buf[c.n:])
		c.n += m
		if err == io.EOF {
			c.eof = true
		} else if err != nil {
			return nil, err
		}
	}
	if c.n == 0 {
		return nil, io.EOF
	}
	k := cut(c.buf[:c.n])
	out := make([]byte, rawHead+k)
	copy(out[rawHead:], c.buf[:k])
	c.n = copy(c.buf, c.buf[k:c.n])
	return out, nil
}
