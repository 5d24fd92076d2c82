package keeper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMain(m *testing.M) {
	MaybeRun() // the keepers these tests start are this binary
	os.Exit(m.Run())
}

// newKeeper connects to a new keeper (this test binary) in a temporary
// directory; the cleanup kills it by its PID.
func newKeeper(t *testing.T) (string, *Client) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keeper")
	c, err := Connect(dir, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	// Pinned while it surely runs (it has just answered): a test that
	// killed it leaves its number free for any process by the cleanup.
	keeper := testutil.Pin(t, c.Pid())
	t.Cleanup(func() {
		c.Close()
		keeper.Kill()
		testutil.WaitFor(t, 30*time.Second, func() error {
			if !keeper.Ended() {
				return errors.New("the keeper is still running")
			}
			return nil
		})
	})
	return dir, c
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func parentOf(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func sleeper() *exec.Cmd {
	return &exec.Cmd{Path: "/bin/sleep", Args: []string{"sleep", "600"}}
}

// TestSpawnKeepList: a process the keeper spawned is its child; kept, it
// outlives the connection that spawned it and comes back with its
// descriptors to the next one; dropped, it dies when that connection
// closes; never kept, it dies with the connection that spawned it.
func TestSpawnKeepList(t *testing.T) {
	dir, c := newKeeper(t)
	kept, pidfd, err := c.Spawn(sleeper())
	if err != nil {
		t.Fatal(err)
	}
	pidfd.Close()
	if p := parentOf(kept); p != c.Pid() {
		t.Fatalf("the spawned process's parent is %d, not the keeper %d", p, c.Pid())
	}
	loose, pidfd2, err := c.Spawn(sleeper())
	if err != nil {
		t.Fatal(err)
	}
	pidfd2.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := c.Keep("s1", kept, []byte(`{"hello":"world"}`), []*os.File{w}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := c.Keep("s2", 1, []byte(`{}`), nil); err == nil {
		t.Error("kept a process that is not the keeper's")
	}
	c.Close()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if alive(loose) {
			return errors.New("the process spawned and not kept is still running")
		}
		return nil
	})
	if !alive(kept) {
		t.Fatal("the kept process died with the connection")
	}

	c2, err := Connect(dir, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.Pid() != c.Pid() {
		t.Fatalf("a second keeper (%d, first %d)", c2.Pid(), c.Pid())
	}
	recs, err := c2.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != "s1" || recs[0].Pid != kept || string(recs[0].Meta) != `{"hello":"world"}` || len(recs[0].Files) != 1 {
		t.Fatalf("records: %+v", recs)
	}
	// The descriptor is the pipe's write end: what is written reaches r.
	if _, err := recs[0].Files[0].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	recs[0].Files[0].Close()
	var b [1]byte
	if n, err := r.Read(b[:]); n != 1 || err != nil {
		t.Fatalf("read from the kept pipe: %d %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, metaDir, "s1.json")); err != nil {
		t.Errorf("the record's metadata is not on disk: %v", err)
	}
	if err := c2.Drop("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, metaDir, "s1.json")); err == nil {
		t.Error("the dropped record's metadata is still on disk")
	}
	c2.Close()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if alive(kept) {
			return errors.New("the dropped process is still running after its connection closed")
		}
		return nil
	})
}

// TestKeeperDeath: the keeper's children die with it (Pdeathsig), and a
// client learns of its end.
func TestKeeperDeath(t *testing.T) {
	dir, c := newKeeper(t)
	pid, pidfd, err := c.Spawn(sleeper())
	if err != nil {
		t.Fatal(err)
	}
	pidfd.Close()
	if err := c.Keep("s", pid, []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(c.Pid(), syscall.SIGKILL)
	select {
	case <-c.Dead():
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not learn of the keeper's death")
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if alive(pid) {
			return errors.New("the keeper's child outlived it")
		}
		return nil
	})
	// The next keeper moves the dead one's records to lost/.
	c2, err := Connect(dir, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	pin2 := testutil.Pin(t, c2.Pid()) // after Close it may end and its number be reused
	defer func() {
		c2.Close()
		pin2.Kill()
	}()
	if c2.Pid() == c.Pid() {
		t.Fatal("no new keeper")
	}
	if _, err := os.Stat(filepath.Join(dir, lostDir, "s.json")); err != nil {
		t.Errorf("the dead keeper's record is not in lost/: %v", err)
	}
	if recs, err := c2.List(); err != nil || len(recs) != 0 {
		t.Errorf("the new keeper holds %v (%v)", recs, err)
	}
}

// TestOneServer: a second server is refused while the first is
// connected, and let in once it is gone.
func TestOneServer(t *testing.T) {
	dir, c := newKeeper(t)
	if _, err := dial(dir); err == nil || !strings.Contains(err.Error(), "another sandloop serve") {
		t.Fatalf("a second server: %v", err)
	}
	c.Close()
	c2, err := Connect(dir, os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
}
