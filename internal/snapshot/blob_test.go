package snapshot

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestBlobEncodings: chunks that zstd would not shrink (random bytes) are
// stored raw (and tiny ones, which a frame would lengthen), compressible
// ones compressed, and both come back exact; a
// blob in the format of the first snapshots (a zstd frame with its
// checksum) still reads; a raw blob whose marker or bytes are damaged is
// refused as corrupt.
func TestBlobEncodings(t *testing.T) {
	ctx := context.Background()
	b, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, nil)
	w, dir := newWorkspace(t)
	random := randBytes(41, 3<<20)
	text := []byte(strings.Repeat("id,name,price\n17,widget,3.50\n", 3<<20/30))
	// Random with a compressible middle: the samples see it, so it is compressed.
	mixed := bytes.Clone(randBytes(42, 600<<10))
	copy(mixed[200<<10:], bytes.Repeat([]byte("z"), 300<<10))
	mustWrite(t, filepath.Join(dir, "random.bin"), random, 0o644)
	mustWrite(t, filepath.Join(dir, "text.csv"), text, 0o644)
	mustWrite(t, filepath.Join(dir, "mixed.bin"), mixed, 0o644)
	mustWrite(t, filepath.Join(dir, "small.txt"), []byte("hello"), 0o644)
	m, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
	if err != nil {
		t.Fatal(err)
	}
	blob := func(c Chunk) []byte {
		z, err := b.Get(ctx, blobKey(c.Hash), 8<<20)
		if err != nil {
			t.Fatal(err)
		}
		return z
	}
	for _, f := range m.Files {
		if f.Type != "file" {
			continue
		}
		for _, c := range f.Chunks {
			z := blob(c)
			isRaw := bytes.HasPrefix(z, rawMagic)
			wantRaw := f.Path == "random.bin" || f.Path == "small.txt" // a zstd frame of 5 bytes is longer
			if isRaw != wantRaw {
				t.Errorf("%s: a chunk of %d bytes stored in %d, raw %v, want raw %v", f.Path, c.Size, len(z), isRaw, wantRaw)
			}
			if isRaw && int64(len(z)) != c.Size+int64(len(rawMagic)) {
				t.Errorf("%s: a raw blob of %d bytes for a chunk of %d", f.Path, len(z), c.Size)
			}
			if !isRaw && !bytes.HasPrefix(z, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
				t.Errorf("%s: a blob neither raw nor a zstd frame: % x", f.Path, z[:4])
			}
		}
	}
	restore := func() (string, error) {
		w2, dir2 := newWorkspace(t)
		_, _, err := s.Restore(ctx, "o", m.ID, w2)
		return dir2, err
	}
	dir2, err := restore()
	if err != nil {
		t.Fatal(err)
	}
	diffTrees(t, tree(t, dir), tree(t, dir2))

	// The first snapshots' format: zstd frames with their checksums.
	old, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	var textChunk, rawChunk Chunk
	for _, f := range m.Files {
		switch f.Path {
		case "text.csv":
			textChunk = f.Chunks[0]
		case "random.bin":
			rawChunk = f.Chunks[0]
		}
	}
	for _, c := range []Chunk{textChunk, rawChunk} {
		data, err := s.readBlob(ctx, m.ID, c, "test")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, blobKey(c.Hash), old.EncodeAll(data, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if dir2, err = restore(); err != nil {
		t.Fatalf("restore of blobs in the old format: %v", err)
	}
	diffTrees(t, tree(t, dir), tree(t, dir2))

	// A damaged raw blob: its marker, a byte of its data, its tail.
	key := blobKey(rawChunk.Hash)
	good := append(bytes.Clone(rawMagic), random[:rawChunk.Size]...)
	if err := b.Put(ctx, key, good); err != nil {
		t.Fatal(err)
	}
	marker, flipped := bytes.Clone(good), bytes.Clone(good)
	marker[1] ^= 1
	flipped[len(flipped)/2] ^= 4
	for name, z := range map[string][]byte{"marker": marker, "flipped": flipped, "truncated": good[:len(good)-1]} {
		if err := b.Put(ctx, key, z); err != nil {
			t.Fatal(err)
		}
		dir2, err := restore()
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Object != key || ce.Of != "file random.bin" {
			t.Fatalf("%s raw blob: restore error %v", name, err)
		}
		if des, _ := os.ReadDir(dir2); len(des) != 0 {
			t.Fatalf("%s raw blob: %d entries restored", name, len(des))
		}
	}
}
