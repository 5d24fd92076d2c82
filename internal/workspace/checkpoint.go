package workspace

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A CheckpointStore keeps copies of a workspace's files, taken at chosen
// moments (Take), and puts the workspace back as it was at one of them
// (Restore). It lives in a host directory outside the workspace, which
// sandboxed code cannot see.
//
// The store is content addressed: each distinct file content is one blob,
// named by its SHA-256, however many checkpoints or paths hold it. A file
// unchanged since the store last saw it (same device and inode, size,
// mtime and ctime, to the nanosecond) is not read again: its checkpoint
// entry points at the blob it already has. Changed and new files are
// copied. The blobs of the files as the store last saw them stay while
// no checkpoint holds them (at most one copy of the workspace, not counted
// in HeldBytes), so that taking a checkpoint after the last one was
// dropped (a fork's, or undo's) does not copy the unchanged files again.
// Workspace files are never hard linked into the store nor blobs
// into the workspace: code in the sandbox writing to a file it owns would
// change the store's copy too.
//
// A file whose ctime is within racyWindow of the moment it was looked at
// may still change without its ctime moving (timestamps come from a
// coarse clock); it is trusted only after its content is hashed again
// (as git treats "racily clean" entries).
//
// What is kept: regular files (content, permission bits, mtime),
// directories (permission bits), symlinks (as links, never followed).
// Not kept: FIFOs, sockets and devices (listed in FileCheckpoint.Skipped
// and left alone by Restore), hard links between workspace files (each
// path comes back as a file of its own), owners (restored files belong to
// the workspace's owner: Options.UID and GID), setuid and setgid bits,
// and the times of directories.
//
// Every access to the workspace goes through its os.Root: a symlink or a
// rename planted by sandboxed code while a checkpoint is taken or restored
// never makes the store read or write outside the workspace.
//
// Its methods are safe for concurrent use; they run one at a time.
type CheckpointStore struct {
	dir string

	mu    sync.Mutex
	next  int
	cps   map[string]*fileCheckpoint
	blobs map[string]*blob    // by hash
	held  int64               // bytes of the blobs checkpoints hold
	seen  map[string]seenFile // by path: what the store last saw there (never changed in place)
	// seenRefs counts seen's entries by blob: a blob no checkpoint holds
	// stays while seen has it.
	seenRefs map[string]int
	home     string // the directory of the workspace taken (seen describes it)
}

type blob struct {
	size int64
	refs int
}

// seenFile is a workspace file as the store last saw it, and its content.
type seenFile struct {
	id      fileID
	hash    string
	trusted bool // its ctime was older than racyWindow when it was seen
}

// fileID is what identifies a file's version without reading it.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns
	mode         fs.FileMode
}

// racyWindow: file timestamps come from the kernel's coarse clock (a tick
// of up to 10 ms), so a write in the same tick as a stat may leave mtime and
// ctime as they were. Files changed this recently are hashed again.
const racyWindow = 50 * time.Millisecond

type fileCheckpoint struct {
	info    FileCheckpoint
	entries []cpEntry // parents before children
}

type cpEntry struct {
	path  string
	typ   byte // 'f' file, 'd' directory, 'l' symlink
	mode  fs.FileMode
	size  int64
	hash  string // file
	link  string // symlink
	mtime int64  // file, ns
}

// FileCheckpoint describes a checkpoint of a workspace's files.
type FileCheckpoint struct {
	ID     string
	Files  int   // regular files
	Bytes  int64 // their total size
	Copied int64 // bytes this Take added to the store (what was not there yet)
	// Skipped lists the FIFOs, sockets and devices not kept.
	Skipped []string
}

// FileRestore says what a Restore did to the workspace.
type FileRestore struct {
	Written   int // files, symlinks and directories created or rewritten
	Removed   int // entries removed (a directory with what it held counts once)
	Unchanged int // files and symlinks already as they were at the checkpoint
}

// ErrNoCheckpoint: the store holds no checkpoint by that id.
var ErrNoCheckpoint = errors.New("no such checkpoint")

// OpenCheckpointStore makes (or empties) dir and keeps checkpoints there.
// dir must be outside every workspace the store is used with, and
// readable by the server only.
func OpenCheckpointStore(dir string) (*CheckpointStore, error) {
	if err := os.RemoveAll(filepath.Join(dir, "blobs")); err != nil {
		return nil, fmt.Errorf("checkpoint store: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint store: %w", err)
	}
	return &CheckpointStore{dir: dir, cps: map[string]*fileCheckpoint{}, blobs: map[string]*blob{}, seen: map[string]seenFile{}, seenRefs: map[string]int{}}, nil
}

// Dir is the store's directory.
func (s *CheckpointStore) Dir() string { return s.dir }

// Close removes the store's directory and everything in it.
func (s *CheckpointStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cps, s.blobs, s.seen, s.seenRefs, s.held, s.home = map[string]*fileCheckpoint{}, map[string]*blob{}, map[string]seenFile{}, map[string]int{}, 0, ""
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove checkpoint store: %w", err)
	}
	return nil
}

// HeldBytes is the size of the distinct file contents the checkpoints
// hold (not counting the copy of unchanged files kept for the next Take).
func (s *CheckpointStore) HeldBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Has reports whether checkpoint id is held.
func (s *CheckpointStore) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.cps[id]
	return ok
}

func (s *CheckpointStore) blobPath(hash string) string {
	return filepath.Join(s.dir, "blobs", hash)
}

// Drop forgets checkpoint id, removing the blobs no other checkpoint holds.
func (s *CheckpointStore) Drop(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, ok := s.cps[id]
	if !ok {
		return fmt.Errorf("checkpoint %q: %w", id, ErrNoCheckpoint)
	}
	delete(s.cps, id)
	var errs []error
	for _, e := range cp.entries {
		if e.typ == 'f' {
			if err := s.unref(e.hash); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (s *CheckpointStore) unref(hash string) error {
	b := s.blobs[hash]
	if b == nil {
		return nil
	}
	if b.refs--; b.refs > 0 {
		return nil
	}
	s.held -= b.size
	if s.seenRefs[hash] > 0 {
		return nil // kept for the next Take
	}
	delete(s.blobs, hash)
	if err := os.Remove(s.blobPath(hash)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	return nil
}

// Dup makes a second handle on checkpoint id, with an id of its own: the
// files stay held until both are dropped (a fork restores them into other
// workspaces while the session may drop the original).
func (s *CheckpointStore) Dup(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, ok := s.cps[id]
	if !ok {
		return "", fmt.Errorf("checkpoint %q: %w", id, ErrNoCheckpoint)
	}
	for _, e := range cp.entries {
		if e.typ == 'f' {
			s.blobs[e.hash].refs++
		}
	}
	s.next++
	dup := &fileCheckpoint{info: cp.info, entries: cp.entries}
	dup.info.ID = "f" + strconv.Itoa(s.next)
	s.cps[dup.info.ID] = dup
	return dup.info.ID, nil
}

// Take copies the workspace's files into a new checkpoint. A store takes
// checkpoints of one workspace (the first it is given).
func (s *CheckpointStore) Take(w *Workspace) (*FileCheckpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.home == "" {
		s.home = w.root.Name()
	} else if s.home != w.root.Name() {
		return nil, fmt.Errorf("checkpoint store of %s: cannot take checkpoints of %s", s.home, w.root.Name())
	}
	t := &taking{s: s, w: w, seen: map[string]seenFile{}, fresh: map[string]*blob{}}
	err := t.dir(w.root, ".")
	if err != nil {
		t.abort()
		return nil, err
	}
	// Commit: every entry holds a reference; the new blobs an entry holds
	// join the store (one copied from a file that then changed may not).
	cp := &fileCheckpoint{entries: t.entries}
	for _, e := range t.entries {
		if e.typ == 'f' {
			if b := t.fresh[e.hash]; b != nil {
				b.refs++
			} else if b := s.blobs[e.hash]; b.refs == 0 {
				b.refs++
				s.held += b.size // seen's copy, held again
			} else {
				b.refs++
			}
			cp.info.Files++
			cp.info.Bytes += e.size
		}
	}
	for h, b := range t.fresh {
		if b.refs == 0 {
			os.Remove(s.blobPath(h))
			continue
		}
		s.blobs[h] = b
		s.held += b.size
		cp.info.Copied += b.size
	}
	s.setSeen(t.seen)
	s.next++
	cp.info.ID = "f" + strconv.Itoa(s.next)
	cp.info.Skipped = t.skipped
	s.cps[cp.info.ID] = cp
	info := cp.info
	return &info, nil
}

// setSeen replaces what the store last saw, and removes the blobs that
// neither a checkpoint nor the new seen holds. Called with mu held.
func (s *CheckpointStore) setSeen(seen map[string]seenFile) {
	s.seen = seen
	s.seenRefs = make(map[string]int, len(seen))
	for _, f := range seen {
		s.seenRefs[f.hash]++
	}
	for h, b := range s.blobs {
		if b.refs == 0 && s.seenRefs[h] == 0 {
			delete(s.blobs, h)
			os.Remove(s.blobPath(h))
		}
	}
}

// taking is one Take in progress.
type taking struct {
	s       *CheckpointStore
	w       *Workspace
	entries []cpEntry
	skipped []string
	seen    map[string]seenFile
	fresh   map[string]*blob // blobs written by this Take
}

// abort removes the blobs this Take wrote.
func (t *taking) abort() {
	for h := range t.fresh {
		os.Remove(t.s.blobPath(h))
	}
}

// dir records directory rel (r is it, opened inside the workspace's root)
// and what it holds, in name order.
func (t *taking) dir(r *os.Root, rel string) error {
	f, err := r.Open(".")
	if err != nil {
		return mapErr(rel, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return mapErr(rel, err)
	}
	sort.Strings(names)
	for _, name := range names {
		p := path.Join(rel, name)
		if err := t.entry(r, name, p); err != nil {
			return err
		}
	}
	return nil
}

func (t *taking) entry(r *os.Root, name, p string) error {
	for try := range 3 {
		fi, err := r.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return mapErr(p, err)
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			sub, err := r.OpenRoot(name)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) {
					continue // replaced meanwhile: look again
				}
				return mapErr(p, err)
			}
			t.entries = append(t.entries, cpEntry{path: p, typ: 'd', mode: keptMode(mode)})
			err = t.dir(sub, p)
			sub.Close()
			return err
		case mode&fs.ModeSymlink != 0:
			link, err := r.Readlink(name)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EINVAL) {
					continue
				}
				return mapErr(p, err)
			}
			t.entries = append(t.entries, cpEntry{path: p, typ: 'l', link: link})
			return nil
		case mode.IsRegular():
			done, err := t.file(r, name, p, fi, try == 2)
			if err != nil || done {
				return err
			}
			// changed while read: look again
		default:
			t.skipped = append(t.skipped, p)
			return nil
		}
	}
	return &PathError{p, errors.New("keeps changing while the checkpoint is taken")}
}

// file records regular file p (name in r) whose lstat is fi. It returns
// false if the file changed between that lstat and reading it, unless last:
// then what was read is kept (a file a background process keeps writing
// is copied as any copy would find it, not refused).
func (t *taking) file(r *os.Root, name, p string, fi fs.FileInfo, last bool) (bool, error) {
	now := time.Now()
	id := idOf(fi)
	e := cpEntry{path: p, typ: 'f', mode: keptMode(fi.Mode()), size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	old, known := t.s.seen[p]
	known = known && id.ino != 0 && old.id == id && t.s.has(old.hash, t.fresh)
	if known && old.trusted {
		e.hash = old.hash
		t.entries = append(t.entries, e)
		t.seen[p] = seenFile{id: id, hash: old.hash, trusted: true}
		return true, nil
	}
	f, err := r.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
			return false, nil
		}
		return false, mapErr(p, err)
	}
	defer f.Close()
	if ffi, err := f.Stat(); err != nil || idOf(ffi) != id {
		if !last || err != nil || !ffi.Mode().IsRegular() {
			return false, nil
		}
	}
	var hash string
	var n int64
	if known {
		// Racily clean: the content may have changed under the same
		// identity. Hash it; copy it only if the store lacks it.
		h := sha256.New()
		if n, err = copyBuffered(h, f); err != nil {
			return false, mapErr(p, err)
		}
		hash = hex.EncodeToString(h.Sum(nil))
		if !t.s.has(hash, t.fresh) {
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return false, mapErr(p, err)
			}
			if hash, n, err = t.copy(f, p); err != nil {
				return false, err
			}
		}
	} else if hash, n, err = t.copy(f, p); err != nil {
		return false, err
	}
	e.hash, e.size = hash, n
	if testHookAfterRead != nil {
		testHookAfterRead(p)
	}
	// Changed while read (a write keeps the inode): read it again, or
	// keep what was read but do not vouch for it next time.
	if after, err := r.Lstat(name); err != nil || idOf(after) != id || n != id.size {
		if !last {
			return false, nil
		}
		t.entries = append(t.entries, e)
		return true, nil
	}
	t.entries = append(t.entries, e)
	t.seen[p] = seenFile{id: id, hash: hash, trusted: now.UnixNano()-id.ctime > int64(racyWindow)}
	return true, nil
}

// testHookAfterRead, if set (by tests), is called after a file is read.
var testHookAfterRead func(p string)

// has reports whether the store (or this Take) holds blob hash.
func (s *CheckpointStore) has(hash string, fresh map[string]*blob) bool {
	if s.blobs[hash] != nil {
		return true
	}
	_, ok := fresh[hash]
	return ok
}

// copy writes f's content to the store (unless a blob has it already) and
// returns its hash and size.
func (t *taking) copy(f *os.File, p string) (string, int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	got, err := io.ReadFull(f, *buf)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return t.copySmall((*buf)[:got], p)
	}
	if err != nil {
		return "", 0, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", 0, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	tmp, err := os.CreateTemp(filepath.Join(t.s.dir, "blobs"), "tmp-")
	if err != nil {
		return "", 0, fmt.Errorf("checkpoint store: %w", err)
	}
	h := sha256.New()
	n, err := copyBuffered(io.MultiWriter(tmp, h), f)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", 0, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	hash := hex.EncodeToString(h.Sum(nil))
	if t.s.has(hash, t.fresh) {
		os.Remove(tmp.Name())
		return hash, n, nil
	}
	if err := os.Chmod(tmp.Name(), 0o400); err == nil {
		err = os.Rename(tmp.Name(), t.s.blobPath(hash))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", 0, fmt.Errorf("checkpoint store: %w", err)
	}
	t.fresh[hash] = &blob{size: n}
	return hash, n, nil
}

// copySmall stores content read whole (smaller than a read buffer): hashed
// first, written under its final name only if the store lacks it (no
// temporary name, rename and chmod for each small file).
func (t *taking) copySmall(content []byte, p string) (string, int64, error) {
	sum := sha256.Sum256(content)
	hash := hex.EncodeToString(sum[:])
	n := int64(len(content))
	if t.s.has(hash, t.fresh) {
		return hash, n, nil
	}
	name := t.s.blobPath(hash)
	b, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return "", 0, fmt.Errorf("checkpoint store: %w", err)
	}
	_, err = b.Write(content)
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", 0, fmt.Errorf("checkpoint store: %s: %w", p, err)
	}
	t.fresh[hash] = &blob{size: n}
	return hash, n, nil
}

// copyBuffered is io.Copy in 1 MiB reads: files are read under the
// session's turn, and io.Copy's 32 KiB would take 32 system calls a MiB.
// The buffers are reused: a fresh 1 MiB for every file read cost more
// (allocating and zeroing it) than reading a small file.
func copyBuffered(w io.Writer, r io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, *buf)
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// keptMode is the part of a mode a checkpoint keeps: permission bits and
// the sticky bit. Setuid and setgid are dropped: restored files are
// written by the server, which must not hand out privileges.
func keptMode(m fs.FileMode) fs.FileMode { return m & (fs.ModePerm | fs.ModeSticky) }

// Restore makes the workspace what it was at checkpoint id: files and
// directories made since are removed, changed files rewritten (each
// appears at once: written under a temporary name, then renamed), deleted
// ones back; files already as they were are not touched. FIFOs, sockets
// and devices that were there at the checkpoint are left alone. The
// checkpoint is kept: it can be restored again.
//
// A checkpoint may be restored into another workspace too (a fork's):
// then every file is compared by content. Restores into other workspaces
// may run at the same time as each other and as the store's other calls;
// the checkpoint must not be dropped meanwhile (see Dup).
func (s *CheckpointStore) Restore(w *Workspace, id string) (*FileRestore, error) {
	rs, err := s.restoring(w, id)
	if err != nil {
		return nil, err
	}
	return rs.run()
}

// restoring starts a Restore of checkpoint id into w.
func (s *CheckpointStore) restoring(w *Workspace, id string) (*restoring, error) {
	s.mu.Lock()
	cp, ok := s.cps[id]
	home := s.home == w.root.Name()
	seen := s.seen
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("checkpoint %q: %w", id, ErrNoCheckpoint)
	}
	if !home {
		seen = nil
	}
	want := make(map[string]*cpEntry, len(cp.entries))
	for i := range cp.entries {
		want[cp.entries[i].path] = &cp.entries[i]
	}
	skipped := map[string]bool{}
	for _, p := range cp.info.Skipped {
		skipped[p] = true
	}
	return &restoring{s: s, w: w, cp: cp, home: home, want: want, skipped: skipped, old: seen, seen: map[string]seenFile{}}, nil
}

// run does the restore: what is not in the checkpoint goes, then each
// entry is put back.
func (rs *restoring) run() (*FileRestore, error) {
	err := rs.prune(rs.w.root, ".")
	for i := 0; err == nil && i < len(rs.cp.entries); i++ {
		err = rs.put(&rs.cp.entries[i])
	}
	for _, pf := range rs.prepared {
		rs.w.root.Remove(pf.tmp) // not used: the file was as the checkpoint has it by then
	}
	rs.prepared = nil
	if rs.home {
		rs.s.mu.Lock()
		rs.s.setSeen(rs.seen)
		rs.s.mu.Unlock()
	}
	return &rs.res, err
}

// A PreparedRestore is a Restore split in two, so that its slow part can
// run while the caller does something it may still have to call off (a
// session restores its kernel meanwhile): PrepareRestore writes the
// checkpoint's content of every file that needs rewriting, under
// temporary names beside it, and changes nothing else; Commit finishes
// the restore exactly as Restore would (using those copies); Abort
// removes them, leaving the workspace as it was.
type PreparedRestore struct {
	rs *restoring
}

// preparedFile is a file's content written under a temporary name.
type preparedFile struct {
	tmp string
	id  fileID // the copy as written
}

// PrepareRestore prepares a Restore of checkpoint id into w. The
// checkpoint must not be dropped before Commit or Abort.
func (s *CheckpointStore) PrepareRestore(w *Workspace, id string) (*PreparedRestore, error) {
	rs, err := s.restoring(w, id)
	if err != nil {
		return nil, err
	}
	rs.prepared = map[string]preparedFile{}
	p := &PreparedRestore{rs: rs}
	for i := range rs.cp.entries {
		e := &rs.cp.entries[i]
		if e.typ != 'f' {
			continue
		}
		if err := rs.prepare(e); err != nil {
			p.Abort()
			return nil, err
		}
	}
	return p, nil
}

// prepare writes e's content under a temporary name beside it if the file
// there differs. Where that cannot be done now (its directory is not
// there yet, the quota is full) Commit writes it.
func (rs *restoring) prepare(e *cpEntry) error {
	root := rs.w.root
	fi, err := root.Lstat(e.path)
	if err == nil && fi.Mode().IsRegular() && fi.Size() == e.size {
		same, err := rs.sameContent(e, fi)
		if err != nil || same {
			return err
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return mapErr(e.path, err)
	}
	if dir, err := root.Lstat(path.Dir(e.path)); err != nil || !dir.IsDir() {
		return nil
	}
	src, err := os.Open(rs.s.blobPath(e.hash))
	if err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	defer src.Close()
	tmp := tempName(e.path)
	dst, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil // Commit writes it
	}
	err = copyBlob(dst, src)
	if err == nil {
		err = rs.setMeta(dst, e)
	}
	var written fs.FileInfo
	if err == nil {
		written, err = dst.Stat()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		root.Remove(tmp)
		return nil // Commit writes it, and says why if it still cannot
	}
	rs.prepared[e.path] = preparedFile{tmp: tmp, id: idOf(written)}
	return nil
}

// Commit finishes the restore: the workspace becomes what it was at the
// checkpoint, as after Restore.
func (p *PreparedRestore) Commit() (*FileRestore, error) {
	if p.rs == nil {
		return nil, errors.New("checkpoint store: a prepared restore committed or aborted already")
	}
	rs := p.rs
	p.rs = nil
	return rs.run()
}

// Abort removes what PrepareRestore wrote.
func (p *PreparedRestore) Abort() {
	if p.rs == nil {
		return
	}
	for _, pf := range p.rs.prepared {
		p.rs.w.root.Remove(pf.tmp)
	}
	p.rs = nil
}

type restoring struct {
	s    *CheckpointStore
	w    *Workspace
	cp   *fileCheckpoint
	home bool // w is the workspace the store takes checkpoints of
	want map[string]*cpEntry
	// prepared holds the copies PrepareRestore wrote, by path; each is
	// removed from it once used (or found changed).
	prepared map[string]preparedFile
	skipped  map[string]bool
	old      map[string]seenFile // what the store last saw (nil: another workspace)
	seen     map[string]seenFile
	// kept holds what prune found of the entries it kept, by path, for
	// put (one lookup in its directory, not a walk of the whole path
	// again); each is removed once used.
	kept map[string]fs.FileInfo
	res  FileRestore
}

// prune removes what directory rel (r) holds that the checkpoint does not
// have, or has as another kind of entry.
func (rs *restoring) prune(r *os.Root, rel string) error {
	f, err := r.Open(".")
	if err != nil {
		return mapErr(rel, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return mapErr(rel, err)
	}
	for _, name := range names {
		p := path.Join(rel, name)
		fi, err := r.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return mapErr(p, err)
		}
		e := rs.want[p]
		mode := fi.Mode()
		keep := false
		switch {
		case e == nil && rs.isPrepared(p, fi):
			continue
		case e == nil:
			keep = rs.skipped[p] && !mode.IsRegular() && !mode.IsDir() && mode&fs.ModeSymlink == 0
		case e.typ == 'd':
			keep = mode.IsDir()
		case e.typ == 'f':
			keep = mode.IsRegular()
		case e.typ == 'l':
			keep = mode&fs.ModeSymlink != 0
		}
		if !keep {
			if err := r.RemoveAll(name); err != nil {
				return mapErr(p, err)
			}
			rs.res.Removed++
			continue
		}
		if e != nil {
			if rs.kept == nil {
				rs.kept = map[string]fs.FileInfo{}
			}
			rs.kept[p] = fi
		}
		if mode.IsDir() {
			sub, err := r.OpenRoot(name)
			if err != nil {
				return mapErr(p, err)
			}
			err = rs.prune(sub, p)
			sub.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// isPrepared reports whether p (lstat fi) is a copy PrepareRestore wrote,
// unchanged since.
func (rs *restoring) isPrepared(p string, fi fs.FileInfo) bool {
	if len(rs.prepared) == 0 || !strings.HasPrefix(path.Base(p), ".sandloop-restore-") {
		return false
	}
	for _, pf := range rs.prepared {
		if pf.tmp == p {
			return idOf(fi) == pf.id
		}
	}
	return false
}

// takePrepared returns the copy PrepareRestore wrote of e, if it is still
// as written ("" if none); a changed one is removed.
func (rs *restoring) takePrepared(e *cpEntry) string {
	pf, ok := rs.prepared[e.path]
	if !ok {
		return ""
	}
	delete(rs.prepared, e.path)
	if fi, err := rs.w.root.Lstat(pf.tmp); err == nil && fi.Mode().IsRegular() && idOf(fi) == pf.id && pf.id.ino != 0 {
		return pf.tmp
	}
	rs.w.root.Remove(pf.tmp)
	return ""
}

// put makes entry e as the checkpoint has it.
func (rs *restoring) put(e *cpEntry) error {
	root := rs.w.root
	fi, ok := rs.kept[e.path]
	var err error
	if ok {
		delete(rs.kept, e.path)
	} else {
		fi, err = root.Lstat(e.path)
	}
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return mapErr(e.path, err)
	}
	switch e.typ {
	case 'd':
		if exists && !fi.IsDir() {
			if err := root.RemoveAll(e.path); err != nil {
				return mapErr(e.path, err)
			}
			rs.res.Removed++
			exists = false
		}
		if !exists {
			if err := root.Mkdir(e.path, 0o700); err != nil {
				return mapErr(e.path, err)
			}
			if err := rs.w.chown(e.path); err != nil {
				return err
			}
			rs.res.Written++
		} else if keptMode(fi.Mode()) == e.mode {
			return nil
		}
		return mapErr(e.path, root.Chmod(e.path, e.mode))
	case 'l':
		if exists && fi.Mode()&fs.ModeSymlink != 0 {
			if link, err := root.Readlink(e.path); err == nil && link == e.link {
				rs.res.Unchanged++
				return nil
			}
		}
		tmp := tempName(e.path)
		if err := root.Symlink(e.link, tmp); err != nil {
			return mapErr(e.path, err)
		}
		if err := rs.w.chown(tmp); err != nil {
			root.Remove(tmp)
			return err
		}
		return rs.replace(tmp, e.path, exists && fi.IsDir())
	}
	// A regular file.
	if exists && fi.Mode().IsRegular() && fi.Size() == e.size {
		same, err := rs.sameContent(e, fi)
		if err != nil {
			return err
		}
		if same {
			if keptMode(fi.Mode()) != e.mode {
				if err := root.Chmod(e.path, e.mode); err != nil {
					return mapErr(e.path, err)
				}
				rs.res.Written++
				fi, _ = root.Lstat(e.path)
			} else {
				rs.res.Unchanged++
			}
			rs.see(e, fi)
			return nil
		}
	}
	if tmp := rs.takePrepared(e); tmp != "" {
		return rs.replace(tmp, e.path, exists && fi.IsDir(), e)
	}
	return rs.write(e, exists && fi.IsDir())
}

// sameContent reports whether the file at e.path (lstat fi) holds e's
// content: known by its identity, or else by its hash.
func (rs *restoring) sameContent(e *cpEntry, fi fs.FileInfo) (bool, error) {
	id := idOf(fi)
	if old, ok := rs.old[e.path]; ok && id.ino != 0 {
		// A file is never wrongly left alone, but may be rewritten when
		// it did hold the checkpoint's content: rewriting is always right,
		// reading first is only to spare a write.
		switch {
		case old.id == id && old.trusted:
			return old.hash == e.hash, nil
		case old.id != id:
			// Written since the store saw it: rewrite it without reading
			// it (its new content is unlikely to be the checkpoint's).
			return false, nil
		case old.hash != e.hash:
			// Racily clean: it held other content when seen, and a write
			// since (within the clock's tick) could only have made it the
			// checkpoint's by chance. Rewritten without reading.
			return false, nil
		}
	}
	f, err := rs.w.root.OpenFile(e.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return false, nil // rewritten below
	}
	defer f.Close()
	h := sha256.New()
	if _, err := copyBuffered(h, f); err != nil {
		return false, nil
	}
	return hex.EncodeToString(h.Sum(nil)) == e.hash, nil
}

// see remembers the file now at e.path as holding e's content.
func (rs *restoring) see(e *cpEntry, fi fs.FileInfo) {
	if fi == nil {
		return
	}
	id := idOf(fi)
	rs.seen[e.path] = seenFile{id: id, hash: e.hash, trusted: time.Now().UnixNano()-id.ctime > int64(racyWindow)}
}

// write writes file e from its blob under a temporary name, then renames
// it into place (over a directory there, if isDir).
func (rs *restoring) write(e *cpEntry, isDir bool) error {
	root := rs.w.root
	src, err := os.Open(rs.s.blobPath(e.hash))
	if err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	defer src.Close()
	tmp := tempName(e.path)
	dst, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return mapErr(e.path, err)
	}
	err = copyBlob(dst, src)
	if err == nil {
		// On the open file: path calls through the root would walk the
		// path again, three times.
		err = rs.setMeta(dst, e)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)) && !isDir {
		// The quota holds the old and the new copy at once: free the
		// old one first (the file then appears written, not atomically).
		root.Remove(tmp)
		if rerr := root.Remove(e.path); rerr == nil || errors.Is(rerr, fs.ErrNotExist) {
			return rs.writeInPlace(e, src)
		}
	}
	if err != nil {
		root.Remove(tmp)
		var pe *PathError
		if errors.As(err, &pe) {
			return err
		}
		return mapErr(e.path, err)
	}
	return rs.replace(tmp, e.path, isDir, e)
}

// setMeta gives f, a file written for e, e's owner (the workspace's),
// permission bits and mtime.
func (rs *restoring) setMeta(f *os.File, e *cpEntry) error {
	if rs.w.opts.OwnerSet {
		if err := f.Chown(rs.w.opts.UID, rs.w.opts.GID); err != nil {
			return err
		}
	}
	if err := f.Chmod(e.mode); err != nil {
		return err
	}
	return setMtime(f, e.mtime)
}

// writeInPlace writes e at its path directly (nothing is there).
func (rs *restoring) writeInPlace(e *cpEntry, src *os.File) error {
	root := rs.w.root
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	dst, err := root.OpenFile(e.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return mapErr(e.path, err)
	}
	err = copyBlob(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rs.w.chown(e.path)
	}
	if err == nil {
		err = root.Chmod(e.path, e.mode)
	}
	if err == nil {
		mt := time.Unix(0, e.mtime)
		err = root.Chtimes(e.path, mt, mt)
	}
	if err != nil {
		var pe *PathError
		if errors.As(err, &pe) {
			return err
		}
		return mapErr(e.path, err)
	}
	rs.res.Written++
	fi, _ := root.Lstat(e.path)
	rs.see(e, fi)
	return nil
}

// replace renames tmp to p, removing a directory at p first (rename
// cannot replace a directory with a file or a link).
func (rs *restoring) replace(tmp, p string, isDir bool, file ...*cpEntry) error {
	root := rs.w.root
	if isDir {
		if err := root.RemoveAll(p); err != nil {
			root.Remove(tmp)
			return mapErr(p, err)
		}
		rs.res.Removed++
	}
	if err := root.Rename(tmp, p); err != nil {
		root.Remove(tmp)
		return mapErr(p, err)
	}
	rs.res.Written++
	if len(file) > 0 {
		fi, _ := root.Lstat(p)
		rs.see(file[0], fi)
	}
	return nil
}

func tempName(p string) string {
	return path.Join(path.Dir(p), ".sandloop-restore-"+rand.Text())
}
