package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkReattach measures a restart of serve --keep-sessions holding
// N live sessions (N = $SANDLOOP_BENCH_SESSIONS, default 200; cold
// sessions without pandas, ~15 MB each): serve is killed (-9) and started
// again on the same data directory, and every session is asked for a
// variable it holds, all at once, until it answers. It reports when the
// last one answered, counted from the start of the new process (the
// issue's bound: 2 s), the median, and, as the baseline measured in the
// same run, what getting N sessions back costs without the keeper:
// creating N new ones (their state lost), with the ratio.
//
//	go test ./cmd/sandloop -run '^$' -bench Reattach -benchtime 1x
func BenchmarkReattach(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("serve --keep-sessions needs root")
	}
	n := 200
	if v, err := strconv.Atoi(os.Getenv("SANDLOOP_BENCH_SESSIONS")); err == nil && v > 0 {
		n = v
	}
	for range b.N {
		dataDir := b.TempDir()
		a := startKept(b, dataDir, "--pool", "0", "--max-sessions", strconv.Itoa(n+8), "--idle-timeout", "1h")
		ids := make([]string, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		created := time.Now()
		for i := range ids {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				ids[i] = a.create(b)
				a.execute(b, ids[i], fmt.Sprintf("v = %d\nv", i))
			}()
		}
		wg.Wait()
		createAll := time.Since(created)

		a.kill9()
		start := time.Now()
		bserve := startKept(b, dataDir, "--pool", "0", "--max-sessions", strconv.Itoa(n+8), "--idle-timeout", "1h")
		answered := make([]time.Duration, n)
		code, _ := json.Marshal(map[string]any{"code": "v"})
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					c, out, err := bserve.call("POST", "/v1/sessions/"+id+"/execute", string(code))
					if err == nil && c == 200 {
						var res struct {
							Results []struct {
								Data map[string]string `json:"data"`
							} `json:"results"`
						}
						if json.Unmarshal(out, &res) == nil && len(res.Results) == 1 && res.Results[0].Data["text/plain"] == strconv.Itoa(i) {
							answered[i] = time.Since(start)
							return
						}
						b.Errorf("session %d answered %s", i, out)
						return
					}
				}
				b.Errorf("session %d did not answer within 2 minutes of the restart", i)
			}()
		}
		wg.Wait()
		b.StopTimer()
		slices.Sort(answered)
		last, median := answered[n-1], answered[n/2]
		b.ReportMetric(last.Seconds(), "last-answer-s")
		b.ReportMetric(median.Seconds(), "median-answer-s")
		b.ReportMetric(createAll.Seconds(), "create-all-s")
		b.ReportMetric(createAll.Seconds()/last.Seconds(), "create/reattach")
		b.Logf("%d live sessions after kill -9 of serve: the last answered %.2f s after the new server's start (median %.2f s; issue's bound 2 s); creating %d new sessions instead took %.1f s (%.1fx longer, their state lost)",
			n, last.Seconds(), median.Seconds(), n, createAll.Seconds(), createAll.Seconds()/last.Seconds())
		for _, line := range strings.Split(bserve.stderr.String(), "\n") {
			if strings.Contains(line, "sessions taken over") {
				b.Logf("serve: %s", line)
			}
		}
		for _, id := range ids {
			bserve.call("DELETE", "/v1/sessions/"+id, nil)
		}
		bserve.term(b)
		stopKeeper(b, dataDir)
		b.StartTimer()
	}
}
