package template_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

func snapshotStoreAt(t testing.TB, dir string) *snapshot.Store {
	t.Helper()
	b, err := snapshot.OpenBackend(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.New(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestTemplateFromSnapshot: a template built from a snapshot of a session
// holding a variable and a file gives both to each of its sessions, each a
// copy of its own; the build refuses an unknown, another owner's or a
// corrupted snapshot; removal is refused while a session uses it and
// takes the template's files and state with it after.
func TestTemplateFromSnapshot(t *testing.T) {
	ctx := context.Background()
	snapDir := t.TempDir()
	snaps := snapshotStoreAt(t, snapDir)
	store, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := template.NewPool(store, nil)
	t.Cleanup(pool.Close)
	m := session.NewManager(&session.ManagerOptions{Templates: pool, Snapshots: snaps})
	t.Cleanup(func() { m.Close() })

	src, err := m.Create(ctx, session.CreateOptions{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, src, "import os, socket\nos.makedirs('/workspace/data', exist_ok=True)\nopen('/workspace/data/seed.txt','w').write('from the snapshot')\nseed_answer = 41\nseed_conn = socket.socket()")
	man, err := m.Snapshot(ctx, "alice", src.ID(), "configured")
	if err != nil {
		t.Fatal(err)
	}
	src.Close()

	tm, err := store.BuildFromSnapshot(ctx, "seeded", template.SnapshotSource{Store: snaps, Owner: "alice"}, man.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Snapshot == nil || tm.Snapshot.ID != man.ID || !slices.Contains(tm.Snapshot.Variables, "seed_answer") || tm.Snapshot.FileCount != 1 {
		t.Fatalf("template manifest's snapshot part: %+v", tm.Snapshot)
	}
	if !strings.Contains(strings.Join(tm.Snapshot.NotSaved, ";"), "seed_conn") {
		t.Errorf("not_saved %v does not name seed_conn", tm.Snapshot.NotSaved)
	}
	seedFile := filepath.Join(tm.SeedFiles(store), "data", "seed.txt")
	if fi, err := os.Stat(seedFile); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Fatalf("the template's copy of the file: %v %v, want read-only", fi, err)
	}

	a, err := m.Create(ctx, session.CreateOptions{Owner: "bob", Template: "seeded"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, session.CreateOptions{Owner: "carol", Template: "seeded"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*session.Managed{a, b} {
		out := mustRun(t, s, "print('SEE', seed_answer + 1, open('/workspace/data/seed.txt').read())")
		if !strings.Contains(out, "SEE 42 from the snapshot") {
			t.Fatalf("a session of the template printed %q", out)
		}
		r := s.Session.Restored()
		if r == nil || r.From != "template seeded" || r.Snapshot != "" || r.Files != 1 || !slices.Contains(r.Variables, "seed_answer") || !strings.Contains(strings.Join(r.NotRestored, ";"), "seed_conn") {
			t.Fatalf("restored report %+v", r)
		}
	}
	mustRun(t, a, "seed_answer = 1\nopen('/workspace/data/seed.txt','w').write('changed in a')\nopen('/workspace/new.txt','w').write('x')")
	out := mustRun(t, b, "import os\nprint('SEE', seed_answer, open('/workspace/data/seed.txt').read(), os.path.exists('/workspace/new.txt'))")
	if !strings.Contains(out, "SEE 41 from the snapshot False") {
		t.Fatalf("session b after a's writes printed %q", out)
	}
	if got, _ := os.ReadFile(seedFile); string(got) != "from the snapshot" {
		t.Fatalf("the template's file after a session's write: %q", got)
	}
	c, err := m.Create(ctx, session.CreateOptions{Owner: "bob", Template: "seeded"})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, c, "print('SEE', seed_answer, open('/workspace/data/seed.txt').read())"); !strings.Contains(out, "SEE 41 from the snapshot") {
		t.Fatalf("a third session printed %q", out)
	}

	// Refused builds.
	own := template.SnapshotSource{Store: snaps, Owner: "alice"}
	if _, err := store.BuildFromSnapshot(ctx, "x", own, "snap-doesnotexist", nil); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("unknown snapshot: %v, want ErrNotFound", err)
	}
	if _, err := store.BuildFromSnapshot(ctx, "x", template.SnapshotSource{Store: snaps, Owner: "mallory"}, man.ID, nil); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("another owner's snapshot: %v, want ErrNotFound", err)
	}
	c0 := man.State.Chunks[0]
	p := filepath.Join(snapDir, "blobs", c0.Hash[:2], c0.Hash)
	good, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0xff
	if err := os.WriteFile(p, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.BuildFromSnapshot(ctx, "x", own, man.ID, nil)
	var ce *snapshot.CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "corrupted") {
		t.Errorf("corrupted snapshot: %v, want a CorruptError", err)
	}
	if _, err := store.Get("x"); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("a refused build left a template: %v", err)
	}
	os.WriteFile(p, good, 0o600)

	// A second template of the same snapshot shares the files' tree, the
	// state and the zygote.
	if _, err := store.BuildFromSnapshot(ctx, "seeded2", own, man.ID, nil); err != nil {
		t.Fatal(err)
	}
	if zygote.Supported() == nil {
		if err := pool.Warm(ctx, []string{"seeded", "seeded2"}); err != nil {
			t.Fatal(err)
		}
		if names := pool.WarmNames(); len(names) != 1 {
			t.Errorf("zygotes of two templates from snapshots with the same preloads: %v, want one shared", names)
		}
	}

	// Removal: refused while used, then everything of it goes (once the
	// other template using the same files is gone too).
	var inUse *template.InUseError
	if err := pool.Remove("seeded"); !errors.As(err, &inUse) {
		t.Fatalf("rm while used: %v, want InUseError", err)
	}
	a.Close()
	b.Close()
	c.Close()
	if err := pool.Remove("seeded"); err != nil {
		t.Fatal(err)
	}
	d, err := m.Create(ctx, session.CreateOptions{Template: "seeded2"})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, d, "print('SEE', seed_answer, open('/workspace/data/seed.txt').read())"); !strings.Contains(out, "SEE 41 from the snapshot") {
		t.Fatalf("a session of the second template after the first's rm printed %q", out)
	}
	d.Close()
	if err := pool.Remove("seeded2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tm.SeedFiles(store)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the files' tree after rm: %v", err)
	}
	states, _ := os.ReadDir(filepath.Join(store.Dir(), "states"))
	if len(states) != 0 {
		t.Errorf("%d state files after rm", len(states))
	}
}

// TestTemplateFromSnapshotOfATemplate: a snapshot of a session of a
// template makes a template with that template's environment.
func TestTemplateFromSnapshotOfATemplate(t *testing.T) {
	ctx := context.Background()
	st := demoStore(t)
	snaps := snapshotStoreAt(t, t.TempDir())
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	m := session.NewManager(&session.ManagerOptions{Templates: pool, Snapshots: snaps})
	t.Cleanup(func() { m.Close() })
	src, err := m.Create(ctx, session.CreateOptions{Template: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, src, "import sandloop_tmpl_demo\nbased = sandloop_tmpl_demo.VALUE")
	man, err := m.Snapshot(ctx, "", src.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	tm, err := st.BuildFromSnapshot(ctx, "demo-seeded", template.SnapshotSource{Store: snaps}, man.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Remove("demo-seeded") })
	demoT, _ := st.Get("demo")
	if tm.Snapshot.Base != "demo" || tm.ID != demoT.ID || tm.Kind != demoT.Kind {
		t.Fatalf("based template: base %q id %s kind %q, want demo's", tm.Snapshot.Base, tm.ID, tm.Kind)
	}
	s, err := m.Create(ctx, session.CreateOptions{Template: "demo-seeded"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if out := mustRun(t, s, "import sandloop_tmpl_demo, sys\nprint('SEE', based == sandloop_tmpl_demo.VALUE, sys.prefix)"); !strings.Contains(out, "SEE True "+template.EnvDir) {
		t.Fatalf("a session of the based template printed %q", out)
	}
	if err := st.Remove("demo-seeded"); err == nil {
		if _, err := st.Get("demo"); err != nil {
			t.Fatalf("removing the based template took its base: %v", err)
		}
	}
}

func mustRun(t testing.TB, s *session.Managed, code string) string {
	t.Helper()
	r := execute(t, s, code)
	if r.Error != nil {
		t.Fatalf("%s: %v\n%s", code, r.Error, r.Stdout)
	}
	return r.Stdout
}
