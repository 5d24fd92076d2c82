package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// TestSessionEvents: each transition of a session's life is one event, in
// order, saying the state it left and why, and what came back where
// something was restored; a kernel that dies on its own is one too, and a
// closed session's events and the reason it closed stay with the manager.
func TestSessionEvents(t *testing.T) {
	ctx := context.Background()
	st, _, _ := snapshotStore(t, nil)
	m := forkManager(t, ManagerOptions{Snapshots: st})
	s, err := m.Create(ctx, CreateOptions{Owner: "alice", Checkpoints: CheckpointsAuto})
	if err != nil {
		t.Fatal(err)
	}
	evs := s.Events()
	next := int64(0)
	// expect reads the events after the last one read: they must be of
	// these types, in this order.
	expect := func(types ...string) []Event {
		t.Helper()
		got, ended, _ := evs.Since(next)
		var names []string
		for _, e := range got {
			names = append(names, e.Type)
		}
		if !slices.Equal(names, types) {
			t.Fatalf("events after %d: %v, want %v (%+v)", next, names, types, got)
		}
		for i, e := range got {
			if e.Seq != next+int64(i)+1 || e.Time.IsZero() {
				t.Fatalf("event %+v: want seq %d and a time", e, next+int64(i)+1)
			}
		}
		if ended != slices.Contains(types, EventClosed) {
			t.Fatalf("ended %v after %v", ended, types)
		}
		next += int64(len(got))
		return got
	}
	e := expect(EventCreated)[0]
	if e.How != CreatedNew || e.State != StateRunning {
		t.Errorf("created: %+v", e)
	}

	mustOK(t, runCode(t, s.Session, "x = 1\nopen('/workspace/a.txt', 'w').write('a')"))
	cp, err := s.Checkpoint(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, runCode(t, s.Session, "x = 2"))
	if _, err := s.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RestoreCheckpoint(ctx, cp.ID); err != nil {
		t.Fatal(err)
	}
	got := expect(EventCheckpoint, EventUndone, EventCheckpointRestored)
	if got[0].Checkpoint != cp.ID || got[1].Restored == nil || got[1].Restored.From != "undo" ||
		got[2].Checkpoint != cp.ID || got[2].Restored == nil || got[2].Restored.Files != 1 {
		t.Errorf("checkpoint, undo, restore: %+v", got)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	got = expect(EventPaused, EventResumed)
	if got[0].State != StatePaused || got[0].Reason != "asked for" || got[1].State != StateRunning {
		t.Errorf("pause, resume: %+v", got)
	}

	man, err := m.Snapshot(ctx, "alice", s.ID(), "")
	if err != nil {
		t.Fatal(err)
	}
	children, _, err := m.Fork(ctx, "alice", s.ID(), ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	got = expect(EventSnapshot, EventForked)
	ids := []string{children[0].ID(), children[1].ID()}
	if got[0].Snapshot != man.ID || !slices.Equal(got[1].Children, ids) {
		t.Errorf("snapshot %s, fork %v: %+v", man.ID, ids, got)
	}
	ce, _, _ := children[0].Events().Since(0)
	if len(ce) != 1 || ce[0].Type != EventCreated || ce[0].How != CreatedFork || ce[0].Parent != s.ID() ||
		ce[0].Restored == nil || !slices.Contains(ce[0].Restored.Variables, "x") {
		t.Errorf("a fork's child's events: %+v", ce)
	}

	hm, err := s.Hibernate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := managedText(t, s, "x"); got != "1" {
		t.Fatalf("after the wake: x = %s", got)
	}
	got = expect(EventHibernated, EventWoken)
	if got[0].State != StateHibernated || got[0].Snapshot != hm.ID || got[1].State != StateRunning ||
		got[1].Restored == nil || !slices.Contains(got[1].Restored.Variables, "x") {
		t.Errorf("hibernate, wake: %+v", got)
	}

	// A kernel that dies on its own is seen at once, not at the next
	// cell.
	r := runCode(t, s.Session, "import os\nos._exit(3)")
	if r.Error == nil || r.Error.Name != "KernelDied" {
		t.Fatalf("os._exit: %+v", r)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if got, _, _ := evs.Since(next); len(got) == 0 {
			return errors.New("no event for the kernel's death")
		}
		return nil
	})
	if e := expect(EventKernelDied)[0]; !strings.Contains(e.Reason, "status 3") {
		t.Errorf("kernel_died: %+v", e)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	expect(EventKernelRestarted)
	// A restart of a live kernel is no death: the kernel it retires is
	// not reported (a note would come before the restart's, while the new
	// kernel starts: Restart returns after).
	mustOK(t, runCode(t, s.Session, "y = 1"))
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	expect(EventKernelRestarted)

	// A reader waiting for the next event is woken by it.
	_, _, wait := evs.Since(next)
	if err := m.Delete("alice", s.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait:
	case <-time.After(10 * time.Second):
		t.Fatal("a reader waiting for the next event was not woken by the close")
	}
	if e := expect(EventClosed)[0]; e.State != StateClosed || e.Reason != "deleted by its owner" {
		t.Errorf("closed: %+v", e)
	}
	// Gone, it says why; its events stay, for its owner only.
	_, err = m.Get("alice", s.ID())
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "was closed at") || !strings.Contains(err.Error(), "deleted by its owner") {
		t.Errorf("Get of a closed session: %v", err)
	}
	if _, err := m.Get("bob", s.ID()); err == nil || err.Error() != ErrNotFound.Error() {
		t.Errorf("bob's Get of alice's closed session: %v", err)
	}
	if err := m.Delete("alice", s.ID()); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "was closed at") {
		t.Errorf("a second Delete of a closed session: %v", err)
	}
	if err := m.Delete("bob", s.ID()); err == nil || err.Error() != ErrNotFound.Error() {
		t.Errorf("bob's Delete of alice's closed session: %v", err)
	}
	if _, err := m.SessionEvents("bob", s.ID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob reads alice's events: %v", err)
	}
	after, err := m.SessionEvents("alice", s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if all, ended, _ := after.Since(0); !ended || int64(len(all)) != next || all[len(all)-1].Type != EventClosed {
		t.Errorf("the closed session's events: ended %v, %d of %d", ended, len(all), next)
	}
}

// The log keeps the latest MaxEvents; a reader that asks from before them
// gets what is kept, in order.
func TestEventLogBound(t *testing.T) {
	var l eventLog
	for i := range MaxEvents + 10 {
		l.add(Event{Type: EventCheckpoint, Checkpoint: fmt.Sprint(i)})
	}
	got, ended, next := l.since(0)
	if len(got) != MaxEvents || got[0].Seq != 11 || got[len(got)-1].Seq != MaxEvents+10 || ended || next == nil {
		t.Fatalf("%d kept, from %d to %d, ended %v", len(got), got[0].Seq, got[len(got)-1].Seq, ended)
	}
	if got, _, _ := l.since(MaxEvents + 5); len(got) != 5 {
		t.Errorf("since %d: %d events", MaxEvents+5, len(got))
	}
	l.add(Event{Type: EventClosed})
	l.add(Event{Type: EventResumed}) // after the close: dropped
	if got, ended, next := l.since(MaxEvents + 10); len(got) != 1 || !ended || next != nil {
		t.Errorf("after the close: %+v, ended %v", got, ended)
	}
	// What a manager keeps of a closed session: its latest events.
	kept := l.tail(closedTail)
	if got, ended, _ := kept.since(0); len(got) != closedTail || got[len(got)-1].Type != EventClosed || !ended {
		t.Errorf("tail: %d events, ended %v", len(got), ended)
	}
}

// The manager keeps the closed sessions' events for ClosedEventsKept, at
// most MaxClosedEvents of them, the oldest going first.
func TestClosedEventsBound(t *testing.T) {
	var e endedSessions
	old := &ended{owner: "a", at: time.Now().Add(-ClosedEventsKept - time.Minute), events: &eventLog{}}
	e.add("old", old)
	e.add("new", &ended{owner: "a", at: time.Now(), events: &eventLog{}})
	if e.get("a", "old") != nil || e.get("a", "new") == nil {
		t.Fatal("an hour-old close is still kept, or a new one is not")
	}
	for i := range MaxClosedEvents + 1 {
		e.add(fmt.Sprint(i), &ended{owner: "a", at: time.Now(), events: &eventLog{}})
	}
	// "new", then "0" .. "1000": the first two go.
	if e.get("a", "new") != nil || e.get("a", "0") != nil || e.get("a", "1") == nil || len(e.byID) != MaxClosedEvents || len(e.order) != MaxClosedEvents {
		t.Errorf("past the cap: %d kept (%d in order); new %v, 0 %v, 1 %v", len(e.byID), len(e.order), e.get("a", "new") != nil, e.get("a", "0") != nil, e.get("a", "1") != nil)
	}
	if e.get("b", "1") != nil {
		t.Error("another owner's closed session is found")
	}
}

// eventTypes lists events' types, space-separated.
func eventTypes(evs []Event) string {
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	return strings.Join(types, " ")
}
