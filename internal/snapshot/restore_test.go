package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// gettingBackend is the directory backend, keeping the keys of the blobs
// read.
type gettingBackend struct {
	*Dir
	mu   sync.Mutex
	gets []string
}

func (g *gettingBackend) Get(ctx context.Context, key string, maxBytes int64) ([]byte, error) {
	if strings.HasPrefix(key, "blobs/") {
		g.mu.Lock()
		g.gets = append(g.gets, key)
		g.mu.Unlock()
	}
	return g.Dir.Get(ctx, key, maxBytes)
}

func (g *gettingBackend) got() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.gets...)
}

// TestReadingReadsAhead: a Reading reads the files' blobs, then the
// state's, before they are asked for, but no more than ReadAhead bytes
// ahead; Restore and State then give back the files and the state
// exactly; a corrupt state blob ends the state stream with a
// *CorruptError after the files are in place, and a Restore that failed
// makes State fail too.
func TestReadingReadsAhead(t *testing.T) {
	ctx := context.Background()
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &gettingBackend{Dir: d}
	const ahead = 3 << 20
	s := newStore(t, b, &Options{ReadAhead: ahead})
	w, dir := newWorkspace(t)
	for i := range 8 {
		mustWrite(t, filepath.Join(dir, fmt.Sprintf("f%d.bin", i)), randBytes(uint64(60+i), 1<<20), 0o644)
	}
	state := randBytes(70, 5<<20)
	m, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{State: stateOf(state)})
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	m.eachChunk(func(c Chunk, _ string) { sizes[blobKey(c.Hash)] = c.Size })

	r, err := s.Open(ctx, "o", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Nothing is consumed yet: the reading stops at ReadAhead.
	fetched := func() (n int64) {
		for _, k := range b.got() {
			n += sizes[k]
		}
		return n
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := fetched(); n < ahead-maxChunk {
			return fmt.Errorf("%d bytes read ahead", n)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // a reading past the bound would show by now
	if n := fetched(); n > ahead {
		t.Fatalf("%d bytes read ahead of a consumer that took nothing, with ReadAhead %d", n, ahead)
	}

	w2, dir2 := newWorkspace(t)
	if _, err := r.Restore(ctx, w2); err != nil {
		t.Fatal(err)
	}
	diffTrees(t, tree(t, dir), tree(t, dir2))
	if _, err := r.Restore(ctx, w2); err == nil {
		t.Fatal("a second Restore of one Reading worked")
	}
	st := r.State()
	got, err := io.ReadAll(st)
	if err != nil || !bytes.Equal(got, state) {
		t.Fatalf("state: %d bytes, %v", len(got), err)
	}
	st.Close()

	// A corrupt state blob: the files come back, the state stream fails.
	sk := blobKey(m.State.Chunks[len(m.State.Chunks)-1].Hash)
	orig, _ := b.Dir.Get(ctx, sk, 8<<20)
	bad := bytes.Clone(orig)
	bad[len(bad)-1] ^= 1
	if err := b.Put(ctx, sk, bad); err != nil {
		t.Fatal(err)
	}
	r, err = s.Open(ctx, "o", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w3, dir3 := newWorkspace(t)
	if _, err := r.Restore(ctx, w3); err != nil {
		t.Fatal(err)
	}
	diffTrees(t, tree(t, dir), tree(t, dir3))
	_, err = io.ReadAll(r.State())
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Of != "kernel state" || ce.Object != sk {
		t.Fatalf("a corrupt state blob: %v", err)
	}
	b.Put(ctx, sk, orig)

	// A Restore that fails (a file blob missing): State fails too.
	fk := blobKey(m.Files[0].Chunks[0].Hash)
	fo, _ := b.Dir.Get(ctx, fk, 8<<20)
	b.Delete(ctx, fk)
	r, err = s.Open(ctx, "o", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w4, dir4 := newWorkspace(t)
	if _, err := r.Restore(ctx, w4); !errors.As(err, &ce) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("restore with a blob missing: %v", err)
	}
	if n := len(tree(t, dir4)); n != 0 {
		t.Fatalf("%d entries restored by a refused restore", n)
	}
	if _, err := io.ReadAll(r.State()); err == nil {
		t.Fatal("the state of a reading whose restore failed was read")
	}
	b.Put(ctx, fk, fo)
}

// TestWriteStateAndFilesStopEachOther: the kernel's state streams while
// the files are walked; a file that fails stops the state's stream (its
// StateFunc sees its context end), a state that fails stops the walk, and
// neither leaves a snapshot.
func TestWriteStateAndFilesStopEachOther(t *testing.T) {
	ctx := context.Background()
	b, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, nil)
	w, dir := newWorkspace(t)
	files50(t, dir)

	// A state that streams until it is stopped, and a file that fails.
	stopped := make(chan error, 1)
	endless := func(ctx context.Context, w io.Writer) (any, error) {
		buf := randBytes(80, 1<<20)
		for {
			if _, err := w.Write(buf); err != nil {
				stopped <- ctx.Err()
				return nil, err
			}
		}
	}
	_, err = s.Write(ctx, "o", &failingSource{Source: WorkspaceSource(w), n: 5}, &WriteOptions{State: endless})
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("write with a failing file and an endless state: %v", err)
	}
	if e := <-stopped; e == nil {
		t.Fatal("the state's stream stopped but its context was not done")
	}

	// A state that fails: the walk stops (the first file's Open waits for
	// the Write's context to end, which only the state's failure ends).
	src := &waitingSource{Source: WorkspaceSource(w)}
	failing := func(ctx context.Context, w io.Writer) (any, error) {
		w.Write(randBytes(81, 3<<20))
		return nil, errors.New("the kernel died (injected)")
	}
	_, err = s.Write(ctx, "o", src, &WriteOptions{State: failing})
	if err == nil || !strings.Contains(err.Error(), "kernel's state") || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("write with a failing state: %v", err)
	}
	if src.opened != 1 || !src.ended {
		t.Fatalf("the walk opened %d files (its context ended: %v)", src.opened, src.ended)
	}
	if ls := mustList(t, s, "o"); len(ls) != 0 {
		t.Fatalf("%d snapshots after failed writes", len(ls))
	}
}

// waitingSource's first Open waits for the walk's context to end (for a
// minute at most), and counts the files opened.
type waitingSource struct {
	Source
	ctx    context.Context
	opened int
	ended  bool
}

func (w *waitingSource) Walk(ctx context.Context, fn func(Entry) error) error {
	w.ctx = ctx
	return w.Source.Walk(ctx, fn)
}

func (w *waitingSource) Open(p string) (io.ReadCloser, error) {
	if w.opened++; w.opened == 1 {
		select {
		case <-w.ctx.Done():
			w.ended = true
		case <-time.After(time.Minute):
		}
	}
	return w.Source.Open(p)
}
