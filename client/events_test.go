package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
)

// A session's lifecycle events through the SDK: listed, then watched live
// until its close; a closed session's events stay, and its 404 says why.
func TestSessionEvents(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs, ended, err := c.SessionEvents(ctx, s.ID, 0)
	if err != nil || ended || len(evs) != 1 || evs[0].Type != "created" || evs[0].Seq != 1 {
		t.Fatalf("a new session's events: %+v %v %v", evs, ended, err)
	}
	watched := make(chan []string, 1)
	werr := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var types []string
		werr <- c.WatchSessionEvents(ctx, s.ID, 1, func(e client.SessionEvent) error {
			if e.Type == "paused" {
				close(started)
			}
			types = append(types, e.Type+"/"+e.State)
			return nil
		})
		watched <- types
	}()
	if _, err := c.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch saw no pause")
	}
	if _, err := c.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("watch: %v", err)
	}
	if got := strings.Join(<-watched, " "); got != "paused/paused resumed/running closed/closed" {
		t.Errorf("watched: %s", got)
	}
	evs, ended, err = c.SessionEvents(ctx, s.ID, 3)
	if err != nil || !ended || len(evs) != 1 || evs[0].Type != "closed" {
		t.Errorf("a closed session's last event: %+v %v %v", evs, ended, err)
	}
	_, err = c.GetSession(ctx, s.ID)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 404 || !strings.Contains(ae.Message, "deleted by its owner") {
		t.Errorf("a deleted session's GET: %v", err)
	}
}
