package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/testutil"
)

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	m, err := c.Metrics(ctx, s.ID, time.Time{})
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Code == "metrics_unavailable" {
		t.Skip("no cgroup measures sessions here")
	}
	if err != nil || len(m.Samples) == 0 || m.IntervalS != 1 || m.MemoryLimitBytes <= 0 {
		t.Fatalf("metrics: %+v %v", m, err)
	}
	last := m.Samples[len(m.Samples)-1]
	testutil.WaitFor(t, 30*time.Second, func() error {
		next, err := c.Metrics(ctx, s.ID, last.Time)
		if err != nil {
			return err
		}
		if len(next.Samples) == 0 {
			return errors.New("no newer sample yet")
		}
		if !next.Samples[0].Time.After(last.Time) {
			t.Fatalf("since %v returned %v", last.Time, next.Samples[0].Time)
		}
		return nil
	})
}
