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

// chunkReader reads a sequence of chunks, fetching up to ahead of them
// in parallel, each verified before any of its bytes is returned.
type chunkReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan chan result
	cur    []byte
	err    error
}

type result struct {
	b   []byte
	err error
}

func (s *Store) newChunkReader(ctx context.Context, id string, cs []Chunk, of string) *chunkReader {
	ctx, cancel := context.WithCancel(ctx)
	r := &chunkReader{ctx: ctx, cancel: cancel, slots: make(chan chan result, s.opts.Workers)}
	go func() {
		defer close(r.slots)
		for _, c := range cs {
			slot := make(chan result, 1)
			select {
			case r.slots <- slot:
			case <-ctx.Done():
				return
			}
			go func() {
				b, err := s.readBlob(ctx, id, c, of)
				slot <- result{b, err}
			}()
		}
	}()
	return r
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		slot, ok := <-r.slots
		if !ok {
			if r.err = r.ctx.Err(); r.err == nil {
				r.err = io.EOF
			}
			return 0, r.err
		}
		res := <-slot
		if res.err != nil {
			r.err = res.err
			r.cancel()
			return 0, r.err
		}
		r.cur = res.b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *chunkReader) Close() error {
	r.cancel()
	for slot := range r.slots { // let the fetchers end
		<-slot
	}
	return nil
}

// OpenState returns owner's snapshot id's kernel state stream (nil if it
// has none) and its manifest. Each chunk is verified before any of its
// bytes is read; a corrupt one ends the stream with a *CorruptError.
func (s *Store) OpenState(ctx context.Context, owner, id string) (io.ReadCloser, *Manifest, error) {
	m, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	if m.State == nil {
		return nil, m, nil
	}
	return s.newChunkReader(ctx, id, m.State.Chunks, "kernel state"), m, nil
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
	m, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range m.Files {
		if err := checkPath(f.Path); err != nil {
			return nil, nil, &CorruptError{Snapshot: id, Object: manifestKey(owner, id), Of: "manifest", Reason: err.Error()}
		}
	}
	if ws, ok := dst.(*workspace.Workspace); ok {
		b, err := ws.Bulk() // counts usage instead of walking the workspace per file
		if err != nil {
			return nil, nil, fmt.Errorf("restore %s: %w", id, err)
		}
		dst = b
	}
	stage := ".sandloop-restore-" + strings.ToLower(rand.Text()[:12])
	if err := dst.Mkdir(stage); err != nil {
		return nil, nil, fmt.Errorf("restore %s: %w", id, err)
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
			return nil, nil, err
		}
		p := stage + "/" + f.Path
		switch f.Type {
		case "dir":
			if err := dst.Mkdir(p); err != nil {
				return nil, nil, fmt.Errorf("restore %s: %w", f.Path, err)
			}
			dirs = append(dirs, f)
			res.Dirs++
		case "symlink":
			if err := dst.Symlink(f.Target, p); err != nil {
				return nil, nil, fmt.Errorf("restore %s: %w", f.Path, err)
			}
			res.Symlinks++
		case "file":
			r := s.newChunkReader(ctx, id, f.Chunks, "file "+f.Path)
			n, err := dst.Write(p, r)
			r.Close()
			var ce *CorruptError
			if errors.As(err, &ce) {
				return nil, nil, ce
			}
			if err == nil && n != f.Size {
				err = &CorruptError{Snapshot: id, Object: manifestKey(owner, id), Of: "file " + f.Path, Reason: fmt.Sprintf("%d bytes read, the manifest says %d", n, f.Size)}
			}
			if err == nil {
				err = dst.Chmod(p, f.Mode)
			}
			if err == nil && times != nil {
				err = times.Chtimes(p, f.ModTime)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("restore %s: %w", f.Path, err)
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
			return nil, nil, fmt.Errorf("restore %s: %w", f.Path, err)
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
			return nil, nil, fmt.Errorf("restore %s: %w", top, err)
		}
	}
	if err := dst.Remove(stage); err != nil {
		return nil, nil, fmt.Errorf("restore %s: %w", id, err)
	}
	return m, res, nil
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
