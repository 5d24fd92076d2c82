package server

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/testutil"
)

// TestSessionMetrics: GET /v1/sessions/{id}/metrics gives a sample of the
// session's cgroup every second; memory grows by what the kernel holds
// when it allocates 150 MiB, and the disk by a file the kernel writes.
func TestSessionMetrics(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	id := ts.create(t, `{"memory_mb": 512}`)
	var m usageJSON
	if resp := ts.do(t, "GET", "/v1/sessions/"+id+"/metrics", "", &m); resp.StatusCode == 501 {
		t.Skip("no cgroup measures sessions here (rlimits): metrics answer 501, as documented")
	} else if resp.StatusCode != 200 || len(m.Samples) == 0 || m.IntervalS != 1 || m.MemoryLimitBytes != 512<<20 {
		t.Fatalf("metrics: %d %+v", resp.StatusCode, m)
	}
	before := m.Samples[len(m.Samples)-1]
	if r := ts.exec(t, id, "x = bytes(range(256)) * (150 << 12)\nopen('blob.bin', 'wb').write(b'z' * (3 << 20))\nlen(x) >> 20"); r.Status != "ok" {
		t.Fatalf("allocate: %+v", r)
	}
	// Samples keep coming, one a second (no assertion on their pace: a
	// loaded machine may skip a tick); one shows the 150 MiB.
	var grown usageSample
	testutil.WaitFor(t, 60*time.Second, func() error {
		var now usageJSON
		if resp := ts.do(t, "GET", fmt.Sprintf("/v1/sessions/%s/metrics?since=%.3f", id, float64(before.Time.UnixMilli())/1000), "", &now); resp.StatusCode != 200 {
			return fmt.Errorf("metrics: %d", resp.StatusCode)
		}
		for _, s := range now.Samples {
			if !s.Time.After(before.Time) {
				return fmt.Errorf("since=%v returned the sample of %v", before.Time, s.Time)
			}
			if s.MemoryBytes-before.MemoryBytes >= 140<<20 && s.DiskBytes-before.DiskBytes >= 3<<20 {
				grown = s
				return nil
			}
		}
		return errors.New("no sample shows the 150 MiB and the 3 MiB file yet")
	})
	if grown.MemoryBytes > 512<<20 {
		t.Errorf("memory %d over the session's limit", grown.MemoryBytes)
	}
	var all usageJSON
	ts.do(t, "GET", "/v1/sessions/"+id+"/metrics", "", &all)
	for i := 1; i < len(all.Samples); i++ {
		if d := all.Samples[i].Time.Sub(all.Samples[i-1].Time); d < 900*time.Millisecond {
			t.Errorf("samples %v apart, want one a second", d)
		}
	}
	if resp := ts.do(t, "GET", "/v1/sessions/"+id+"/metrics?since=yesterday", "", nil); resp.StatusCode != 400 {
		t.Errorf("bad since: %d, want 400", resp.StatusCode)
	}
	if resp := ts.do(t, "GET", "/v1/sessions/nosuch/metrics", "", nil); resp.StatusCode != 404 {
		t.Errorf("unknown session: %d, want 404", resp.StatusCode)
	}
}
