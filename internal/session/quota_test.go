package session_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/session/sessiontest"
)

const testDisk, testFiles = 48 << 20, 2000

func TestQuotaColdSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("workspace quotas need root")
	}
	// The default quota, large enough for the check that the host's free
	// space is unchanged to tell a leaked workspace from other activity.
	s, err := session.New(context.Background(), session.Options{Limits: jail.Limits{Files: testFiles}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sessiontest.CheckQuota(t, s, jail.DefaultDisk, testFiles)
}

func TestQuotaPooledSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("workspace quotas need root")
	}
	m := session.NewManager(session.ManagerOptions{PoolSize: 1, Defaults: jail.Limits{Disk: testDisk, Files: testFiles}})
	t.Cleanup(func() { m.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for m.Stats().PoolReady == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ms, err := m.Create(context.Background(), session.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ms.FromPool {
		t.Fatal("the session did not come from the pool")
	}
	sessiontest.CheckQuota(t, ms.Session, testDisk, testFiles)
}
