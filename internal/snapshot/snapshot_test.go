package snapshot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sandloop/sandloop/internal/testutil"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/workspace"
)

// Every test of the suite runs against each backend: the directory always,
// S3 when a SeaweedFS server can be started (s3_test.go).

type backendCase struct {
	name string
	// open returns a fresh, empty backend and the environment a child
	// process needs to open the same one (openFromEnv).
	open func(t *testing.T) (Backend, []string)
}

func backends(t *testing.T) []backendCase {
	cs := []backendCase{{"dir", func(t *testing.T) (Backend, []string) {
		dir := t.TempDir()
		b, err := NewDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return b, []string{"SNAPSHOT_TEST_DIR=" + dir}
	}}}
	cs = append(cs, backendCase{"s3", openS3})
	return cs
}

func eachBackend(t *testing.T, fn func(t *testing.T, bc backendCase)) {
	for _, bc := range backends(t) {
		t.Run(bc.name, func(t *testing.T) { fn(t, bc) })
	}
}

func newStore(t *testing.T, b Backend, o *Options) *Store {
	t.Helper()
	s, err := New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newWorkspace(t *testing.T) (*workspace.Workspace, string) {
	t.Helper()
	dir := t.TempDir()
	w, err := workspace.Open(dir, &workspace.Options{MaxFileBytes: 256 << 20, MaxTotalBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, dir
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e37))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

func mustWrite(t *testing.T, p string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// tree describes every entry under dir byte for byte, mtimes included.
func tree(t *testing.T, dir string) map[string]string {
	return testutil.Tree(t, dir, true)
}

func diffTrees(t *testing.T, want, got map[string]string) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	bad := 0
	for _, k := range keys {
		if want[k] != got[k] {
			t.Errorf("%s: want %q, got %q", k, want[k], got[k])
			bad++
		}
	}
	if bad == 0 && len(want) == 0 {
		t.Error("empty tree compared")
	}
}

type stateManifest struct {
	Serializer string   `json:"serializer"`
	Variables  []string `json:"variables"`
}

func stateOf(data []byte) StateFunc {
	return func(ctx context.Context, w io.Writer) (any, error) {
		_, err := w.Write(data)
		return stateManifest{"dill", []string{"df", "model"}}, err
	}
}

func readState(t *testing.T, s *Store, owner, id string) ([]byte, error) {
	t.Helper()
	r, _, err := s.OpenState(context.Background(), owner, id)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, nil
	}
	defer r.Close()
	return io.ReadAll(r)
}

func TestRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		mustWrite(t, filepath.Join(dir, "data/big.bin"), randBytes(1, 9<<20+12345), 0o644) // several chunks
		mustWrite(t, filepath.Join(dir, "data/zeros.bin"), make([]byte, 5<<20), 0o600)     // compresses
		mustWrite(t, filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
		mustWrite(t, filepath.Join(dir, "empty.txt"), nil, 0o640)
		mustWrite(t, filepath.Join(dir, "a/b/c/deep.py"), []byte("print(1)\n"), 0o644)
		mustWrite(t, filepath.Join(dir, "dup1.bin"), randBytes(2, 300<<10), 0o644)
		mustWrite(t, filepath.Join(dir, "dup2.bin"), randBytes(2, 300<<10), 0o644)
		for _, d := range []string{"emptydir", "a/b/emptier"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.Chmod(filepath.Join(dir, "a/b/emptier"), 0o700)
		os.Chmod(filepath.Join(dir, "a/b"), 0o555) // read-only with contents: restored last
		os.Symlink("data/big.bin", filepath.Join(dir, "link"))
		os.Symlink("/etc/passwd", filepath.Join(dir, "outside")) // kept as a link, never followed
		os.Symlink("nowhere", filepath.Join(dir, "a/dangling"))
		syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644) // not kept
		want := tree(t, dir)
		delete(want, "fifo")
		state := randBytes(3, 6<<20)

		m, err := s.Write(ctx, "alice", WorkspaceSource(w), &WriteOptions{Session: "s-1", State: stateOf(state)})
		if err != nil {
			t.Fatal(err)
		}
		if m.Owner != "alice" || m.Session != "s-1" || m.State == nil || m.State.Size != int64(len(state)) {
			t.Fatalf("manifest: %+v", m)
		}
		var sm stateManifest
		if err := json.Unmarshal(m.State.Manifest, &sm); err != nil || sm.Serializer != "dill" || len(sm.Variables) != 2 {
			t.Fatalf("state manifest %s: %v", m.State.Manifest, err)
		}
		wantTotal := int64(9<<20+12345+5<<20+len("#!/bin/sh\necho hi\n")+len("print(1)\n")+2*300<<10) + int64(len(state))
		if m.TotalBytes != wantTotal {
			t.Errorf("total bytes %d, want %d", m.TotalBytes, wantTotal)
		}
		if m.StoredBytes >= m.TotalBytes-5<<20 || m.NewBytes != m.StoredBytes {
			t.Errorf("stored %d new %d of total %d: zeros should compress and the duplicate be stored once", m.StoredBytes, m.NewBytes, m.TotalBytes)
		}
		t.Logf("total %d bytes, stored %d (%d blobs)", m.TotalBytes, m.StoredBytes, m.Blobs)

		got, err := s.Get(ctx, "alice", m.ID)
		if err != nil || got.ID != m.ID || len(got.Files) != len(m.Files) {
			t.Fatalf("Get: %v %+v", err, got)
		}
		w2, dir2 := newWorkspace(t)
		_, res, err := s.Restore(ctx, "alice", m.ID, w2)
		if err != nil {
			t.Fatal(err)
		}
		if res.Files != 7 || res.Symlinks != 3 || res.Dirs != 6 {
			t.Errorf("restored %+v", res)
		}
		diffTrees(t, want, tree(t, dir2))
		st, err := readState(t, s, "alice", m.ID)
		if err != nil || !bytes.Equal(st, state) {
			t.Fatalf("state: %v, %d bytes, equal %v", err, len(st), bytes.Equal(st, state))
		}
		ls, err := s.List(ctx, "alice")
		if err != nil || len(ls) != 1 || ls[0].ID != m.ID {
			t.Fatalf("List: %v %v", err, ls)
		}
		if _, err := s.Verify(ctx, "alice", m.ID); err != nil {
			t.Fatal(err)
		}
	})
}

// Thousands of small files: restore counts the workspace's usage instead
// of walking it before each file.
func TestManySmallFiles(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		for i := range 1500 {
			mustWrite(t, filepath.Join(dir, fmt.Sprintf("pkg%d/mod%d.py", i%30, i)), []byte(fmt.Sprintf("x = %d\n", i%700)), 0o644)
		}
		want := tree(t, dir)
		t0 := time.Now()
		m, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("1500 files: snapshot %v", time.Since(t0))
		if m.Blobs != 700 {
			t.Errorf("%d blobs for 700 distinct contents", m.Blobs)
		}
		w2, dir2 := newWorkspace(t)
		t0 = time.Now()
		if _, _, err := s.Restore(ctx, "o", m.ID, w2); err != nil {
			t.Fatal(err)
		}
		t.Logf("restore %v", time.Since(t0))
		diffTrees(t, want, tree(t, dir2))
	})
}

// files50 writes 50 MB of random (incompressible) files.
func files50(t *testing.T, dir string) {
	for i := range 25 {
		mustWrite(t, filepath.Join(dir, fmt.Sprintf("d%d/f%02d.bin", i%4, i)), randBytes(uint64(100+i), 2<<20), 0o644)
	}
}

func TestDedup(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		files50(t, dir)
		m1, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		// 1 MB overwritten in the middle of one file.
		p := filepath.Join(dir, "d3/f07.bin")
		data, _ := os.ReadFile(p)
		copy(data[600<<10:], randBytes(999, 1<<20))
		mustWrite(t, p, data, 0o644)
		m2, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		// 100 bytes inserted at the start of another: every offset after moves.
		p = filepath.Join(dir, "d2/f10.bin")
		data, _ = os.ReadFile(p)
		mustWrite(t, p, append(randBytes(7, 100), data...), 0o644)
		m3, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("50 MB workspace: first snapshot wrote %.1f MB; after a 1 MB overwrite %.2f MB (%d blobs); after a 100-byte insertion at a file's start %.2f MB (%d blobs)",
			mb(m1.NewBytes), mb(m2.NewBytes), m2.NewBlobs, mb(m3.NewBytes), m3.NewBlobs)
		if m1.NewBytes < 50<<20 {
			t.Errorf("first snapshot wrote %d bytes of 50 MB of random data", m1.NewBytes)
		}
		for _, m := range []*Manifest{m2, m3} {
			if m.NewBytes > 5<<20 || m.NewBytes == 0 {
				t.Errorf("snapshot after a small change wrote %d bytes, want 1..5 MB", m.NewBytes)
			}
		}
	})
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// failingSource fails to read the nth file it opens, after giving part of it.
type failingSource struct {
	Source
	n int
}

func (f *failingSource) Open(p string) (io.ReadCloser, error) {
	r, err := f.Source.Open(p)
	if err != nil {
		return nil, err
	}
	f.n--
	if f.n == 0 {
		return struct {
			io.Reader
			io.Closer
		}{io.MultiReader(io.LimitReader(r, 3<<20), iotestErr{}), r}, nil
	}
	return r, nil
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("disk error (injected)") }

// The child process of TestCrashMidWrite: a Write that stops in the middle
// of the workspace, after some blobs are stored, and waits to be killed.
func crashChild() {
	b, err := openFromEnv()
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	s, _ := New(b, nil)
	w, err := workspace.Open(os.Getenv("SNAPSHOT_TEST_WORKSPACE"), nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	src := &stallingSource{Source: WorkspaceSource(w), after: 10, b: b, before: countBlobs(b)}
	_, err = s.Write(context.Background(), "o", src, nil)
	fmt.Println("error: the write ended", err)
	os.Exit(2)
}

type stallingSource struct {
	Source
	after  int
	b      Backend
	before int // blobs stored before the write
}

func countBlobs(b Backend) (n int) {
	b.List(context.Background(), "blobs/", func(ObjectInfo) error { n++; return nil })
	return n
}

func (f *stallingSource) Open(p string) (io.ReadCloser, error) {
	f.after--
	if f.after == 0 {
		// Wait until blobs of this write are stored, then say so and hang.
		for deadline := time.Now().Add(time.Minute); countBlobs(f.b) < f.before+5; {
			if time.Now().After(deadline) {
				fmt.Println("error: no blobs stored")
				os.Exit(2)
			}
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Println("mid-write")
		select {}
	}
	return f.Source.Open(p)
}

func TestCrashMidWrite(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, env := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		files50(t, dir)
		m1, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		want := tree(t, dir)
		// Change every file, so the next write has new blobs to store.
		for i := range 25 {
			mustWrite(t, filepath.Join(dir, fmt.Sprintf("d%d/f%02d.bin", i%4, i)), randBytes(uint64(500+i), 2<<20), 0o644)
		}

		// The process killed mid-write (SIGKILL).
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append(env, "SNAPSHOT_TEST_CHILD=crash", "SNAPSHOT_TEST_WORKSPACE="+dir)...)
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		timer := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() }) // ends a hung child: the read below fails
		line, _ := bufio.NewReader(out).ReadString('\n')
		timer.Stop()
		if line != "mid-write\n" {
			t.Fatalf("child said %q", line)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()

		blobs := 0
		b.List(ctx, "blobs/", func(ObjectInfo) error { blobs++; return nil })
		ls, err := s.List(ctx, "o")
		if err != nil || len(ls) != 1 || ls[0].ID != m1.ID {
			t.Fatalf("after the crash List: %v, %d snapshots (want only the first)", err, len(ls))
		}
		w2, dir2 := newWorkspace(t)
		if _, _, err := s.Restore(ctx, "o", m1.ID, w2); err != nil {
			t.Fatal(err)
		}
		diffTrees(t, want, tree(t, dir2))

		// An error mid-way (a file unreadable after 3 MB) leaves no snapshot either.
		_, err = s.Write(ctx, "o", &failingSource{Source: WorkspaceSource(w), n: 20}, nil)
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("write with a failing file: %v", err)
		}
		if ls := mustList(t, s, "o"); len(ls) != 1 {
			t.Fatalf("%d snapshots after a failed write", len(ls))
		}
		blobs = countBlobs(b)

		// The dead writer's lock holds off garbage collection until it is
		// stale; then the blobs it left are collected, and the first
		// snapshot's kept.
		c, err := s.Collect(ctx)
		if err != nil || !c.Skipped {
			t.Fatalf("collect while the dead writer's lock is fresh: %+v %v", c, err)
		}
		s2 := newStore(t, b, &Options{LockTTL: 300 * time.Millisecond})
		deadline := time.Now().Add(20 * time.Second)
		for c.Skipped && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			if c, err = s2.Collect(ctx); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("after the crash: %d blobs, %d of them collected", blobs, c.Deleted)
		// (More blobs than counted: an upload the killed writer had
		// already sent can land at an S3 server after the kill. They are
		// garbage too, and collected: the count below checks that.)
		if c.Skipped || c.Deleted < 5 || c.Blobs < blobs {
			t.Fatalf("collection: %+v (of %d blobs)", c, blobs)
		}
		if n := countBlobs(b); n != m1.Blobs {
			t.Fatalf("%d blobs left, the snapshot has %d", n, m1.Blobs)
		}
		if _, err := s.Verify(ctx, "o", m1.ID); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCorruption(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		mustWrite(t, filepath.Join(dir, "a.txt"), []byte("first file\n"), 0o644)
		mustWrite(t, filepath.Join(dir, "z/victim.bin"), randBytes(11, 3<<20), 0o644)
		m, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{State: stateOf(randBytes(12, 2<<20))})
		if err != nil {
			t.Fatal(err)
		}
		var victim Chunk
		for _, f := range m.Files {
			if f.Path == "z/victim.bin" {
				victim = f.Chunks[len(f.Chunks)-1]
			}
		}
		key := blobKey(victim.Hash)
		orig, err := b.Get(ctx, key, 8<<20)
		if err != nil {
			t.Fatal(err)
		}
		restoreInto := func() (string, error) {
			w2, dir2 := newWorkspace(t)
			mustWrite(t, filepath.Join(dir2, "keep.txt"), []byte("was here"), 0o644)
			_, _, err := s.Restore(ctx, "o", m.ID, w2)
			return dir2, err
		}
		// A flipped bit, a truncated blob, a missing one.
		flipped := bytes.Clone(orig)
		flipped[len(flipped)/2] ^= 0x10
		for _, c := range []struct {
			name   string
			data   []byte
			reason string
		}{{"flipped", flipped, "blob"}, {"truncated", orig[:len(orig)-100], "blob"}, {"missing", nil, "a blob is missing"}} {
			if c.data == nil {
				b.Delete(ctx, key)
			} else if err := b.Put(ctx, key, c.data); err != nil {
				t.Fatal(err)
			}
			dir2, err := restoreInto()
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Of != "file z/victim.bin" || ce.Object != key || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("%s blob: restore error %v", c.name, err)
			}
			t.Logf("%s: %v", c.name, err)
			// Never half-restored: the destination is as it was.
			got := tree(t, dir2)
			if len(got) != 1 || !strings.HasPrefix(got["keep.txt"], "file") {
				t.Fatalf("%s: the destination after a refused restore: %v", c.name, got)
			}
			if _, err := s.Verify(ctx, "o", m.ID); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: Verify: %v", c.name, err)
			}
		}
		b.Put(ctx, key, orig)
		if _, err := restoreInto(); err != nil {
			t.Fatalf("restore after repair: %v", err)
		}

		// The state stream.
		sk := blobKey(m.State.Chunks[0].Hash)
		so, _ := b.Get(ctx, sk, 8<<20)
		bad := bytes.Clone(so)
		bad[10] ^= 1
		b.Put(ctx, sk, bad)
		if _, err := readState(t, s, "o", m.ID); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "kernel state") {
			t.Fatalf("corrupt state: %v", err)
		}
		b.Put(ctx, sk, so)

		// The manifest.
		mk := manifestKey("o", m.ID)
		md, _ := b.Get(ctx, mk, maxManifest)
		badm := bytes.Replace(md, []byte(`"a.txt"`), []byte(`"b.txt"`), 1)
		b.Put(ctx, mk, badm)
		_, err = s.Get(ctx, "o", m.ID)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "manifest does not match its checksum") {
			t.Fatalf("corrupt manifest: %v", err)
		}
		if _, _, err := s.Restore(ctx, "o", m.ID, w); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("restore of a corrupt manifest: %v", err)
		}
		// A corrupt manifest stops garbage collection (its blobs are not swept)
		// until it is deleted.
		if _, err := s.Collect(ctx); err == nil {
			t.Fatal("collect with a corrupt manifest succeeded")
		}
		if err := s.Delete(ctx, "o", m.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "o", m.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}

		// A manifest written by someone else, with a consistent checksum but
		// a path leading out: refused before anything is written.
		evil := *m
		evil.ID = "snap-evil0000"
		evil.Files = []File{{Path: "../../escaped", Type: "symlink", Target: "/"}}
		data, _ := encodeManifest(&evil)
		b.Put(ctx, manifestKey("o", evil.ID), data)
		w3, dir3 := newWorkspace(t)
		if _, _, err := s.Restore(ctx, "o", evil.ID, w3); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "bad path") {
			t.Fatalf("a manifest with ../: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(dir3, "../../escaped")); len(tree(t, dir3)) != 0 || !errors.Is(err, fs.ErrNotExist) {
			t.Fatal("a manifest with ../ wrote something")
		}
	})
}

func TestOwnerIsolation(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		mustWrite(t, filepath.Join(dir, "secret.txt"), []byte("alice's"), 0o644)
		m, err := s.Write(ctx, "alice", WorkspaceSource(w), &WriteOptions{State: stateOf([]byte("x"))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "bob", m.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get by another owner: %v", err)
		}
		w2, dir2 := newWorkspace(t)
		if _, _, err := s.Restore(ctx, "bob", m.ID, w2); !errors.Is(err, ErrNotFound) {
			t.Errorf("Restore by another owner: %v", err)
		}
		if len(tree(t, dir2)) != 0 {
			t.Error("another owner's restore wrote files")
		}
		if _, _, err := s.OpenState(ctx, "bob", m.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("OpenState by another owner: %v", err)
		}
		if err := s.Delete(ctx, "bob", m.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("Delete by another owner: %v", err)
		}
		if ls, err := s.List(ctx, "bob"); err != nil || len(ls) != 0 {
			t.Errorf("bob's list: %v %v", ls, err)
		}
		if _, err := s.Get(ctx, "alice", m.ID); err != nil {
			t.Errorf("alice's snapshot after bob's attempts: %v", err)
		}
		if _, err := s.Get(ctx, "alice", "../../x"); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("a malformed id: %v (want an ArgumentError)", err)
		}
		var keys []string
		b.List(ctx, "", func(o ObjectInfo) error { keys = append(keys, o.Key); return nil })
		for _, k := range keys {
			if strings.Contains(k, "alice") {
				t.Errorf("an owner's name is in a storage key: %s", k)
			}
		}
	})
}

func TestQuota(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, &Options{Quota: 3 << 20})
		w, dir := newWorkspace(t)
		mustWrite(t, filepath.Join(dir, "a.bin"), randBytes(21, 2<<20), 0o644)
		m1, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		// The same content again costs nothing: allowed.
		if _, err := s.Write(ctx, "o", WorkspaceSource(w), nil); err != nil {
			t.Fatalf("an unchanged second snapshot: %v", err)
		}
		mustWrite(t, filepath.Join(dir, "b.bin"), randBytes(22, 2<<20), 0o644)
		_, err = s.Write(ctx, "o", WorkspaceSource(w), nil)
		var qe *QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) || qe.Quota != 3<<20 || qe.Used < 2<<20 {
			t.Fatalf("over quota: %v", err)
		}
		t.Log(err)
		if ls, _ := s.List(ctx, "o"); len(ls) != 2 {
			t.Fatalf("%d snapshots after a refused one, want 2", len(ls))
		}
		// Another owner has a quota of its own.
		if _, err := s.Write(ctx, "other", WorkspaceSource(w), nil); err == nil {
			t.Fatal("4 MB for another owner with a 3 MB quota")
		}
		os.Remove(filepath.Join(dir, "a.bin"))
		if _, err := s.Write(ctx, "other", WorkspaceSource(w), nil); err != nil {
			t.Fatalf("2 MB for another owner: %v", err)
		}
		// Deleting frees the owner's bytes.
		for _, m := range mustList(t, s, "o") {
			s.Delete(ctx, "o", m.ID)
		}
		if u, _ := s.Usage(ctx, "o"); u != 0 {
			t.Fatalf("usage after deleting everything: %d", u)
		}
		if _, err := s.Get(ctx, "o", m1.ID); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
	})
}

func mustList(t *testing.T, s *Store, owner string) []*Manifest {
	t.Helper()
	ls, err := s.List(context.Background(), owner)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func TestRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, &Options{MaxAge: time.Hour, MaxPerSession: 2})
		w, dir := newWorkspace(t)
		var ids []string
		var ms []*Manifest
		for i := range 3 {
			mustWrite(t, filepath.Join(dir, "f.bin"), randBytes(uint64(30+i), 1<<20), 0o644)
			m, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{Session: "s-1"})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.ID)
			ms = append(ms, m)
			time.Sleep(2 * time.Millisecond) // distinct creation times
		}
		other, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{Session: "s-2"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Maintain(ctx, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Expired) != 1 || res.Expired[0] != ids[0] || res.Collected.Deleted != ms[0].Blobs {
			t.Fatalf("maintain: expired %v (want the oldest of s-1, %s), collected %+v", res.Expired, ids[0], res.Collected)
		}
		if len(mustList(t, s, "o")) != 3 {
			t.Fatal("want 3 left")
		}
		res, err = s.Maintain(ctx, time.Now().Add(2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Expired) != 3 || len(mustList(t, s, "o")) != 0 || res.Collected.Deleted != ms[1].Blobs+ms[2].Blobs {
			t.Fatalf("maintain 2 h later: expired %v, collected %+v", res.Expired, res.Collected)
		}
		_ = other
		n := 0
		b.List(ctx, "blobs/", func(ObjectInfo) error { n++; return nil })
		if n != 0 {
			t.Fatalf("%d blobs left with no snapshot", n)
		}
	})
}

func TestGCKeepsShared(t *testing.T) {
	eachBackend(t, func(t *testing.T, bc backendCase) {
		ctx := context.Background()
		b, _ := bc.open(t)
		s := newStore(t, b, nil)
		w, dir := newWorkspace(t)
		mustWrite(t, filepath.Join(dir, "shared.bin"), randBytes(41, 2<<20), 0o644)
		mustWrite(t, filepath.Join(dir, "only-a.bin"), randBytes(42, 1<<20), 0o644)
		a, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dir, "only-a.bin"))
		mustWrite(t, filepath.Join(dir, "only-b.bin"), randBytes(43, 1<<20), 0o644)
		want := tree(t, dir)
		// Another owner holds the same shared file.
		bsnap, err := s.Write(ctx, "p", WorkspaceSource(w), nil)
		if err != nil {
			t.Fatal(err)
		}
		count := func() (n int) {
			b.List(ctx, "blobs/", func(ObjectInfo) error { n++; return nil })
			return n
		}
		before := count()
		if err := s.Delete(ctx, "o", a.ID); err != nil {
			t.Fatal(err)
		}
		onlyA := 0
		for _, f := range a.Files {
			if f.Path == "only-a.bin" {
				onlyA = len(f.Chunks)
			}
		}
		if after := count(); after != before-onlyA || onlyA == 0 {
			t.Fatalf("blobs %d -> %d after deleting a snapshot with %d unshared blobs", before, after, onlyA)
		}
		w2, dir2 := newWorkspace(t)
		if _, _, err := s.Restore(ctx, "p", bsnap.ID, w2); err != nil {
			t.Fatal(err)
		}
		diffTrees(t, want, tree(t, dir2))

		// A collection while a Write runs gives up its turn; a Write while a
		// collection holds its lock waits for it.
		gate := make(chan struct{})
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := s.Write(ctx, "o", &gatedSource{Source: WorkspaceSource(w), started: started, gate: gate}, nil)
			done <- err
		}()
		<-started
		c, err := s.Collect(ctx)
		if err != nil || !c.Skipped {
			t.Fatalf("collect during a write: %+v %v", c, err)
		}
		close(gate)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		gcLock, err := s.putLock(ctx, "gc")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := s.Write(ctx, "o", WorkspaceSource(w), nil)
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("a write ended while a collection held its lock: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		gcLock.release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		// A collection that died: its lock, no longer refreshed, holds off
		// writes only until it is stale.
		if err := b.Put(ctx, "locks/gc-dead", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := s.Write(short, "o", WorkspaceSource(w), nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a write while a fresh collection lock exists: %v", err)
		}
		s3 := newStore(t, b, &Options{LockTTL: 500 * time.Millisecond})
		long, cancel2 := context.WithTimeout(ctx, time.Minute)
		defer cancel2()
		if _, err := s3.Write(long, "o", WorkspaceSource(w), nil); err != nil {
			t.Fatalf("a write after the dead collection's lock went stale: %v", err)
		}
	})
}

type gatedSource struct {
	Source
	started chan struct{}
	gate    chan struct{}
	once    bool
}

func (g *gatedSource) Open(p string) (io.ReadCloser, error) {
	if !g.once {
		g.once = true
		close(g.started)
		<-g.gate
	}
	return g.Source.Open(p)
}

func TestChunkerCuts(t *testing.T) {
	data := randBytes(5, 20<<20)
	c := newChunker(bytes.NewReader(data))
	var sizes []int
	var all []byte
	for {
		b, err := c.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b = b[rawHead:]
		all = append(all, b...)
		sizes = append(sizes, len(b))
	}
	if !bytes.Equal(all, data) {
		t.Fatal("chunks do not join into the input")
	}
	for i, n := range sizes {
		if n > maxChunk || (n < minChunk && i != len(sizes)-1) {
			t.Fatalf("chunk %d: %d bytes", i, n)
		}
	}
	avg := len(data) / len(sizes)
	if avg < 512<<10 || avg > 3<<20 {
		t.Fatalf("average chunk %d bytes over %d chunks", avg, len(sizes))
	}
	sum := sha256.Sum256(all)
	t.Logf("%d chunks, average %d KiB, %s", len(sizes), avg>>10, hex.EncodeToString(sum[:4]))
}

func TestMain(m *testing.M) {
	if os.Getenv("SNAPSHOT_TEST_CHILD") == "crash" {
		crashChild()
	}
	code := m.Run()
	stopWeed()
	os.Exit(code)
}

// A held snapshot (a hibernated session's) outlives MaxAge and
// MaxPerSession, until HeldMaxAge.
func TestRetentionKeepsHeld(t *testing.T) {
	ctx := context.Background()
	b, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, &Options{MaxAge: time.Hour, MaxPerSession: 1, HeldMaxAge: 48 * time.Hour})
	w, dir := newWorkspace(t)
	mustWrite(t, filepath.Join(dir, "f.bin"), randBytes(77, 1<<20), 0o644)
	held, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{Session: "s-1", Held: true, Name: "hibernation"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	plain, err := s.Write(ctx, "o", WorkspaceSource(w), &WriteOptions{Session: "s-1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Maintain(ctx, time.Now().Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Expired) != 1 || res.Expired[0] != plain.ID {
		t.Fatalf("2 h later: expired %v, want only %s (the held one kept)", res.Expired, plain.ID)
	}
	if m, err := s.Get(ctx, "o", held.ID); err != nil || !m.Held || m.Name != "hibernation" {
		t.Fatalf("the held snapshot: %+v %v", m, err)
	}
	res, err = s.Maintain(ctx, time.Now().Add(49*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Expired) != 1 || res.Expired[0] != held.ID {
		t.Fatalf("past HeldMaxAge: expired %v, want %s", res.Expired, held.ID)
	}
}
