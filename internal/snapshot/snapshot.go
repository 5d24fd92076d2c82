// Package snapshot keeps durable snapshots of sessions (a workspace's files
// and a kernel's serialized variables) in storage that outlives the host:
// a directory (by default <data-dir>/snapshots, or a ReadWriteMany volume
// shared by a cell) or an S3-compatible bucket. One Store, two Backends.
//
// # Layout
//
// A snapshot is a manifest and blobs. Every file and the kernel's state
// stream are cut into content-defined chunks (128 KiB to 2 MiB, ~640 KiB
// on average, chunk.go); each chunk is one blob, compressed with zstd (or
// stored as is when zstd would not make it smaller: blob.go) under its
// address, the SHA-256 of its uncompressed bytes (blobs/ab/abcd…). A chunk already stored, by this snapshot or any
// other, of any owner, is not stored again: the 50th snapshot of a mostly
// unchanged workspace writes only the chunks around the changes. The
// manifest (manifests/<owner key>/<id>.json: JSON after a line holding
// its own SHA-256) lists the files (path, type, mode, size, mtime, symlink
// target, chunks), the state's chunks and the kernel's own manifest of it
// (variables saved and not saved), and the byte counts.
//
// # Guarantees
//
//   - Atomic: blobs are written first, the manifest last, in one atomic
//     step (rename in a directory, one PUT in S3). A crash or an error
//     mid-write leaves no manifest, so the new snapshot does not exist and
//     every earlier one is untouched (blobs are never changed in place:
//     same address, same bytes). The blobs it left are garbage collected.
//
//   - Checksummed: every blob is verified on read (decompressed and
//     hashed against its address), and the manifest against its header
//     line. A corrupted or missing blob or manifest is refused with a
//     *CorruptError naming the snapshot, the object and the file it
//     belongs to. Restore builds the files in a staging directory of the
//     destination and moves them into place only when every one of them
//     was verified and written: never half-restored. A restore reads its
//     blobs ahead of their use (Options.ReadAhead), Workers at once. The state stream is
//     handed out chunk by chunk, each verified before any of its bytes is
//     (a consumer that fails on a corrupt stream must discard what it
//     loaded; the session layer loads it into a new kernel).
//
//   - Isolated: a snapshot belongs to its owner; another owner's id is
//     ErrNotFound, never "forbidden" (ids are not confirmed to exist).
//     Owner names are not in storage keys (a hash is).
//
//   - Bounded: Options.Quota caps the bytes (compressed) of the distinct
//     blobs that one owner's snapshots reference; a Write over it fails
//     with a *QuotaError before its manifest is written. Retention
//     (Options.MaxAge, Options.MaxPerSession) is enforced by Maintain,
//     which the host calls periodically.
//
//   - Garbage collection is mark and sweep (Collect): blobs that no
//     manifest references, and that are older than the collection's start,
//     are deleted. It is safe against concurrent Writes from any host
//     sharing the storage: a Write holds a lock object while it runs, a
//     collection holds one too, and each looks for the other's after
//     taking its own (a collection that finds a Write gives up its turn;
//     a Write that finds a collection waits for it), so a Write never
//     commits a manifest that references a blob a collection just swept.
//     Locks are refreshed while held; one not refreshed for
//     Options.LockTTL is stale (its owner died).
//
//   - Durable: in a directory, blobs are flushed together (syncfs) and
//     the manifest file and its directory synced before Write returns; in
//     S3, a PUT is durable when it is answered.
//
// Not kept: FIFOs, sockets and devices, hard links between files (each
// path is a file of its own), owners (restored files belong to the
// destination's owner), setuid and setgid bits. A file removed while the
// snapshot is taken is left out; one changed meanwhile is kept as read.
//
// Limits: a blob already stored is trusted by its presence (a new
// snapshot does not re-read it: bit rot in it is found on reading, by
// Restore or Verify). A manifest that fails its checksum stops garbage
// collection (its blobs might otherwise be swept) until it is deleted.
// Delete and Maintain run a collection, which reads every manifest of the
// storage: fine for thousands of snapshots, not for millions.
package snapshot

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Errors callers may branch on.
var (
	// ErrNotFound: no snapshot of that id for that owner (it may exist for another).
	ErrNotFound = errors.New("snapshot not found")
	// ErrCorrupt: something stored does not match its checksum or is missing.
	ErrCorrupt = errors.New("snapshot is corrupted")
	// ErrQuota: the owner's snapshots would hold more than the quota.
	ErrQuota = errors.New("snapshot quota exceeded")
)

// ArgumentError reports a bad argument and what to fix.
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// CorruptError says which snapshot is unreadable, which stored object is
// wrong and what it belongs to.
type CorruptError struct {
	Snapshot string // id
	Object   string // storage key
	Of       string // "manifest", "file data/x.csv", "kernel state"
	Reason   string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("snapshot %s is corrupted: %s (%s of %s); nothing was restored from it", e.Snapshot, e.Reason, e.Object, e.Of)
}
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// QuotaError reports a Write refused because the owner's snapshots would
// hold more than the quota.
type QuotaError struct {
	Quota int64 // bytes
	Used  int64 // bytes held by the owner's snapshots before this one
	Need  int64 // bytes this one would add (at least: the Write stopped there)
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("the snapshot quota of %d bytes would be exceeded: snapshots hold %d bytes and this one adds at least %d more (delete old snapshots, or remove files from the workspace)", e.Quota, e.Used, e.Need)
}
func (e *QuotaError) Unwrap() error { return ErrQuota }

// Manifest describes one snapshot.
type Manifest struct {
	Version int    `json:"version"` // 1
	ID      string `json:"id"`
	Owner   string `json:"owner"`
	Session string `json:"session,omitempty"` // the source session
	Name    string `json:"name,omitempty"`    // given by its owner
	// Held: the snapshot is the only copy of a hibernated session, so
	// retention (MaxAge, MaxPerSession) leaves it alone; the session
	// deletes it when it wakes or is closed. The quota still counts it.
	Held bool `json:"held,omitempty"`
	// Template is the template of the source session ("" for none): a
	// session restored from it, or a template built from it, needs that
	// environment.
	Template  string    `json:"template,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Files     []File    `json:"files"`
	State     *State    `json:"state,omitempty"`
	// TotalBytes: the files' and the state's bytes (uncompressed).
	TotalBytes int64 `json:"total_bytes"`
	// StoredBytes: the compressed bytes of the distinct blobs it references.
	StoredBytes int64 `json:"stored_bytes"`
	// NewBytes: what this snapshot wrote (compressed), the rest being shared
	// with snapshots before it.
	NewBytes int64 `json:"new_bytes"`
	NewBlobs int   `json:"new_blobs"`
	Blobs    int   `json:"blobs"` // distinct
}

// File is one entry of the workspace.
type File struct {
	Path    string      `json:"path"`
	Type    string      `json:"type"` // file, dir, symlink
	Mode    fs.FileMode `json:"mode"` // permission bits (and sticky)
	Size    int64       `json:"size,omitempty"`
	ModTime time.Time   `json:"mtime"`
	Target  string      `json:"target,omitempty"` // of a symlink
	Chunks  []Chunk     `json:"chunks,omitempty"`
}

// Chunk is a piece of a file or of the state, stored as one blob.
type Chunk struct {
	Hash   string `json:"sha256"`
	Size   int64  `json:"size"`   // uncompressed
	Stored int64  `json:"stored"` // compressed, as stored
}

// State is the kernel's serialized variables.
type State struct {
	Size   int64   `json:"size"`
	Chunks []Chunk `json:"chunks"`
	// Manifest is the kernel's own account of the stream (variables saved
	// and not saved, the serializer), as the StateFunc returned it.
	Manifest json.RawMessage `json:"manifest,omitempty"`
}

// Entry is what a Source walks.
type Entry struct {
	Path    string // slash-separated, relative to the root
	Type    string // file, dir, symlink (others are not kept)
	Mode    fs.FileMode
	Size    int64
	ModTime time.Time
}

// Source is what a snapshot is taken of (a workspace: WorkspaceSource).
type Source interface {
	// Walk calls fn for every directory, regular file and symlink, each
	// directory before its contents; symlinks are not followed.
	Walk(ctx context.Context, fn func(Entry) error) error
	// Open opens regular file p for reading. An error wrapping
	// fs.ErrNotExist (removed, or no longer a regular file, since the walk
	// saw it) leaves the entry out of the snapshot.
	Open(p string) (io.ReadCloser, error)
	// Readlink returns symlink p's target (fs.ErrNotExist: as for Open).
	Readlink(p string) (string, error)
}

// StateFunc writes a kernel's state to w and returns its manifest (saved
// and not saved variables), which is kept in the snapshot's as JSON. The
// session layer's is a call of kernel.ExportState.
type StateFunc func(ctx context.Context, w io.Writer) (manifest any, err error)

// Dest is where a snapshot is restored to: *workspace.Workspace is one.
// A Dest that also has Chtimes(p string, t time.Time) error gets the
// files' modification times back.
type Dest interface {
	Mkdir(p string) error
	Write(p string, r io.Reader) (int64, error)
	Symlink(target, p string) error
	Chmod(p string, mode fs.FileMode) error
	Rename(src, dst string) error
	Remove(p string) error
}

// Options configure a Store. Zero values mean the defaults.
type Options struct {
	// Quota caps the compressed bytes of the distinct blobs referenced by
	// one owner's snapshots. If zero, no cap.
	Quota int64
	// MaxAge: Maintain deletes snapshots older than this. If zero, none.
	MaxAge time.Duration
	// MaxPerSession: Maintain keeps the newest this many snapshots of each
	// source session and deletes the older ones. If zero, no cap.
	MaxPerSession int
	// HeldMaxAge: Maintain deletes held snapshots (Manifest.Held) older
	// than this: their session is gone (its server stopped while it
	// hibernated; a hibernated session lives 24 hours unused by default).
	// If zero, 7 days; negative, never.
	HeldMaxAge time.Duration
	// LockTTL: a lock is put again every LockTTL/4 while it is held; one
	// not refreshed for LockTTL belongs to a process that died and is
	// ignored (a crashed Write holds off garbage collection that long, a
	// crashed collection holds off Writes). If zero, 2 minutes.
	LockTTL time.Duration
	// Workers writing or reading blobs at once. If zero, 4.
	Workers int
	// ReadAhead bounds the bytes a restore reads (and verifies) ahead of
	// their use: while a new session starts, a file is written, the
	// kernel loads the variables. If zero, 16 MiB.
	ReadAhead int64
	// Logger; nil discards.
	Logger *slog.Logger
}

// Store keeps snapshots in a Backend. It is safe for concurrent use, also
// by several processes or hosts sharing the same storage.
type Store struct {
	b    Backend
	opts Options
	log  *slog.Logger
	enc  *zstd.Encoder
	dec  *zstd.Decoder
}

// New returns a Store over b.
func New(b Backend, o *Options) (*Store, error) {
	opts := *cmp.Or(o, &Options{})
	if opts.LockTTL == 0 {
		opts.LockTTL = 2 * time.Minute
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.ReadAhead <= 0 {
		opts.ReadAhead = 16 << 20
	}
	if opts.HeldMaxAge == 0 {
		opts.HeldMaxAge = 7 * 24 * time.Hour
	}
	if opts.Quota < 0 || opts.MaxAge < 0 || opts.MaxPerSession < 0 {
		return nil, &ArgumentError{"snapshot options", errors.New("quota, max age and max per session must not be negative")}
	}
	// One encoder per core: EncodeAll waits for a free one, so a single
	// encoder made the workers compress one chunk at a time. No frame
	// checksums, written or checked: every blob is verified against its
	// SHA-256 address, which the frame's xxhash would only repeat.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithEncoderCRC(false))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxChunk+1<<20), zstd.IgnoreChecksum(true))
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{b: b, opts: opts, log: log, enc: enc, dec: dec}, nil
}

// Keys.
func blobKey(hash string) string { return "blobs/" + hash[:2] + "/" + hash }

// ownerKey hides owner names (tokens' names, emails) from the storage's
// listings and keeps any character out of keys.
func ownerKey(owner string) string {
	h := sha256.Sum256([]byte("sandloop-snapshot-owner\x00" + owner))
	return hex.EncodeToString(h[:16])
}

func manifestKey(owner, id string) string { return "manifests/" + ownerKey(owner) + "/" + id + ".json" }

var idRE = regexp.MustCompile(`^snap-[a-z0-9]{8,64}$`)

func checkID(id string) error {
	if !idRE.MatchString(id) {
		return &ArgumentError{"snapshot id", fmt.Errorf("%q is not a snapshot id (snap- and lowercase letters and digits)", id)}
	}
	return nil
}

const manifestHeader = "sandloop-snapshot v1 sha256="

// maxManifest bounds a manifest read (a workspace of a million files).
const maxManifest = 512 << 20

func encodeManifest(m *Manifest) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	var b bytes.Buffer
	b.WriteString(manifestHeader + hex.EncodeToString(sum[:]) + "\n")
	b.Write(body)
	return b.Bytes(), nil
}

func decodeManifest(id, key string, data []byte) (*Manifest, error) {
	bad := func(reason string) error {
		return &CorruptError{Snapshot: id, Object: key, Of: "manifest", Reason: reason}
	}
	head, body, ok := bytes.Cut(data, []byte("\n"))
	if !ok || !bytes.HasPrefix(head, []byte(manifestHeader)) {
		return nil, bad("the manifest has no checksum line (truncated or not a snapshot manifest)")
	}
	sum := sha256.Sum256(body)
	if string(head[len(manifestHeader):]) != hex.EncodeToString(sum[:]) {
		return nil, bad("the manifest does not match its checksum")
	}
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, bad("the manifest is not valid JSON: " + err.Error())
	}
	if m.Version != 1 {
		return nil, bad(fmt.Sprintf("unknown manifest version %d", m.Version))
	}
	return &m, nil
}

// Get returns owner's snapshot id.
func (s *Store) Get(ctx context.Context, owner, id string) (*Manifest, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	key := manifestKey(owner, id)
	data, err := s.b.Get(ctx, key, maxManifest)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	m, err := decodeManifest(id, key, data)
	if err != nil {
		return nil, err
	}
	if m.Owner != owner || m.ID != id {
		return nil, ErrNotFound // a hash collision of owners, or a manifest moved by hand
	}
	return m, nil
}

// List returns owner's snapshots, newest first. A manifest that cannot be
// read is logged and left out (Get of it says why).
func (s *Store) List(ctx context.Context, owner string) ([]*Manifest, error) {
	var out []*Manifest
	err := s.b.List(ctx, "manifests/"+ownerKey(owner)+"/", func(o ObjectInfo) error {
		id := strings.TrimSuffix(path.Base(o.Key), ".json")
		m, err := s.Get(ctx, owner, id)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Warn("snapshot unreadable", "id", id, "err", err)
			return nil
		}
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// Delete removes owner's snapshot id and collects the blobs no snapshot
// references any more (if a Write elsewhere holds the storage, they are
// collected by a later Maintain).
func (s *Store) Delete(ctx context.Context, owner, id string) error {
	if _, err := s.Get(ctx, owner, id); err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	if err := s.b.Delete(ctx, manifestKey(owner, id)); err != nil {
		return err
	}
	if _, err := s.Collect(ctx); err != nil {
		s.log.Warn("snapshot garbage collection", "err", err)
	}
	return nil
}

// WriteOptions say what else goes into a snapshot.
type WriteOptions struct {
	Session string // the source session's id, kept in the manifest (retention counts by it)
	Name    string // kept in the manifest
	Held    bool   // Manifest.Held
	// Template is the source session's template ("" for none), kept in
	// the manifest.
	Template string
	State    StateFunc // the kernel's state; nil for files only
}

// Write takes a snapshot of src (and of the kernel's state) for owner
// ("" is an owner too: a server without tokens has one, anonymous).
// The snapshot exists once Write returns it; on any error it does not,
// and every earlier snapshot is as it was.
func (s *Store) Write(ctx context.Context, owner string, src Source, o *WriteOptions) (*Manifest, error) {
	wo := *cmp.Or(o, &WriteOptions{})
	lock, err := s.lockWrite(ctx)
	if err != nil {
		return nil, err
	}
	defer lock.release()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &writer{s: s, ctx: ctx, cancel: cancel, seen: map[string]int64{}}
	w.chunkers.New = func() any { return newChunker(nil) }
	if s.opts.Quota > 0 {
		if err := w.loadUsage(owner); err != nil {
			return nil, err
		}
	}
	w.start()

	m := &Manifest{Version: 1, ID: "snap-" + strings.ToLower(rand.Text()[:20]), Owner: owner, Session: wo.Session, Name: wo.Name, Held: wo.Held, Template: wo.Template, CreatedAt: time.Now().UTC()}
	// The kernel's state streams while the files are walked (the source
	// holds still for both: the session's turn is held).
	var (
		stateChunks []*Chunk
		stateErr    error
		stateDone   chan struct{}
	)
	if wo.State != nil {
		st := &State{}
		m.State = st
		stateDone = make(chan struct{})
		go func() {
			defer close(stateDone)
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				var err error
				st.Size, stateChunks, err = w.stream(pr, "kernel state")
				pr.CloseWithError(cmp.Or(err, io.ErrClosedPipe)) // a StateFunc still writing stops
				done <- err
			}()
			man, err := wo.State(ctx, pw)
			pw.CloseWithError(cmp.Or(err, io.EOF))
			if serr := <-done; err == nil {
				err = serr
			}
			if err == nil {
				st.Manifest, err = json.Marshal(man)
			}
			if err != nil {
				stateErr = err
				cancel(fmt.Errorf("snapshot of the kernel's state: %w", err)) // the walk stops
			}
		}()
	}
	var chunks [][]*Chunk // of m.Files[i]
	walkErr := src.Walk(ctx, func(e Entry) error {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		f := File{Path: e.Path, Type: e.Type, Mode: e.Mode & (fs.ModePerm | fs.ModeSticky), ModTime: e.ModTime.UTC()}
		var cs []*Chunk
		switch e.Type {
		case "dir":
		case "symlink":
			t, err := src.Readlink(e.Path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed since the walk saw it
			}
			if err != nil {
				return fmt.Errorf("snapshot of %s: %w", e.Path, err)
			}
			f.Target = t
		case "file":
			r, err := src.Open(e.Path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed or replaced since the walk saw it
			}
			if err != nil {
				return fmt.Errorf("snapshot of %s: %w", e.Path, err)
			}
			f.Size, cs, err = w.stream(r, "file "+e.Path)
			r.Close()
			if err != nil {
				return err
			}
		default:
			return nil
		}
		m.Files = append(m.Files, f)
		chunks = append(chunks, cs)
		return nil
	})
	if walkErr != nil {
		cancel(walkErr) // the state's stream stops
	}
	if stateDone != nil {
		<-stateDone
		if walkErr == nil && stateErr != nil {
			walkErr = fmt.Errorf("snapshot of the kernel's state: %w", stateErr)
		}
	}
	// The storage's own error (a quota exceeded, a failed PUT) is the
	// cause: the source's is then only the cancellation it led to.
	if err := w.wait(); err != nil {
		walkErr = err
	}
	if walkErr != nil {
		return nil, walkErr
	}
	fill := func(cs []*Chunk) []Chunk {
		out := make([]Chunk, len(cs))
		for i, c := range cs {
			out[i] = *c
			out[i].Stored = w.seen[c.Hash]
		}
		return out
	}
	for i := range m.Files {
		if m.Files[i].Type == "file" {
			m.Files[i].Chunks = fill(chunks[i])
		}
		m.TotalBytes += m.Files[i].Size
	}
	if m.State != nil {
		m.State.Chunks = fill(stateChunks)
		m.TotalBytes += m.State.Size
	}
	m.NewBytes, m.NewBlobs, m.Blobs = w.newBytes, w.newBlobs, len(w.seen)
	for _, n := range w.seen {
		m.StoredBytes += n
	}
	if !lock.held() {
		return nil, errors.New("snapshot not committed: its storage lock could not be refreshed, so a garbage collection may have run meanwhile (is the storage reachable?)")
	}
	data, err := encodeManifest(m)
	if err != nil {
		return nil, err
	}
	// The blobs are durable before the manifest that names them exists.
	if sy, ok := s.b.(interface{ Sync(context.Context) error }); ok {
		if err := sy.Sync(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.b.Put(ctx, manifestKey(owner, m.ID), data); err != nil {
		return nil, err
	}
	s.log.Info("snapshot written", "id", m.ID, "session", m.Session, "files", len(m.Files), "total", m.TotalBytes, "new", m.NewBytes)
	return m, nil
}

// writer stores the chunks of one Write, s.opts.Workers at once.
type writer struct {
	s      *Store
	ctx    context.Context
	cancel context.CancelCauseFunc
	jobs   chan job
	wg     sync.WaitGroup
	// chunkers: the files' and the state's streams run at once.
	chunkers sync.Pool

	mu       sync.Mutex
	seen     map[string]int64 // blobs this snapshot references: their stored bytes
	newBytes int64
	newBlobs int
	quota    bool
	owned    map[string]int64 // blobs the owner's other snapshots reference
	used     int64            // their bytes
	extra    int64            // bytes this Write adds to the owner's
}

type job struct {
	buf []byte // rawHead bytes of room, then the chunk
	out *Chunk
}

func (w *writer) loadUsage(owner string) error {
	ms, err := w.s.List(w.ctx, owner)
	if err != nil {
		return err
	}
	w.quota, w.owned = true, map[string]int64{}
	for _, m := range ms {
		m.eachChunk(func(c Chunk, _ string) { w.owned[c.Hash] = c.Stored })
	}
	for _, n := range w.owned {
		w.used += n
	}
	return nil
}

func (m *Manifest) eachChunk(fn func(c Chunk, of string)) {
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			fn(c, "file "+f.Path)
		}
	}
	if m.State != nil {
		for _, c := range m.State.Chunks {
			fn(c, "kernel state")
		}
	}
}

func (w *writer) start() {
	w.jobs = make(chan job, w.s.opts.Workers)
	for range w.s.opts.Workers {
		w.wg.Go(func() {
			for j := range w.jobs {
				if context.Cause(w.ctx) != nil {
					continue // drain
				}
				if err := w.store(j); err != nil {
					w.cancel(err)
				}
			}
		})
	}
}

func (w *writer) wait() error {
	close(w.jobs)
	w.wg.Wait()
	return context.Cause(w.ctx)
}

// stream chunks r and queues the chunks for the workers. The entries'
// Hash is filled in by a worker before wait returns.
func (w *writer) stream(r io.Reader, what string) (int64, []*Chunk, error) {
	c := w.chunkers.Get().(*chunker)
	defer w.chunkers.Put(c)
	c.reset(r)
	defer c.reset(nil)
	var n int64
	var outs []*Chunk
	for {
		b, err := c.next()
		if err == io.EOF {
			return n, outs, nil
		}
		if err != nil {
			return n, nil, fmt.Errorf("read %s: %w", what, err)
		}
		size := int64(len(b) - rawHead)
		n += size
		out := &Chunk{Size: size}
		outs = append(outs, out)
		select {
		case w.jobs <- job{buf: b, out: out}:
		case <-w.ctx.Done():
			return n, nil, context.Cause(w.ctx)
		}
	}
}

// store hashes one chunk and stores it unless it is stored already.
func (w *writer) store(j job) error {
	sum := sha256.Sum256(j.buf[rawHead:])
	hash := hex.EncodeToString(sum[:])
	j.out.Hash = hash
	w.mu.Lock()
	_, dup := w.seen[hash]
	if !dup {
		w.seen[hash] = 0
	}
	w.mu.Unlock()
	if dup {
		return nil
	}
	key := blobKey(hash)
	var stored int64
	var fresh []byte
	info, err := w.s.b.Stat(w.ctx, key)
	switch {
	case err == nil:
		stored = info.Size
	case errors.Is(err, fs.ErrNotExist):
		fresh = w.s.encodeBlob(j.buf)
		stored = int64(len(fresh))
		err = nil
	default:
		return err
	}
	w.mu.Lock()
	w.seen[hash] = stored
	if w.quota {
		if _, ok := w.owned[hash]; !ok {
			w.owned[hash] = stored
			w.extra += stored
			if w.used+w.extra > w.s.opts.Quota {
				err = &QuotaError{Quota: w.s.opts.Quota, Used: w.used, Need: w.extra}
			}
		}
	}
	if err == nil && fresh != nil {
		w.newBytes += stored
		w.newBlobs++
	}
	w.mu.Unlock()
	if err != nil || fresh == nil {
		return err
	}
	return w.s.b.Put(w.ctx, key, fresh)
}
