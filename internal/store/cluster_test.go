package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/store/pgtest"
)

func openCell(t *testing.T) (*Postgres, *clock) {
	t.Helper()
	clk := newClock()
	p, err := OpenPostgres(t.Context(), pgtest.Start(t).NewDatabase(t), &Options{Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, clk
}

func names(regs []Registration) []string {
	var out []string
	for _, r := range regs {
		out = append(out, r.Name)
	}
	return out
}

// TestRegistrations: a host's heartbeat registers it; one silent past the
// deadline is not listed; a drained one says not ready; deregistering
// removes only the epoch that registered.
func TestRegistrations(t *testing.T) {
	p, clk := openCell(t)
	ctx := t.Context()
	beat := func(name, epoch string, ready bool) {
		t.Helper()
		if err := p.Heartbeat(ctx, Registration{Name: name, URL: "http://" + name + ":8080", Epoch: epoch, Ready: ready, Slots: 8, Used: 1}); err != nil {
			t.Fatal(err)
		}
	}
	list := func() []Registration {
		t.Helper()
		regs, err := p.Registrations(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return regs
	}
	beat("a", "e1", true)
	beat("b", "e1", true)
	if got := names(list()); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("registered: %v", got)
	}
	clk.advance(6 * time.Second)
	beat("b", "e1", false) // b drains
	clk.advance(6 * time.Second)
	regs := list()
	if len(regs) != 1 || regs[0].Name != "b" || regs[0].Ready || regs[0].Slots != 8 || !regs[0].BeatAt.Equal(clk.now().Add(-6*time.Second)) {
		t.Fatalf("after a's deadline: %+v", regs)
	}
	beat("a", "e2", true) // a restarted: back, with a new epoch
	if got := names(list()); len(got) != 2 {
		t.Fatalf("a did not come back: %v", got)
	}
	if err := p.Deregister(ctx, "a", "e1"); err != nil { // the old process's exit
		t.Fatal(err)
	}
	if got := names(list()); len(got) != 2 {
		t.Fatalf("an old epoch's exit removed the new one: %v", got)
	}
	if err := p.Deregister(ctx, "a", "e2"); err != nil {
		t.Fatal(err)
	}
	if got := names(list()); len(got) != 1 || got[0] != "b" {
		t.Fatalf("after a's exit: %v", got)
	}
}

// TestPrune: rows of lost sessions go a retention after they were lost,
// of closed ones a retention after the hosts' max lifetime, of finished
// runs a retention after they were placed; hosts and registrations not
// seen for a retention go too. Everything younger, and running runs, stay.
func TestPrune(t *testing.T) {
	p, clk := openCell(t)
	ctx := t.Context()
	const retention, lifetime = 24 * time.Hour, 12 * time.Hour
	place := func(id, kind, host string) {
		t.Helper()
		if err := p.PutPlacement(ctx, Placement{ID: id, Kind: kind, Owner: "o", Host: host, Epoch: "e1"}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(id, status string) {
		t.Helper()
		if _, err := p.CreateRun(ctx, Run{ID: id, Task: "t", Status: status}); err != nil {
			t.Fatal(err)
		}
		place(id, KindRun, "h1")
	}
	// At day 0: h-old's sessions, soon lost; a session that stays open on
	// h1 (the table cannot tell it closed); runs, one still running.
	place("lost-old", KindSession, "h-old")
	place("open-old", KindSession, "h1")
	place("mcp-old", KindMCP, "h1")
	// A session deleted through a gateway: marked closed, never lost.
	place("closed-old", KindSession, "h-old")
	if err := p.ClosePlacement(ctx, "closed-old"); err != nil {
		t.Fatal(err)
	}
	run("run-done", "done")
	run("run-running", "running")
	if err := p.PutHost(ctx, HostRecord{Name: "h-old", URL: "http://h-old", Epoch: "e1", SeenAt: clk.now()}); err != nil {
		t.Fatal(err)
	}
	if err := p.Heartbeat(ctx, Registration{Name: "h-old", URL: "http://h-old", Epoch: "e1"}); err != nil {
		t.Fatal(err)
	}
	if lost, err := p.FenceHost(ctx, "h-old", ""); err != nil || len(lost) != 1 || lost[0].ID != "lost-old" {
		t.Fatalf("fenced %+v %v, want lost-old only", lost, err)
	}
	if pl, err := p.GetPlacement(ctx, "closed-old"); err != nil || pl.Lost || !pl.ClosedAt.Equal(clk.now().UTC().Truncate(time.Millisecond)) {
		t.Fatalf("closed-old: %+v %v, want closed now, not lost", pl, err)
	}
	// A day and an hour later: h1 is seen, a new session is lost just now.
	clk.advance(retention + time.Hour)
	if err := p.PutHost(ctx, HostRecord{Name: "h1", URL: "http://h1", Epoch: "e1", SeenAt: clk.now()}); err != nil {
		t.Fatal(err)
	}
	place("lost-new", KindSession, "h2")
	place("open-new", KindSession, "h1")
	place("closed-new", KindSession, "h1")
	if err := p.ClosePlacement(ctx, "closed-new"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.FenceHost(ctx, "h2", ""); err != nil {
		t.Fatal(err)
	}
	n, err := p.Prune(ctx, retention, lifetime)
	if err != nil {
		t.Fatal(err)
	}
	// lost-old (lost a retention ago), closed-old (closed as long ago)
	// and run-done; open-old is within lifetime + retention.
	if n != (Pruned{Sessions: 3, Hosts: 1, Registrations: 1}) {
		t.Errorf("pruned %+v, want 3 sessions (lost-old, closed-old, run-done), 1 host, 1 registration", n)
	}
	exists := func(id string) bool {
		_, err := p.GetPlacement(ctx, id)
		return err == nil
	}
	for id, want := range map[string]bool{"lost-old": false, "closed-old": false, "run-done": false, "run-running": true, "open-old": true, "mcp-old": true, "lost-new": true, "open-new": true, "closed-new": true} {
		if exists(id) != want {
			t.Errorf("%s kept = %v, want %v", id, !want, want)
		}
	}
	if _, err := p.GetHost(ctx, "h-old"); err == nil {
		t.Error("a host not seen for a retention was kept")
	}
	if _, err := p.GetHost(ctx, "h1"); err != nil {
		t.Errorf("a host just seen was pruned: %v", err)
	}
	// Past the hosts' max lifetime and a retention, sessions that were
	// never closed through a gateway are gone too.
	clk.advance(lifetime)
	if n, err = p.Prune(ctx, retention, lifetime); err != nil || n.Sessions != 2 {
		t.Errorf("pruned %+v (%v), want open-old and mcp-old", n, err)
	}
	if exists("open-old") || exists("mcp-old") || !exists("open-new") || !exists("run-running") {
		t.Error("the lifetime rule pruned the wrong sessions")
	}
	// Nothing left to prune: a second pass deletes nothing.
	if n, err = p.Prune(context.Background(), retention, lifetime); err != nil || n != (Pruned{}) {
		t.Errorf("a second pass pruned %+v (%v)", n, err)
	}
}

func TestNumbered(t *testing.T) {
	for in, want := range map[string]string{
		"SELECT 1":                             "SELECT 1",
		"a = ? AND b = ? LIMIT ?":              "a = $1 AND b = $2 LIMIT $3",
		"INSERT INTO t (a, b) VALUES (?,?)":    "INSERT INTO t (a, b) VALUES ($1,$2)",
		"x = ? AND y = 'é' AND z IN (?, ?, ?)": "x = $1 AND y = 'é' AND z IN ($2, $3, $4)",
	} {
		if got := numbered(in); got != want {
			t.Errorf("numbered(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSessionSnapshots: a session's latest snapshot is recorded and
// survives its fencing; the first restore recorded wins, a later one is
// told the winner; an unknown session is ErrNotFound.
func TestSessionSnapshots(t *testing.T) {
	p, _ := openCell(t)
	ctx := t.Context()
	if err := p.PutPlacement(ctx, Placement{ID: "s1", Kind: KindSession, Owner: "o", Host: "h", Epoch: "e1"}); err != nil {
		t.Fatal(err)
	}
	for _, snap := range []string{"snap-a", "snap-b"} {
		if err := p.SetSnapshot(ctx, "s1", snap); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.SetSnapshot(ctx, "nope", "snap-a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("snapshot of an unknown session: %v, want ErrNotFound", err)
	}
	if _, err := p.FenceHost(ctx, "h", ""); err != nil {
		t.Fatal(err)
	}
	pl, err := p.GetPlacement(ctx, "s1")
	if err != nil || !pl.Lost || pl.Snapshot != "snap-b" || pl.RestoredAs != "" {
		t.Fatalf("after the fence: %+v %v", pl, err)
	}
	if got, err := p.SetRestoredAs(ctx, "s1", "s2"); err != nil || got != "s2" {
		t.Fatalf("first restore: %q %v", got, err)
	}
	if got, err := p.SetRestoredAs(ctx, "s1", "s3"); err != nil || got != "s2" {
		t.Errorf("second restore: %q %v, want the first's s2", got, err)
	}
	if pl, err := p.GetPlacement(ctx, "s1"); err != nil || pl.RestoredAs != "s2" {
		t.Errorf("restored_as: %+v %v", pl, err)
	}
	if _, err := p.SetRestoredAs(ctx, "nope", "s2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("restore of an unknown session: %v, want ErrNotFound", err)
	}
}
