package snapshot

import (
	"bytes"
)

// A blob is a chunk as stored: a zstd frame, or, for a chunk zstd would
// not make smaller (random bytes, compressed files, the float columns of
// most arrays), the chunk itself after the 4 bytes of rawMagic, which no
// zstd frame starts with (a frame starts with 28 b5 2f fd, a skippable
// one with 5? 2a 4d 18). A raw blob costs nothing to decompress: on
// restore its bytes are hashed and used where they were read.
var rawMagic = []byte("SLR1")

// rawHead is the room a chunk is read into after, so that a raw blob is
// the chunk's own buffer (no copy).
const rawHead = 4

// Incompressibility is judged on samples (sampleSize bytes at the start,
// middle and end of a chunk) before compressing the whole of it: zstd's
// fastest level spends most of its time on data it then stores as is.
const (
	sampleSize = 32 << 10
	// keepRatio: a sample that compresses to more than this fraction of
	// its size is not worth compressing (the chunk is stored raw).
	keepRatio = 0.97
)

// encodeBlob returns buf (rawHead bytes of room, then the chunk) as a
// blob: compressed, or raw in buf itself.
func (s *Store) encodeBlob(buf []byte) []byte {
	data := buf[rawHead:]
	if len(data) > 3*sampleSize {
		var in, out int
		var tmp []byte
		for _, off := range []int{0, len(data)/2 - sampleSize/2, len(data) - sampleSize} {
			tmp = s.enc.EncodeAll(data[off:off+sampleSize], tmp[:0])
			in, out = in+sampleSize, out+len(tmp)
		}
		if float64(out) > keepRatio*float64(in) {
			return raw(buf)
		}
	}
	z := s.enc.EncodeAll(data, make([]byte, 0, len(data)/2))
	if float64(len(z)) > keepRatio*float64(len(data)) {
		return raw(buf)
	}
	return z
}

func raw(buf []byte) []byte {
	copy(buf, rawMagic)
	return buf
}

// decodeBlob returns the chunk a blob holds, of size bytes (a raw blob's
// bytes are z's own). The caller verifies them.
func (s *Store) decodeBlob(z []byte, size int64) ([]byte, error) {
	if bytes.HasPrefix(z, rawMagic) {
		return z[len(rawMagic):], nil
	}
	return s.dec.DecodeAll(z, make([]byte, 0, size))
}
