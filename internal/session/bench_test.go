package session

import (
	"bufio"
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// echoScript answers each line on fd 3 with the same line on fd 4: the
// floor for one round trip over pipes into a jailed Python.
const echoScript = `import os
r = os.fdopen(3, "rb", buffering=1 << 16)
for line in r:
    os.write(4, line)
`

// BenchmarkExecute measures the round trip of executing 1+1 in a warm
// session through the Go API, and in the same run the round trip of a raw
// pipe echo by a jailed Python process; it reports both medians and their
// ratio (the target is at most 0.5 ms and at most 3x the echo).
func BenchmarkExecute(b *testing.B) {
	ctx := context.Background()
	s, err := New(ctx, &Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	echo := startEcho(b)

	req := kernel.Request{Code: "1+1"}
	for range 200 { // warm up both
		if _, err := s.Execute(ctx, req, nil); err != nil {
			b.Fatal(err)
		}
		echo.roundTrip(b)
	}
	var execT, echoT []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// Alternate so both see the same machine conditions.
		t0 := time.Now()
		res, err := s.Execute(ctx, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		echo.roundTrip(b)
		t2 := time.Now()
		if res.Status != kernel.StatusOK || res.MainResult()["text/plain"] != "2" {
			b.Fatalf("1+1 gave %+v", res)
		}
		execT = append(execT, t1.Sub(t0))
		echoT = append(echoT, t2.Sub(t1))
	}
	b.StopTimer()
	me, mp := median(execT), median(echoT)
	b.ReportMetric(float64(me.Nanoseconds())/1e3, "exec-median-µs")
	b.ReportMetric(float64(mp.Nanoseconds())/1e3, "echo-median-µs")
	b.ReportMetric(float64(me)/float64(mp), "exec/echo")
	b.Logf("execute 1+1: median %v; raw pipe echo: median %v; ratio %.2f (n=%d)", me, mp, float64(me)/float64(mp), len(execT))
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

type echoProc struct {
	p   *jail.Process
	w   *os.File
	r   *bufio.Reader
	buf []byte
}

func startEcho(b *testing.B) *echoProc {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	p, err := jail.Start(context.Background(), &jail.Config{
		Path:       jail.DefaultPython,
		Args:       []string{"python3", "/opt/sandloop/echo.py"},
		Workspace:  b.TempDir(),
		Files:      []jail.File{{Path: "/opt/sandloop/echo.py", Data: []byte(echoScript)}},
		ExtraFiles: []*os.File{reqR, respW},
	})
	reqR.Close()
	respW.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		reqW.Close()
		p.Kill()
		p.Wait()
		respR.Close()
	})
	return &echoProc{p: p, w: reqW, r: bufio.NewReader(respR), buf: []byte(`{"code":"1+1"}` + "\n")}
}

func (e *echoProc) roundTrip(b *testing.B) {
	if _, err := e.w.Write(e.buf); err != nil {
		b.Fatal(err)
	}
	if _, err := e.r.ReadSlice('\n'); err != nil {
		b.Fatal(err)
	}
}
