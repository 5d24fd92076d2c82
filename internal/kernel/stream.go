package kernel

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// maxSeqDigits bounds the digits of a marker's sequence number; a longer
// candidate is user output that happens to start like a marker.
const maxSeqDigits = 19

// splitter cuts the bytes read from one of the kernel's output pipes into
// text and ordering markers ("\x1b]sl;TOKEN;SEQ\x07"). Bytes that might be
// the start of a marker or of a UTF-8 character are held back until more
// bytes arrive; every marker releases everything before it.
type splitter struct {
	prefix []byte
	buf    []byte
}

func newSplitter(token string) *splitter {
	return &splitter{prefix: []byte("\x1b]sl;" + token + ";")}
}

// feed consumes p, calling text for output and mark for each marker.
func (s *splitter) feed(p []byte, text func([]byte), mark func(int64)) {
	s.buf = append(s.buf, p...)
	b := s.buf
	for len(b) > 0 {
		i := bytes.Index(b, s.prefix)
		if i < 0 {
			cut := len(b) - partialPrefix(b, s.prefix)
			cut = runeBoundary(b[:cut])
			if cut > 0 {
				text(b[:cut])
			}
			b = b[cut:]
			break
		}
		if i > 0 {
			text(b[:i])
		}
		rest := b[i+len(s.prefix):]
		j := bytes.IndexByte(rest, '\a')
		if j < 0 && len(rest) <= maxSeqDigits {
			b = b[i:] // wait for the rest of the marker
			break
		}
		seq, err := int64(0), error(nil)
		if j >= 0 && j <= maxSeqDigits {
			seq, err = strconv.ParseInt(string(rest[:j]), 10, 64)
		}
		if j < 0 || j > maxSeqDigits || err != nil {
			// Looked like a marker but is not one: it is output.
			text(b[i : i+len(s.prefix)])
			b = rest
			continue
		}
		mark(seq)
		b = rest[j+1:]
	}
	s.buf = append(s.buf[:0], b...)
}

// flush releases whatever is held back (at end of stream).
func (s *splitter) flush(text func([]byte)) {
	if len(s.buf) > 0 {
		text(s.buf)
		s.buf = s.buf[:0]
	}
}

// partialPrefix returns the length of the longest suffix of b that is a
// proper prefix of prefix.
func partialPrefix(b, prefix []byte) int {
	n := min(len(b), len(prefix)-1)
	for ; n > 0; n-- {
		if bytes.Equal(b[len(b)-n:], prefix[:n]) {
			return n
		}
	}
	return 0
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
