package session_test

import (
	"context"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/session/sessiontest"
)

// TestPause: a cold session paused uses no CPU, resumes with its state and,
// closed while paused, leaves nothing (sessiontest.CheckPause).
func TestPause(t *testing.T) {
	if err := jail.GroupsSupported(); err != nil {
		t.Skip("no cgroup measures a session's CPU here: ", err)
	}
	s, err := session.New(context.Background(), &session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sessiontest.CheckPause(t, s)
}
