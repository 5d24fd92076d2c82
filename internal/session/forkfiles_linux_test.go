package session

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/workspace"
)

// mountedUnder lists the mount points of this process's namespace that
// are dir or under it.
func mountedUnder(t *testing.T, dirs ...string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, d := range dirs {
			if f[4] == d || strings.HasPrefix(f[4], d+"/") {
				out = append(out, f[4])
			}
		}
	}
	return out
}

// TestForkOverlay forks into children whose workspaces are overlays over
// one frozen copy of the parent's files: equal at the fork byte for byte;
// a child's writes and deletes (whiteouts) reach neither the parent nor
// the sibling, nor the parent's later ones the children; a child's usage
// counts its own writes only, and a write past its cap fails; the frozen
// copy is reused by the next fork while unchanged; a child forks in turn;
// and once all are closed no mount or directory is left.
func TestForkOverlay(t *testing.T) {
	if how, why := ForkFilesSupport(); how != ForkFilesOverlay {
		t.Skipf("forks copy here: %s", why)
	}
	ctx := context.Background()
	const disk = 16 << 20
	m := forkManager(t, ManagerOptions{Defaults: jail.Limits{Disk: disk, Files: 100}})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	// 10 MB of files: two children may each write 10 MB more of their own
	// under a 16 MiB cap, which a copy would not let them.
	mustOK(t, runCode(t, parent.Session, `
import os
os.makedirs("/workspace/d/e", exist_ok=True)
open("/workspace/big.bin", "wb").write(os.urandom(10_000_000))
open("/workspace/d/small.txt", "w").write("small")
open("/workspace/d/e/gone.txt", "w").write("to delete")
os.chmod("/workspace/d/small.txt", 0o640)
os.symlink("d/small.txt", "/workspace/link")
os.mkfifo("/workspace/fifo")
`))
	before := wsTree(t, parent.Workspace())
	delete(before, "fifo")
	kids, res, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesBy != ForkFilesOverlay || res.Files != 3 {
		t.Errorf("restored %+v: want 3 files by overlay", res)
	}
	if !strings.Contains(strings.Join(res.NotRestored, "\n"), "fifo") {
		t.Errorf("not restored %q: want the FIFO", res.NotRestored)
	}
	a, b := kids[0], kids[1]
	frozen := a.Session.frozen.Load()
	if frozen == nil || b.Session.frozen.Load() != frozen {
		t.Fatal("the children do not share one frozen copy")
	}
	for i, c := range kids {
		if !c.Session.quota.Overlay() {
			t.Fatalf("child %d: its workspace is not an overlay", i)
		}
		if d := treeDiff(before, wsTree(t, c.Workspace())); d != "" {
			t.Fatalf("child %d's files differ from the parent's:\n%s", i, d)
		}
		u, err := c.Usage()
		if err != nil {
			t.Fatal(err)
		}
		if u.Bytes > 1<<20 || u.Files != 0 {
			t.Errorf("child %d's usage at the fork %+v: want nothing of its own (the shared files are not its)", i, u)
		}
	}
	cpA, err := a.Checkpoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// Child a writes, overwrites and deletes; the parent deletes and
	// writes too.
	mustOK(t, runCode(t, a.Session, `
import os, shutil
open("/workspace/d/small.txt", "a").write("+a")
os.remove("/workspace/big.bin")
shutil.rmtree("/workspace/d/e")
os.rename("/workspace/d", "/workspace/d2")
open("/workspace/new-a.bin", "wb").write(os.urandom(10_000_000))
`))
	mustOK(t, runCode(t, parent.Session, `
import os
os.remove("/workspace/d/small.txt")
open("/workspace/parent-later.txt", "w").write("later")
`))
	if got := managedText(t, a, "sorted(os.listdir('/workspace')), open('/workspace/d2/small.txt').read(), os.listdir('/workspace/d2')"); got != "(['d2', 'link', 'new-a.bin'], 'small+a', ['small.txt'])" {
		t.Errorf("child a sees %s", got)
	}
	if d := treeDiff(before, wsTree(t, b.Workspace())); d != "" {
		t.Errorf("the sibling sees a change:\n%s", d)
	}
	if got := managedText(t, parent, "sorted(os.listdir('/workspace')), len(open('/workspace/big.bin','rb').read())"); got != "(['big.bin', 'd', 'fifo', 'link', 'parent-later.txt'], 10000000)" {
		t.Errorf("the parent sees %s", got)
	}
	// a's usage: what it wrote (10 MB, small.txt copied up), not the
	// deleted or shared files.
	u, err := a.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Bytes < 10_000_000 || u.Bytes > 11<<20 {
		t.Errorf("child a's usage %+v: want about the 10 MB it wrote", u)
	}
	// Past its cap (16 MiB: 10 MB written, 10 more asked): ENOSPC, through
	// the kernel and through the files API alike.
	if r := runCode(t, a.Session, "open('/workspace/more.bin', 'wb').write(os.urandom(10_000_000))"); r.Status == "ok" || r.Error == nil || !strings.Contains(r.Error.Value, "No space") {
		t.Errorf("a write past the child's cap: %s %+v, want No space left", r.Status, r.Error)
	}
	ws, err := b.Files(workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// b has written nothing: 10 MB fit (the shared 10 MB are not its), 20
	// do not.
	if _, err := ws.Write("up.bin", bytes.NewReader(make([]byte, 10_000_000))); err != nil {
		t.Errorf("an upload of 10 MB to the sibling: %v", err)
	}
	if _, err := ws.Write("up2.bin", bytes.NewReader(make([]byte, 10_000_000))); err == nil {
		t.Error("an upload past the sibling's cap was stored")
	}
	ws.Close()
	if got := managedText(t, b, "sorted(os.listdir('/workspace'))"); got != "['big.bin', 'd', 'link', 'up.bin']" {
		t.Errorf("the sibling after its upload: %s", got)
	}

	// a's checkpoint brings back the shared files it deleted (whiteouts
	// gone) and removes what it wrote.
	if _, err := a.RestoreCheckpoint(ctx, cpA.ID); err != nil {
		t.Fatal(err)
	}
	if d := treeDiff(before, wsTree(t, a.Workspace())); d != "" {
		t.Errorf("child a after restoring its checkpoint:\n%s", d)
	}
	mustOK(t, runCode(t, a.Session, "os.remove('/workspace/big.bin')\nopen('/workspace/a2', 'w').write('a2')"))

	// A child forks in turn: its grandchild gets the merged view (b's 20
	// MB: more than b's own cap, which counts only its 10).
	grand, _, err := m.Fork(ctx, "alice", b.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := treeDiff(wsTree(t, b.Workspace()), wsTree(t, grand[0].Workspace())); d != "" {
		t.Errorf("the grandchild's files differ from its parent's:\n%s", d)
	}
	// The parent's next fork: its files changed, so a new frozen copy;
	// the fork after that, unchanged, reuses it.
	time.Sleep(100 * time.Millisecond) // past the copy's racy window
	kids2, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f2 := kids2[0].Session.frozen.Load()
	if f2 == frozen {
		t.Error("the fork after a change reused the old frozen copy")
	}
	kids3, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kids3[0].Session.frozen.Load() != f2 {
		t.Error("a fork of unchanged files made a new frozen copy")
	}
	// The parent keeps its last copy: once every child of it is gone, the
	// next fork of the same files still reuses it.
	var dirs []string
	for _, c := range append(kids2, kids3...) {
		dirs = append(dirs, c.Workspace())
		c.Close()
	}
	kids4, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kids4[0].Session.frozen.Load() != f2 {
		t.Error("a fork of unchanged files, its last fork's children gone, made a new frozen copy")
	}

	// Closing: nothing left, the frozen copies gone once their last child
	// (and the parent, for its last one) is.
	all := append(append(append([]*Managed{}, kids...), grand...), kids4...)
	for _, c := range all {
		dirs = append(dirs, c.Workspace())
	}
	dirs = append(dirs, frozen.dir.Path, f2.dir.Path, grand[0].Session.frozen.Load().dir.Path)
	a.Close()
	if _, err := os.Stat(frozen.dir.Path); err != nil {
		t.Errorf("the frozen copy went while child b still uses it: %v", err)
	}
	for _, c := range all {
		c.Close()
	}
	if _, err := os.Stat(f2.dir.Path); err != nil {
		t.Errorf("the parent's last frozen copy went while the parent lives: %v", err)
	}
	parent.Close()
	if got := mountedUnder(t, dirs...); len(got) != 0 {
		t.Errorf("still mounted after close: %q", got)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there after close (%v)", d, err)
		}
	}
}

// TestForkOfForkSharesLower forks children of a fork: one that has
// written no file gives its own children its lower layer as it is (no
// copy); one that changed or deleted a file, or only opened one for
// writing, has its files copied, and its children see its changes.
func TestForkOfForkSharesLower(t *testing.T) {
	if how, why := ForkFilesSupport(); how != ForkFilesOverlay {
		t.Skipf("forks copy here: %s", why)
	}
	ctx := context.Background()
	m := forkManager(t, ManagerOptions{Defaults: jail.Limits{Disk: 16 << 20, Files: 100}})
	parent, err := m.Create(ctx, CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, parent.Session, `
import os
os.makedirs("/workspace/d", exist_ok=True)
open("/workspace/a.txt", "w").write("a")
open("/workspace/d/b.txt", "w").write("b")`))
	kids, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	const show = `sorted((os.path.relpath(os.path.join(r, f), "/workspace"), open(os.path.join(r, f)).read()) for r, _, fs in os.walk("/workspace") for f in fs)`
	for i, c := range []struct {
		cell   string
		shared bool
	}{
		{"import os", true},
		{"import os\nopen('/workspace/a.txt', 'w').write('a2')", false},
		{"import os\nos.remove('/workspace/d/b.txt')", false},
		{"import os\nopen('/workspace/a.txt', 'r+').close()", false}, // copied up, unchanged
	} {
		child := kids[i]
		mustOK(t, runCode(t, child.Session, c.cell))
		want := managedText(t, child, show)
		grand, res, err := m.Fork(ctx, "alice", child.ID(), ForkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := managedText(t, grand[0], "import os\n"+show); got != want {
			t.Errorf("child %d (%q): its fork's files %s, want %s", i, c.cell, got, want)
		}
		if shared := grand[0].Session.frozen.Load() == child.Session.frozen.Load(); shared != c.shared || res.FilesBy != ForkFilesOverlay {
			t.Errorf("child %d (%q): its fork shares its lower layer: %v, want %v (files by %s)", i, c.cell, shared, c.shared, res.FilesBy)
		}
		// A write of the grandchild stays its own.
		mustOK(t, runCode(t, grand[0].Session, "open('/workspace/a.txt', 'w').write('g')"))
		if got := managedText(t, child, show); got != want {
			t.Errorf("child %d sees its fork's write: %s", i, got)
		}
	}
	if got, want := managedText(t, parent, "open('/workspace/a.txt').read()"), "'a'"; got != want {
		t.Errorf("the parent's a.txt: %s", got)
	}
	// A child of a checkpoint's fork (its lower layer restored from the
	// checkpoint, not recorded) has its files copied for its forks.
	cp, err := parent.Checkpoint(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	fromCP, _, err := m.Fork(ctx, "alice", parent.ID(), ForkOptions{Checkpoint: cp.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := managedText(t, fromCP[0], "import os\n"+show)
	grand, _, err := m.Fork(ctx, "alice", fromCP[0].ID(), ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, grand[0], "import os\n"+show); got != want || grand[0].Session.frozen.Load() == fromCP[0].Session.frozen.Load() {
		t.Errorf("a fork of a checkpoint's child: files %s (want %s), its lower layer shared: %v", got, want, grand[0].Session.frozen.Load() == fromCP[0].Session.frozen.Load())
	}
}
