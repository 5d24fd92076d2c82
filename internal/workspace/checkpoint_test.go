package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/sandloop/sandloop/internal/testutil"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newStore(t testing.TB) *CheckpointStore {
	t.Helper()
	s, err := OpenCheckpointStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// treeOf describes every entry under dir byte for byte, mtimes included.
func treeOf(t testing.TB, dir string) map[string]string {
	return testutil.Tree(t, dir, true)
}

func writeFile(t testing.TB, dir, rel, content string, mode fs.FileMode) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func diffTrees(a, b map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if a[k] != b[k] {
			out = append(out, fmt.Sprintf("%s: want %q, have %q", k, a[k], b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: extra %q", k, b[k]))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func TestCheckpointRestoreExact(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	writeFile(t, dir, "a.txt", "alpha\n", 0o644)
	writeFile(t, dir, "run.sh", "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, dir, "empty", "", 0o600)
	writeFile(t, dir, "src/pkg/mod.py", "x = 1\n", 0o644)
	writeFile(t, dir, "src/pkg/same.py", "x = 1\n", 0o644) // same content: one blob
	writeFile(t, dir, "was-file", "I was a file\n", 0o644)
	writeFile(t, dir, "was-dir/inner.txt", "inside\n", 0o644)
	os.Mkdir(filepath.Join(dir, "emptydir"), 0o750)
	os.Chmod(filepath.Join(dir, "emptydir"), 0o750)
	os.Symlink("a.txt", filepath.Join(dir, "link-a"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "link-out"))
	want := treeOf(t, dir)

	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Files != 7 || cp.Bytes != int64(len("alpha\n#!/bin/sh\necho hi\nx = 1\nx = 1\nI was a file\ninside\n")) {
		t.Errorf("checkpoint %+v: want 7 files and their bytes", cp)
	}
	if held := s.HeldBytes(); held != cp.Bytes-int64(len("x = 1\n")) {
		t.Errorf("held %d bytes, want %d (identical files stored once)", held, cp.Bytes-6)
	}

	// Change everything there is to change.
	writeFile(t, dir, "a.txt", "ALPHA changed\n", 0o644)
	os.Chmod(filepath.Join(dir, "run.sh"), 0o600)
	os.Remove(filepath.Join(dir, "empty"))
	os.RemoveAll(filepath.Join(dir, "src/pkg"))
	writeFile(t, dir, "new.txt", "added since\n", 0o644)
	writeFile(t, dir, "newdir/deep/x", "added since\n", 0o644)
	os.Remove(filepath.Join(dir, "was-file"))
	writeFile(t, dir, "was-file/now-a-dir.txt", "dir now\n", 0o644)
	os.RemoveAll(filepath.Join(dir, "was-dir"))
	writeFile(t, dir, "was-dir", "file now\n", 0o644)
	os.Remove(filepath.Join(dir, "link-a"))
	os.Symlink("run.sh", filepath.Join(dir, "link-a"))
	os.Remove(filepath.Join(dir, "link-out"))
	writeFile(t, dir, "link-out", "a file where a link was\n", 0o644)
	os.Remove(filepath.Join(dir, "emptydir"))
	if diffTrees(want, treeOf(t, dir)) == "" {
		t.Fatal("the changes changed nothing")
	}

	res, err := s.Restore(w, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(want, treeOf(t, dir)); d != "" {
		t.Fatalf("after restore (%+v), the workspace differs from the checkpoint:\n%s", res, d)
	}
	if res.Unchanged != 0 || res.Removed < 4 || res.Written < 8 {
		t.Errorf("first restore: %+v", res)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".sandloop-restore-*"))
	if len(leftovers) != 0 {
		t.Errorf("temp files left: %v", leftovers)
	}

	// Restore twice: nothing left to do; nothing is written.
	inodes := map[string]uint64{}
	for _, p := range []string{"a.txt", "src/pkg/mod.py", "run.sh"} {
		fi, _ := os.Lstat(filepath.Join(dir, p))
		inodes[p] = fi.Sys().(*syscall.Stat_t).Ino
	}
	res, err = s.Restore(w, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Written != 0 || res.Removed != 0 || res.Unchanged != 9 {
		t.Errorf("second restore: %+v, want 9 unchanged (7 files, 2 links) and nothing written", res)
	}
	for p, ino := range inodes {
		fi, _ := os.Lstat(filepath.Join(dir, p))
		if fi.Sys().(*syscall.Stat_t).Ino != ino {
			t.Errorf("%s was rewritten by a restore that had nothing to do", p)
		}
	}
	if d := diffTrees(want, treeOf(t, dir)); d != "" {
		t.Fatalf("after the second restore:\n%s", d)
	}

	// A later checkpoint, then back to the first, then to the later one.
	writeFile(t, dir, "a.txt", "second version\n", 0o644)
	want2 := treeOf(t, dir)
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.Copied != int64(len("second version\n")) {
		t.Errorf("second take copied %d bytes, want only a.txt's", cp2.Copied)
	}
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(want, treeOf(t, dir)); d != "" {
		t.Fatalf("back to the first:\n%s", d)
	}
	if _, err := s.Restore(w, cp2.ID); err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(want2, treeOf(t, dir)); d != "" {
		t.Fatalf("back to the second:\n%s", d)
	}

	// Drop frees what only it held; an unknown id is an error.
	before := s.HeldBytes()
	if err := s.Drop(cp.ID); err != nil {
		t.Fatal(err)
	}
	if got := s.HeldBytes(); got != before-int64(len("alpha\n")) {
		t.Errorf("after drop: held %d, want %d", got, before-6)
	}
	if _, err := s.Restore(w, cp.ID); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("restore of a dropped checkpoint: %v", err)
	}
	if err := s.Drop("nope"); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("drop unknown: %v", err)
	}
	blobs, _ := os.ReadDir(filepath.Join(s.Dir(), "blobs"))
	if len(blobs) != 6 {
		t.Errorf("%d blobs on disk after the drop, want 6", len(blobs))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Close left the store's directory: %v", err)
	}
}

// A checkpoint's copy is the store's: changing a workspace file after it
// was taken (in place, same inode) does not change what is restored.
func TestCheckpointNotLinkedToWorkspace(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	writeFile(t, dir, "data.bin", "original", 0o644)
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "data.bin"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("CHANGED!"), 0) // same size, same inode
	f.Close()
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "data.bin")); string(b) != "original" {
		t.Fatalf("restored %q, want the checkpoint's", b)
	}
}

func TestCheckpointSymlinkEscapeContained(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	outside := t.TempDir()
	writeFile(t, outside, "secret", "host secret\n", 0o644)
	writeFile(t, outside, "victim", "must survive\n", 0o644)
	outsideBefore := treeOf(t, outside)

	writeFile(t, dir, "d/f.txt", "inside\n", 0o644)
	writeFile(t, dir, "victim", "workspace victim\n", 0o644)
	os.Symlink(outside, filepath.Join(dir, "abs"))
	os.Symlink("../../../../../../.."+outside+"/secret", filepath.Join(dir, "rel"))
	want := treeOf(t, dir)
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Files != 2 || cp.Bytes != int64(len("inside\nworkspace victim\n")) {
		t.Errorf("checkpoint %+v: a symlink was followed", cp)
	}

	// The sandbox replaces the directory d with a link out, and a file
	// with a link to a host file, hoping the restore writes through them.
	os.RemoveAll(filepath.Join(dir, "d"))
	os.Symlink(outside, filepath.Join(dir, "d"))
	os.Remove(filepath.Join(dir, "victim"))
	os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dir, "victim"))
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(outsideBefore, treeOf(t, outside)); d != "" {
		t.Fatalf("the restore changed a directory outside the workspace:\n%s", d)
	}
	if d := diffTrees(want, treeOf(t, dir)); d != "" {
		t.Fatalf("after restore:\n%s", d)
	}

	// A workspace that is a link into the host at Take: links are kept as
	// links, never read through.
	os.RemoveAll(filepath.Join(dir, "d"))
	os.Symlink("/etc", filepath.Join(dir, "d"))
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.Files != 1 {
		t.Errorf("take through a link to /etc: %+v", cp2)
	}
}

func TestCheckpointSkipsFIFO(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	writeFile(t, dir, "a", "a", 0o644)
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Skip("no FIFO here:", err)
	}
	cp, err := s.Take(w) // must not block on the FIFO
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cp.Skipped, []string{"pipe"}) || cp.Files != 1 {
		t.Errorf("checkpoint %+v: want the FIFO listed as skipped", cp)
	}
	syscall.Mkfifo(filepath.Join(dir, "pipe2"), 0o644) // made since: removed
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "pipe")); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO there at the checkpoint was not left alone: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "pipe2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a FIFO made since is still there: %v", err)
	}
}

func TestCheckpointOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files away")
	}
	w, dir := newWS(t, Options{OwnerSet: true, UID: 65534, GID: 65534})
	s := newStore(t)
	writeFile(t, dir, "sub/f", "x", 0o644)
	os.Symlink("f", filepath.Join(dir, "sub/l"))
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(dir, "sub"))
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"sub", "sub/f", "sub/l"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("%s restored as %d:%d, want the workspace's owner 65534", p, st.Uid, st.Gid)
		}
	}
	info, err := os.Stat(s.Dir())
	if err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("store directory mode %v: want 0700 (the server's only)", info.Mode())
	}
}

// makeTree writes n files of size bytes each (random content) in 10
// directories under dir.
func makeTree(t testing.TB, dir string, n, size int) {
	t.Helper()
	buf := make([]byte, size)
	for i := range n {
		for j := range buf {
			buf[j] = byte(i*7 + j*13 + j>>8)
		}
		copy(buf, fmt.Sprintf("file %d\n", i))
		p := filepath.Join(dir, fmt.Sprintf("d%d/f%03d.bin", i%10, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ageFiles waits until files written before it are past the racy window,
// so the store may trust their identity.
func ageFiles() { time.Sleep(racyWindow + 10*time.Millisecond) }

func TestCheckpointDedup(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	makeTree(t, dir, 50, 1<<20) // 50 MiB
	ageFiles()
	cp1, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp1.Copied != 50<<20 || cp1.Files != 50 {
		t.Fatalf("first take %+v: want 50 files, 50 MiB copied", cp1)
	}
	// Rewrite one MiB (a new file, as an editor saves), add nothing else.
	writeFile(t, dir, "d3/f003.bin", strings.Repeat("z", 1<<20), 0o644)
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.Copied != 1<<20 {
		t.Errorf("second take after a 1 MiB change copied %d bytes, want 1 MiB", cp2.Copied)
	}
	if held := s.HeldBytes(); held != 51<<20 {
		t.Errorf("held %d, want 51 MiB", held)
	}
	// A third take right away: the changed file is racily clean (hashed
	// again), the rest trusted; nothing is copied.
	cp3, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp3.Copied != 0 {
		t.Errorf("third take of an unchanged tree copied %d bytes", cp3.Copied)
	}
	for _, id := range []string{cp1.ID, cp3.ID} {
		if err := s.Drop(id); err != nil {
			t.Fatal(err)
		}
	}
	if held := s.HeldBytes(); held != 50<<20 {
		t.Errorf("after dropping the first: held %d, want 50 MiB", held)
	}
	if _, err := s.Restore(w, cp2.ID); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCheckpoint takes and restores checkpoints of a 50 MiB
// workspace (200 files) after a 1 MiB change, and in the same run copies
// the tree with cp -a (the baseline); it reports the medians and ratios.
func BenchmarkCheckpoint(b *testing.B) {
	w, dir := newWS(b, Options{})
	s := newStore(b)
	makeTree(b, dir, 200, 256<<10)
	ageFiles()
	base, err := s.Take(w)
	if err != nil {
		b.Fatal(err)
	}
	ageFiles()
	change := func(i int) {
		b.Helper()
		// 1 MiB: four files rewritten.
		for j := range 4 {
			p := fmt.Sprintf("d%d/f%03d.bin", (i*4+j)%10, (i*4+j)%200)
			writeFile(b, dir, p, strings.Repeat(string(rune('a'+(i*4+j)%26)), 256<<10), 0o644)
		}
	}
	cpDir := b.TempDir()
	var takeT, restoreT, cpT []time.Duration
	var copied int64
	for i := 0; b.Loop(); i++ {
		change(i)
		t0 := time.Now()
		cp, err := s.Take(w)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		copied += cp.Copied
		res, err := s.Restore(w, base.ID)
		t2 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		if res.Written != 4 {
			b.Fatalf("restore wrote %d files, want the 4 changed", res.Written)
		}
		dst := filepath.Join(cpDir, fmt.Sprint(i))
		out, err := exec.Command("cp", "-a", dir, dst).CombinedOutput()
		t3 := time.Now()
		if err != nil {
			b.Fatalf("cp -a: %v %s", err, out)
		}
		os.RemoveAll(dst)
		if err := s.Drop(cp.ID); err != nil {
			b.Fatal(err)
		}
		takeT = append(takeT, t1.Sub(t0))
		restoreT = append(restoreT, t2.Sub(t1))
		cpT = append(cpT, t3.Sub(t2))
	}
	b.StopTimer()
	mt, mr, mc := median(takeT), median(restoreT), median(cpT)
	b.ReportMetric(float64(mt.Microseconds())/1e3, "take-ms")
	b.ReportMetric(float64(mr.Microseconds())/1e3, "restore-ms")
	b.ReportMetric(float64(mc.Microseconds())/1e3, "cp-a-ms")
	b.ReportMetric(float64(mt)/float64(mc), "take/cp")
	b.ReportMetric(float64(mr)/float64(mc), "restore/cp")
	b.Logf("50 MiB, 200 files, 1 MiB changed: take median %v (copied %d KiB each), restore median %v; cp -a of the tree median %v; take/cp %.3f, restore/cp %.3f (n=%d)",
		mt, copied/int64(len(takeT))>>10, mr, mc, float64(mt)/float64(mc), float64(mr)/float64(mc), len(takeT))
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// A fork's workspace: a checkpoint restored into another workspace, held
// by a Dup while the original is dropped; the store still takes only its
// own workspace, and its knowledge of it is not disturbed.
func TestCheckpointRestoreElsewhere(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	makeTree(t, dir, 5, 1000)
	os.Symlink("d0/f000.bin", filepath.Join(dir, "link"))
	want := treeOf(t, dir)
	ageFiles()
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := s.Dup(cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(cp.ID); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		w2, dir2 := newWS(t, Options{})
		writeFile(t, dir2, "stale", "x", 0o644)
		if _, err := s.Restore(w2, dup); err != nil {
			t.Fatal(err)
		}
		if d := diffTrees(want, treeOf(t, dir2)); d != "" {
			t.Fatalf("restored elsewhere:\n%s", d)
		}
		if _, err := s.Take(w2); err == nil {
			t.Error("a store took checkpoints of a second workspace")
		}
	}
	// The home workspace's files are still known: nothing is copied.
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.Copied != 0 {
		t.Errorf("take after restoring elsewhere copied %d bytes", cp2.Copied)
	}
	if err := s.Drop(dup); err != nil {
		t.Fatal(err)
	}
	if got := s.HeldBytes(); got != 5000 {
		t.Errorf("held %d, want 5000", got)
	}
}

// A file a background process keeps writing is copied as found (after a
// retry or two), not refused; the copies made of its passing versions are
// not kept.
func TestCheckpointFileChangingWhileTaken(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	makeTree(t, dir, 3, 1000)
	writeFile(t, dir, "log", "line 0\n", 0o644)
	// Each time the log has been read, a line is added: every read of it
	// is outdated by the time it ends.
	n := 0
	testHookAfterRead = func(p string) {
		if p != "log" {
			return
		}
		n++
		f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Error(err)
			return
		}
		fmt.Fprintf(f, "line %d\n", n)
		f.Close()
	}
	t.Cleanup(func() { testHookAfterRead = nil })
	cp, err := s.Take(w)
	if err != nil {
		t.Fatalf("take while a file is written: %v", err)
	}
	if n != 3 || cp.Files != 4 {
		t.Errorf("the log was read %d times (want 3: two retries, then kept), %d files", n, cp.Files)
	}
	testHookAfterRead = nil
	// What the store holds is exactly its blobs on disk: the copies of
	// the passing versions are gone.
	var onDisk int64
	des, _ := os.ReadDir(filepath.Join(s.Dir(), "blobs"))
	for _, de := range des {
		fi, _ := de.Info()
		onDisk += fi.Size()
	}
	if onDisk != s.HeldBytes() || len(des) != 4 {
		t.Errorf("%d blobs on disk, %d bytes; held %d: copies of passing versions leaked", len(des), onDisk, s.HeldBytes())
	}
	// Restoring gives the log as its last read found it (three lines).
	if _, err := s.Restore(w, cp.ID); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "log")); string(b) != "line 0\nline 1\nline 2\n" {
		t.Errorf("restored log %q", b)
	}
	// The next take does not trust what it saw of the log: it reads it.
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if cp2.Copied != 0 {
		t.Errorf("second take copied %d bytes", cp2.Copied)
	}
}

// After the only checkpoint is dropped, the next Take copies only what
// changed: the store keeps the copies of the files as it last saw them
// (not counted as held), and forgets those of files changed since.
func TestCheckpointKeepsSeenCopies(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	writeFile(t, dir, "same", "unchanged\n", 0o644)
	writeFile(t, dir, "moving", "v1\n", 0o644)
	time.Sleep(2 * racyWindow) // so that the store trusts what it sees
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(cp.ID); err != nil {
		t.Fatal(err)
	}
	if held := s.HeldBytes(); held != 0 {
		t.Errorf("held %d bytes with no checkpoint", held)
	}
	writeFile(t, dir, "moving", "v2 longer\n", 0o644)
	cp2, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len("v2 longer\n")); cp2.Copied != want || s.HeldBytes() != want+int64(len("unchanged\n")) {
		t.Errorf("second take copied %d bytes, holds %d; want only the changed file copied (%d)", cp2.Copied, s.HeldBytes(), want)
	}
	// The copy of v1 is gone: nothing holds it and the workspace moved on.
	des, _ := os.ReadDir(filepath.Join(s.Dir(), "blobs"))
	if len(des) != 2 {
		t.Errorf("%d blobs on disk, want 2 (same, moving v2)", len(des))
	}
	writeFile(t, dir, "moving", "v3\n", 0o644)
	if _, err := s.Restore(w, cp2.ID); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "moving")); string(b) != "v2 longer\n" {
		t.Errorf("restored %q", b)
	}
}

// A restore into a full quota mount, where the old and the new copy of a
// file do not fit at once, frees the old one first and writes the file in
// place, whole.
func TestCheckpointRestoreIntoFullQuota(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=3m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	w, err := Open(dir, &Options{MaxTotalBytes: 100 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	s := newStore(t)
	want := bytes.Repeat([]byte("a"), 2<<20)
	if err := os.WriteFile(filepath.Join(dir, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("b"), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := s.Restore(w, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "big")); !bytes.Equal(got, want) || res.Written != 1 {
		t.Errorf("restored %d bytes (%d as the checkpoint's), %d written", len(got), len(want), res.Written)
	}
}

// A prepared restore changes nothing the workspace shows until Commit
// (Abort leaves it exactly as it was), and Commit makes it the
// checkpoint's even when the sandbox removed or changed the prepared
// copies meanwhile.
func TestCheckpointPreparedRestore(t *testing.T) {
	w, dir := newWS(t, Options{})
	s := newStore(t)
	writeFile(t, dir, "a.txt", "alpha\n", 0o644)
	writeFile(t, dir, "b.txt", "beta\n", 0o600)
	writeFile(t, dir, "c.txt", "gamma\n", 0o644)
	writeFile(t, dir, "sub/d.txt", "delta\n", 0o644)
	writeFile(t, dir, "gone/e.txt", "epsilon\n", 0o644)
	want := treeOf(t, dir)
	cp, err := s.Take(w)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "a.txt", "ALPHA\n", 0o644)
	writeFile(t, dir, "b.txt", "BETA!\n", 0o600)
	writeFile(t, dir, "c.txt", "GAMMA\n", 0o644)
	writeFile(t, dir, "new.txt", "added\n", 0o644)
	os.Remove(filepath.Join(dir, "sub/d.txt"))
	os.RemoveAll(filepath.Join(dir, "gone"))
	changed := treeOf(t, dir)

	temps := func() []string {
		var out []string
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), ".sandloop-restore-") {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	p, err := s.PrepareRestore(w, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(temps()); n != 4 { // a, b, c and sub/d; gone/e's directory is not there yet
		t.Errorf("prepared %d copies, want 4: %v", n, temps())
	}
	p.Abort()
	if d := diffTrees(changed, treeOf(t, dir)); d != "" {
		t.Fatalf("after an aborted restore the workspace changed:\n%s", d)
	}
	if left := temps(); len(left) != 0 {
		t.Fatalf("an aborted restore left %v", left)
	}

	p, err = s.PrepareRestore(w, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox meddles: one copy removed, one rewritten.
	ts := temps()
	if len(ts) != 4 {
		t.Fatalf("prepared %v", ts)
	}
	os.Remove(ts[0])
	if err := os.WriteFile(ts[1], []byte("meddled"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := p.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if d := diffTrees(want, treeOf(t, dir)); d != "" {
		t.Fatalf("after the prepared restore (%+v), the workspace differs from the checkpoint:\n%s", res, d)
	}
	if left := temps(); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
	if _, err := p.Commit(); err == nil {
		t.Error("a second Commit did not fail")
	}
}
