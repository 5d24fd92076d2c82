package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/testutil"
)

// sandloop sessions snapshot|snapshots|restore|hibernate|drop-snapshot
// against a real serve with a snapshot store of its own, and serve's
// --idle-hibernate: an idle session hibernates by itself and the next
// request restores it.
func TestSnapshotsCLI(t *testing.T) {
	store := t.TempDir()
	env := startServe(t, "--pool", "0", "--snapshot-store", store, "--idle-hibernate", "2s", "--idle-timeout", "1h")
	c, _ := client.New(env.URL, nil)
	ctx := context.Background()
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cli := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := sandloop(t, "", append([]string{"sessions", "--url", env.URL}, args...)...)
		if code != want {
			t.Fatalf("sessions %v: exit %d, want %d\nstdout %s\nstderr %s", args, code, want, out, errOut)
		}
		return out + errOut
	}
	if r, err := c.Execute(ctx, s.ID, "x = 41\ng = (i for i in [1])\nopen('f.txt','w').write('f')", nil); err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	out := cli(0, "snapshot", s.ID, "--name", "mine")
	if !strings.HasPrefix(out, "snap-") || !strings.Contains(out, "1 file") || !strings.Contains(out, "not restorable: g") {
		t.Fatalf("snapshot: %s", out)
	}
	sid := strings.Fields(out)[0]
	sid = strings.TrimSuffix(sid, ":")
	if out := cli(0, "snapshots"); !strings.Contains(out, sid) || !strings.Contains(out, "mine") {
		t.Errorf("snapshots: %s", out)
	}
	var list struct{ Snapshots []client.Snapshot }
	if err := json.Unmarshal([]byte(cli(0, "snapshots", s.ID, "--json")), &list); err != nil || len(list.Snapshots) != 1 {
		t.Fatalf("snapshots --json: %+v %v", list, err)
	}
	out = cli(0, "restore", sid)
	nid := strings.Fields(out)[0]
	if !strings.Contains(out, "restored from snapshot "+sid) || !strings.Contains(out, "not restored: g") {
		t.Fatalf("restore: %s", out)
	}
	if r, err := c.Execute(ctx, nid, "x + 1, open('f.txt').read()", nil); err != nil || r.Text() != "(42, 'f')" {
		t.Errorf("restored: %+v %v", r, err)
	}
	if out := cli(0, "hibernate", nid); out != nid+" hibernated\n" {
		t.Errorf("hibernate: %q", out)
	}
	if r, err := c.Execute(ctx, nid, "x", nil); err != nil || r.Text() != "41" {
		t.Errorf("after the wake: %+v %v", r, err)
	}
	cli(2, "restore", "nonsense")
	cli(2, "restore", "snap-doesnotexist00")
	cli(0, "drop-snapshot", sid)
	cli(2, "drop-snapshot", sid)

	// --idle-hibernate 2s: the reaper (every 10 s) hibernates the idle
	// session; a request brings it back. (The list is watched: a GET of
	// the session is a use of it, which would keep it awake.)
	testutil.WaitFor(t, 2*time.Minute, func() error {
		all, err := c.ListSessions(ctx)
		if err != nil {
			return err
		}
		for _, got := range all {
			if got.ID == s.ID && got.State != "hibernated" {
				return errors.New("state " + got.State)
			}
		}
		return nil
	})
	if r, err := c.Execute(ctx, s.ID, "x, open('f.txt').read()", nil); err != nil || r.Text() != "(41, 'f')" {
		t.Errorf("after the idle hibernation: %+v %v", r, err)
	}
	if code, _, errOut := sandloop(t, "", "serve", "--idle-hibernate", "2h"); code != 2 || !strings.Contains(errOut, "--idle-timeout") {
		t.Errorf("serve --idle-hibernate 2h: exit %d %s", code, errOut)
	}
	if code, _, errOut := sandloop(t, "", "serve", "--addr", "127.0.0.1:0", "--snapshot-store", "s3://host-only"); code != 2 || !strings.Contains(errOut, "bucket") {
		t.Errorf("serve --snapshot-store s3://host-only: exit %d %s", code, errOut)
	}
}

// A serve killed (SIGKILL) while it writes a snapshot leaves no part of
// it: a new serve on the same snapshot store lists only the snapshot
// before, and restores it with its files exact and its variables.
func TestSnapshotKilledMidWrite(t *testing.T) {
	const token = "kill-token-aaaaaaaaaaaa"
	store := t.TempDir()
	cmd, env, _ := startServeCmd(t, "--pool", "0", "--token", token, "--snapshot-store", store, "--memory", "1G", "--disk", "400M")
	c, _ := client.New(env.URL, &client.Options{Token: token})
	ctx := context.Background()
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	code := "import os, hashlib\nv = 'good'\nopen('a.bin','wb').write(os.urandom(8 << 20))\nh = hashlib.sha256(open('a.bin','rb').read()).hexdigest()\nh"
	r, err := c.Execute(ctx, s.ID, code, nil)
	if err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	want := r.Text()
	good, err := c.Snapshot(ctx, s.ID, "good")
	if err != nil {
		t.Fatal(err)
	}
	// A big change, so the next snapshot writes many blobs; kill serve
	// once it has written some of them.
	if r, err := c.Execute(ctx, s.ID, "v = 'bad'\nopen('a.bin','wb').write(os.urandom(200 << 20))", nil); err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	blobs := func() int {
		n := 0
		filepath.WalkDir(filepath.Join(store, "blobs"), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	before := blobs()
	done := make(chan error, 1)
	go func() { _, err := c.Snapshot(ctx, s.ID, "bad"); done <- err }()
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if n := blobs(); n < before+5 {
			return fmt.Errorf("%d blobs written of the new snapshot", n-before)
		}
		return nil
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := <-done; err == nil {
		t.Fatal("the snapshot completed before serve was killed: nothing was tested (make the change bigger)")
	}

	_, env2, _ := startServeCmd(t, "--pool", "0", "--token", token, "--snapshot-store", store)
	c2, _ := client.New(env2.URL, &client.Options{Token: token})
	list, err := c2.Snapshots(ctx, "")
	if err != nil || len(list) != 1 || list[0].ID != good.ID {
		t.Fatalf("snapshots after the kill: %+v %v; want only %s", list, err, good.ID)
	}
	n, err := c2.RestoreSnapshot(ctx, good.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c2.Execute(ctx, n.ID, "v, hashlib.sha256(open('a.bin','rb').read()).hexdigest() == h", nil); err != nil || r.Text() != "('good', True)" {
		t.Errorf("restored after the kill: %+v %v (want the good state, hash %s)", r, err, want)
	}
}
