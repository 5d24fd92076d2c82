package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// BenchmarkColdExec compares a cold `sandloop exec -c 'print(1)'` (a new
// jail, a new interpreter) with bare `/usr/bin/python3 -c 'print(1)'`,
// alternating the two so both see the same machine load, and reports the
// ratio of the medians.
//
//	go test ./cmd/sandloop -run '^$' -bench ColdExec -benchtime 40x
func BenchmarkColdExec(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "sandloop")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	runOnce := func(name string, args ...string) time.Duration {
		start := time.Now()
		out, err := exec.Command(name, args...).Output()
		d := time.Since(start)
		if err != nil || string(out) != "1\n" {
			b.Fatalf("%s: %v %q", name, err, out)
		}
		return d
	}
	var jailed, bare []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		jailed = append(jailed, runOnce(bin, "exec", "-c", "print(1)"))
		bare = append(bare, runOnce(jail.DefaultPython, "-c", "print(1)"))
	}
	b.StopTimer()
	mj, mb := median(jailed), median(bare)
	b.ReportMetric(float64(mj.Microseconds())/1000, "sandloop-ms")
	b.ReportMetric(float64(mb.Microseconds())/1000, "python-ms")
	b.ReportMetric(float64(mj)/float64(mb), "ratio")
	b.Logf("median cold sandloop exec %s, bare python %s: %.2fx (target <= 1.5x); jail init: %s", mj, mb, float64(mj)/float64(mb), jail.InitInfo())
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkServeDefault times what a new user of `sandloop serve` sees:
// create a session and run `import numpy, pandas, matplotlib.pyplot` in
// it over HTTP, against a server started with default flags (only the
// address and data directory given) and, as the baseline in the same run,
// one started with --zygote=off, alternating between them. Before each
// create both pools are full, as on a server not under a burst. It
// reports both medians and their ratio.
//
//	go test ./cmd/sandloop -run '^$' -bench ServeDefault -benchtime 10x
func BenchmarkServeDefault(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "sandloop")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	serve := func(extra ...string) string {
		ctx, cancel := context.WithCancel(context.Background())
		cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", b.TempDir()}, extra...)...)
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 20 * time.Second
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cancel(); cmd.Wait() })
		line, err := bufio.NewReader(stdout).ReadString('\n')
		url, ok := strings.CutPrefix(strings.TrimSpace(line), "sandloop serving on ")
		if err != nil || !ok {
			b.Fatalf("serve %v: %q %v", extra, line, err)
		}
		return url
	}
	call := func(method, url, body string, out any) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			msg, _ := io.ReadAll(resp.Body)
			b.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, msg)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				b.Fatal(err)
			}
		}
	}
	poolFull := func(url string) {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			var h struct {
				PoolReady int `json:"pool_ready"`
			}
			call("GET", url+"/healthz", "", &h)
			if h.PoolReady >= 2 { // serve's default --pool
				return
			}
		}
		b.Fatalf("%s: the pool did not fill", url)
	}
	one := func(url string) time.Duration {
		poolFull(url)
		start := time.Now()
		var s struct{ ID string }
		call("POST", url+"/v1/sessions", "", &s)
		var r struct{ Status string }
		call("POST", url+"/v1/sessions/"+s.ID+"/execute", `{"code": "import numpy, pandas, matplotlib.pyplot"}`, &r)
		d := time.Since(start)
		if r.Status != "ok" {
			b.Fatalf("import: %+v", r)
		}
		call("DELETE", url+"/v1/sessions/"+s.ID, "", nil)
		return d
	}
	def, cold := serve(), serve("--zygote=off")
	one(def) // warm the page cache for both
	one(cold)
	var dt, ct []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dt = append(dt, one(def))
		ct = append(ct, one(cold))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	dm, cm := median(dt), median(ct)
	b.ReportMetric(ms(dm), "default-ms")
	b.ReportMetric(ms(cm), "cold-ms")
	b.ReportMetric(float64(cm)/float64(dm), "cold/default")
	b.Logf("serve with default flags: create + import numpy, pandas, matplotlib.pyplot over HTTP, median of %d: %.1f ms (target <= 30 ms); --zygote=off %.1f ms: %.1fx faster",
		b.N, ms(dm), ms(cm), float64(cm)/float64(dm))
}
