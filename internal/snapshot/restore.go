package snapshot

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/workspace"
)

// readBlob returns chunk c's bytes, verified: decompressed, of the
// recorded size, hashing to its address.
func (s *Store) readBlob(ctx context.Context, id string, c Chunk, of string) ([]byte, error) {
	key := blobKey(c.Hash)
	bad := func(reason string) error {
		return &CorruptError{Snapshot: id, Object: key, Of: of, Reason: reason}
	}
	if len(c.Hash) != 64 {
		return nil, bad("the manifest names a blob with a malformed address")
	}
	z, err := s.b.Get(ctx, key, maxChunk+maxChunk/8+1<<16)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, bad("a blob is missing")
		}
		return nil, err
	}
	b, err := s.decodeBlob(z, c.Size)
	if err != nil {
		return nil, bad("a blob cannot be decompressed: " + err.Error())
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != c.Hash || int64(len(b)) != c.Size {
		return nil, bad("a blob does not match its checksum")
	}
	return b, nil
}

// fetcher reads a sequence of chunks (a snapshot's files', then its
// state's) for one consumer, in order: Workers blobs at once, up to
// ReadAhead bytes ahead of the consumer, each verified before any of its
// bytes is handed out. It starts at once, so a restore reads, decompresses
// and verifies while its consumer does something else (a new session
// starts, a file is written, the kernel loads the variables).
type fetcher struct {
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan *slot // in order
	room   chan struct{}
	err    error // the first the consumer saw
}

type ref struct {
	c  Chunk
	of string
}

type slot struct {
	c    Chunk
	done chan struct{}
	b    []byte
	err  error
}

// aheadUnit is the grain of the read-ahead budget (fetcher.room's tokens).
const aheadUnit = 64 << 10

func units(size int64) int { return int(max(1, (size+aheadUnit-1)/aheadUnit)) }

func (s *Store) fetch(ctx context.Context, id string, refs []ref) *fetcher {
	ctx, cancel := context.WithCancel(ctx)
	room := max(int(s.opts.ReadAhead/aheadUnit), units(maxChunk))
	// A slot holds at least a unit of room: the channel never fills.
	f := &fetcher{ctx: ctx, cancel: cancel, slots: make(chan *slot, room), room: make(chan struct{}, room)}
	go func() {
		defer close(f.slots)
		workers := make(chan struct{}, s.opts.Workers)
		for _, r := range refs {
			// Room for the chunk first: the consumer gives it back as it
			// takes chunks, in order, so this never waits for a later one.
			for range units(r.c.Size) {
				select {
				case f.room <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			select {
			case workers <- struct{}{}:
			case <-ctx.Done():
				return
			}
			sl := &slot{c: r.c, done: make(chan struct{})}
			f.slots <- sl // never blocks: one place per chunk
			go func() {
				defer close(sl.done)
				sl.b, sl.err = s.readBlob(ctx, id, r.c, r.of)
				<-workers
			}()
		}
	}()
	return f
}

// next returns the next chunk's bytes (verified), io.EOF after the last.
func (f *fetcher) next() ([]byte, error) {
	if f.err != nil {
		return nil, f.err
	}
	sl, ok := <-f.slots
	if !ok {
		if f.err = f.ctx.Err(); f.err == nil {
			f.err = io.EOF
		}
		return nil, f.err
	}
	<-sl.done
	for range units(sl.c.Size) {
		<-f.room
	}
	if sl.err != nil {
		f.err = sl.err
		f.cancel()
		return nil, f.err
	}
	return sl.b, nil
}

// close stops the fetching and waits for the reads under way to end.
func (f *fetcher) close() {
	f.cancel()
	for sl := range f.slots {
		<-sl.done
	}
}

// chunkReader reads the next n chunks of a fetcher as one stream.
type chunkReader struct {
	f    *fetcher
	left int
	cur  []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.left == 0 {
			return 0, io.EOF
		}
		b, err := r.f.next()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // fewer chunks than announced: not possible unless stopped
		}
		if err != nil {
			return 0, err
		}
		r.left--
		r.cur = b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// WriteTo writes whole chunks (a file's write per chunk, not per 32 KiB).
func (r *chunkReader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for {
		if len(r.cur) == 0 {
			if r.left == 0 {
				return n, nil
			}
			b, err := r.f.next()
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return n, err
			}
			r.left--
			r.cur = b
		}
		k, err := w.Write(r.cur)
		n += int64(k)
		r.cur = r.cur[k:]
		if err != nil {
			return n, err
		}
	}
}

// stateReader is the state stream of a Reading: it ends the fetching when
// closed.
type stateReader struct {
	chunkReader
	close func()
}

func (r *stateReader) Close() error {
	r.close()
	return nil
}

// Reading is a restore of one snapshot under way (Open): its blobs are
// read ahead, in the order they are used: its files' (Restore), then its
// state's (State).
type Reading struct {
	s        *Store
	m        *Manifest
	f        *fetcher
	files    bool // Restore is still to come
	once     sync.Once
	restored bool
}

// Open starts reading owner's snapshot id: its files' blobs, then its
// state's, ahead of Restore and State, which take them in that order
// (Restore first). It fails as Get does. Close ends it.
func (s *Store) Open(ctx context.Context, owner, id string) (*Reading, error) {
	return s.open(ctx, owner, id, true, true)
}

func (s *Store) open(ctx context.Context, owner, id string, files, state bool) (*Reading, error) {
	m, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if files {
		for _, f := range m.Files {
			if err := checkPath(f.Path); err != nil {
				return nil, &CorruptError{Snapshot: id, Object: manifestKey(owner, id), Of: "manifest", Reason: err.Error()}
			}
		}
	}
	var refs []ref
	if files {
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				refs = append(refs, ref{c, "file " + f.Path})
			}
		}
	}
	if state && m.State != nil {
		for _, c := range m.State.Chunks {
			refs = append(refs, ref{c, "kernel state"})
		}
	}
	return &Reading{s: s, m: m, f: s.fetch(ctx, id, refs), files: files}, nil
}

// Manifest is the snapshot's manifest.
func (r *Reading) Manifest() *Manifest { return r.m }

// Close ends the reading (its state stream too).
func (r *Reading) Close() {
	r.once.Do(r.f.close)
}

// OpenState returns owner's snapshot id's kernel state stream (nil if it
// has none) and its manifest. Each chunk is verified before any of its
// bytes is read; a corrupt one ends the stream with a *CorruptError.
func (s *Store) OpenState(ctx context.Context, owner, id string) (io.ReadCloser, *Manifest, error) {
	r, err := s.open(ctx, owner, id, false, true)
	if err != nil {
		return nil, nil, err
	}
	st := r.State()
	if st == nil {
		r.Close()
		return nil, r.m, nil
	}
	return st, r.m, nil
}

// State returns the snapshot's kernel state stream (nil if it has none),
// after Restore; its chunks have been read ahead meanwhile. Each is
// verified before any of its bytes is read; a corrupt one ends the stream
// with a *CorruptError. Closing it closes the Reading.
func (r *Reading) State() io.ReadCloser {
	if r.m.State == nil {
		return nil
	}
	if r.files && !r.restored {
		// No Restore: skip the files' chunks.
		r.restored = true
		for _, f := range r.m.Files {
			for range f.Chunks {
				if _, err := r.f.next(); err != nil {
					break
				}
			}
		}
	}
	return &stateReader{chunkReader{f: r.f, left: len(r.m.State.Chunks)}, r.Close}
}

// Verify reads every blob of owner's snapshot id and checks it, without
// writing anything.
func (s *Store) Verify(ctx context.Context, owner, id string) (*Manifest, error) {
	m, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	var all []Chunk
	var ofs []string
	m.eachChunk(func(c Chunk, of string) { all = append(all, c); ofs = append(ofs, of) })
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range s.opts.Workers {
		wg.Go(func() {
			for i := range next {
				if _, err := s.readBlob(ctx, id, all[i], ofs[i]); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range all {
		next <- i
	}
	close(next)
	wg.Wait()
	return m, first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// Restored says what Restore wrote.
type Restored struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
}

// Restore writes the files of owner's snapshot id into dst (the kernel's
// state is read with OpenState). Entries of dst whose names the snapshot's
// top level also has are replaced; others are left alone (dst is usually a
// new, empty workspace). Everything is first written into a staging
// directory of dst and verified; only then moved into place. On any error
// (a corrupt blob: a *CorruptError) dst is as it was.
func (s *Store) Restore(ctx context.Context, owner, id string, dst Dest) (*Manifest, *Restored, error) {
	r, err := s.open(ctx, owner, id, true, false)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	res, err := r.Restore(ctx, dst)
	if err != nil {
		return nil, nil, err
	}
	return r.m, res, nil
}

// Restore is Store.Restore of the snapshot being read, whose files'
// blobs have been read ahead meanwhile. It comes before State, once.
func (r *Reading) Restore(ctx context.Context, dst Dest) (_ *Restored, err error) {
	if !r.files || r.restored {
		return nil, errors.New("snapshot restore: the files were restored already, or not asked for")
	}
	r.restored = true
	defer func() {
		if err != nil && r.f.err == nil { // where the next chunk is is not known: State fails too
			r.f.err = fmt.Errorf("the snapshot's files were not restored: %w", err)
			r.f.cancel()
		}
	}()
	m, id := r.m, r.m.ID
	if ws, ok := dst.(*workspace.Workspace); ok {
		b, err := ws.Bulk() // counts usage instead of walking the workspace per file
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", id, err)
		}
		dst = b
	}
	stage := ".sandloop-restore-" + strings.ToLower(rand.Text()[:12])
	if err := dst.Mkdir(stage); err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = dst.Remove(stage)
		}
	}()
	res := &Restored{}
	times, _ := dst.(interface {
		Chtimes(p string, t time.Time) error
	})
	var dirs []File
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p := stage + "/" + f.Path
		switch f.Type {
		case "dir":
			if err := dst.Mkdir(p); err != nil {
				return nil, fmt.Errorf("restore %s: %w", f.Path, err)
			}
			dirs = append(dirs, f)
			res.Dirs++
		case "symlink":
			if err := dst.Symlink(f.Target, p); err != nil {
				return nil, fmt.Errorf("restore %s: %w", f.Path, err)
			}
			res.Symlinks++
		case "file":
			n, err := dst.Write(p, &chunkReader{f: r.f, left: len(f.Chunks)})
			var ce *CorruptError
			if errors.As(err, &ce) {
				return nil, ce
			}
			if err == nil && n != f.Size {
				err = &CorruptError{Snapshot: id, Object: manifestKey(m.Owner, id), Of: "file " + f.Path, Reason: fmt.Sprintf("%d bytes read, the manifest says %d", n, f.Size)}
			}
			if err == nil {
				err = dst.Chmod(p, f.Mode)
			}
			if err == nil && times != nil {
				err = times.Chtimes(p, f.ModTime)
			}
			if err != nil {
				return nil, fmt.Errorf("restore %s: %w", f.Path, err)
			}
			res.Files++
			res.Bytes += n
		}
	}
	// Directories last, deepest first: a read-only one would refuse its
	// contents, and writing into one moves its mtime.
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].Path > dirs[j].Path })
	for _, f := range dirs {
		p := stage + "/" + f.Path
		err := dst.Chmod(p, f.Mode)
		if err == nil && times != nil {
			err = times.Chtimes(p, f.ModTime)
		}
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", f.Path, err)
		}
	}
	// Every file is there and verified: move the top level into place.
	tops := map[string]bool{}
	for _, f := range m.Files {
		top, _, _ := strings.Cut(f.Path, "/")
		tops[top] = true
	}
	committed = true
	for top := range tops {
		_ = dst.Remove(top) // replaced
		if err := dst.Rename(stage+"/"+top, top); err != nil {
			return nil, fmt.Errorf("restore %s: %w", top, err)
		}
	}
	if err := dst.Remove(stage); err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	return res, nil
}

// checkPath refuses a manifest path that could lead out of the staging
// directory (a manifest edited by hand: the destination's os.Root would
// refuse it too).
func checkPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == ".." || strings.ContainsRune(p, 0) {
		return fmt.Errorf("the manifest holds a bad path %q", p)
	}
	return nil
}
