package zygote

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestCheckpointForkedKernel checkpoints and restores a kernel forked from
// the template (PID 2 of its session, signaled by pidfd): the restored
// kernel has the checkpoint's state, is interrupted through the anchor
// that PID 2 becomes, and its crash still ends the session with its signal.
func TestCheckpointForkedKernel(t *testing.T) {
	z := newZygote(t, light)
	ws := t.TempDir()
	ctx := context.Background()
	var proc *Process
	k, err := kernel.Start(ctx, func(ctx context.Context, f kernel.Files) (kernel.Process, error) {
		p, err := z.Fork(ctx, ws, jail.Limits{}, session.KernelEnv(), 0, f)
		proc = p
		return p, err
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	run := func(code string) *kernel.Result {
		t.Helper()
		r, err := k.Execute(ctx, kernel.Request{Code: code, Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run("import random\nrandom.seed(3)\nx = [1, 2]"); r.Status != kernel.StatusOK {
		t.Fatalf("%+v", r)
	}
	cp, err := k.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := run("print(x, random.random())").Stdout
	run("x.append(3); random.random()")
	for i := range 2 {
		if _, err := k.Restore(ctx, cp.ID); err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if got := run("print(x, random.random())").Stdout; got != want {
			t.Fatalf("restore %d: %q, want %q", i, got, want)
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			k.Interrupt()
		}()
		if r := run("import time\nwhile True: time.sleep(0.05)"); r.Status != kernel.StatusInterrupted {
			t.Fatalf("restore %d: interrupt: status %s %+v", i, r.Status, r.Error)
		}
	}
	if got := run("import os; print(os.getppid() != 1, os.getpid() != 2, open('/proc/2/cmdline').read().split('\\0')[1])").Stdout; got != "True True -I\n" {
		t.Errorf("the anchor: %q, want PID 2 the live kernel's parent, running python3 -I", got)
	}
	// The host finds and reads the checkpoint's fresh dormant copy by its
	// name, as a session's background measure does (rootless: the same
	// user's processes in its user namespace); the live kernel took its
	// own name back.
	testutil.WaitFor(t, 30*time.Second, func() error {
		mem, err := kernel.CopiesMemory(proc.HostPids())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := mem[cp.ID]; !ok || len(mem) != 1 {
			return fmt.Errorf("copies found from the host: %v, want checkpoint %d's", mem, cp.ID)
		}
		return nil
	})
	if got := run("print(open('/proc/self/comm').read().strip())").Stdout; strings.HasPrefix(got, "sl-cp") {
		t.Errorf("the live kernel is named %q, a checkpoint copy's name", got)
	}
	r := run("import os; os.kill(os.getpid(), 11)")
	if r.Status != kernel.StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, "SIGSEGV") {
		t.Fatalf("segfault of a restored kernel: status %s %+v, want killed by SIGSEGV", r.Status, r.Error)
	}
}

// TestRootlessCheckpoint runs TestCheckpointForkedKernel as an
// unprivileged user with a delegated cgroup (as TestRootlessZygote runs
// the fork tests): checkpoints need no privilege.
func TestRootlessCheckpoint(t *testing.T) {
	if os.Getenv(rootlessChild) != "" {
		t.Skip("run by the parent")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user (as this user, TestCheckpointForkedKernel runs rootless itself)")
	}
	setup, env := delegate(t, 65534)
	out := asUser(t, "^TestCheckpointForkedKernel$", env, setup)
	if !strings.Contains(out, "--- PASS: TestCheckpointForkedKernel ") {
		t.Fatalf("TestCheckpointForkedKernel did not pass rootless:\n%s", out)
	}
}
