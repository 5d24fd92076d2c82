package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/keeper"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestKeeperDiedWhileCreating: a session whose kernel a keeper spawned
// while the server learned of that keeper's death is put to sleep, as
// KeeperDied's sweep puts the sessions it finds, even when it is
// registered after the sweep. The death is told (KeeperDied) as soon as
// the session's jail is the keeper's child, while its kernel still
// starts: the keeper (a real one, this test binary) is left running, so
// without the check at registration the session would come back awake,
// its kernel held by a keeper the server believes dead. It wakes empty,
// saying everything was lost (it had no snapshot yet).
func TestKeeperDiedWhileCreating(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a keeper's sessions need root (their workspaces are host directories)")
	}
	ctx := context.Background()
	c, err := keeper.Connect(filepath.Join(t.TempDir(), "keeper"), os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	pid := c.Pid()
	t.Cleanup(func() {
		c.Close()
		syscall.Kill(pid, syscall.SIGKILL)
		testutil.WaitFor(t, 30*time.Second, func() error {
			if syscall.Kill(pid, 0) == nil {
				return fmt.Errorf("keeper %d still runs", pid)
			}
			return nil
		})
	})
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st, Records: t.TempDir(), Keeper: c})

	type created struct {
		ms  *Managed
		err error
	}
	done := make(chan created, 1)
	go func() {
		ms, err := m.Create(ctx, CreateOptions{Owner: "alice"})
		done <- created{ms, err}
	}()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if len(childPids(pid)) == 0 {
			return errors.New("the session's jail is not the keeper's child yet")
		}
		return nil
	})
	swept, err := m.KeeperDied(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	var r created
	select {
	case r = <-done:
	case <-time.After(120 * time.Second):
		t.Fatal("the create did not end")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("put to sleep by the sweep: %v (else at its registration)", swept == 1)
	if got := r.ms.State(); got != StateHibernated {
		t.Fatalf("a session created as its keeper died: state %q, want %q", got, StateHibernated)
	}
	if got := managedText(t, r.ms, "import os\nsorted(os.listdir('.')), 'x' in globals()"); got != "([], False)" {
		t.Errorf("woken: %s, want an empty session", got)
	}
	if res := r.ms.Restored(); res == nil || !strings.Contains(res.Lost, "everything") {
		t.Errorf("woken: restored %+v does not say everything was lost", res)
	}
}

// childPids lists the PIDs whose parent is pid.
func childPids(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, n)
		}
	}
	return out
}
