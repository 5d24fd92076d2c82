package session

import (
	"context"
	"testing"
	"time"
)

// A paused session's checkpoints, restores and undos resume it first (a
// frozen kernel would never answer them), and they work as on a running one.
func TestCheckpointOnAPausedSession(t *testing.T) {
	s := newSession(t, Options{Checkpoints: CheckpointsAuto})
	mustOK(t, runCode(t, s, "x = 1"))
	mustOK(t, runCode(t, s, "x = 2"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	cp, err := s.Checkpoint(ctx, "while paused")
	if err != nil {
		t.Fatalf("checkpoint of a paused session: %v", err)
	}
	if st := s.State(); st != "running" {
		t.Errorf("after a checkpoint the session is %q, want running", st)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Undo(ctx); err != nil {
		t.Fatalf("undo of a paused session: %v", err)
	}
	if got := textOf(t, s, "x"); got != "1" {
		t.Errorf("after undo x = %s, want 1", got)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RestoreCheckpoint(ctx, cp.ID); err != nil {
		t.Fatalf("restore of a paused session: %v", err)
	}
	if got := textOf(t, s, "x"); got != "2" {
		t.Errorf("after restoring %q x = %s, want 2", cp.Name, got)
	}
}
