package main

import (
	"os/exec"
	"path/filepath"
	"slices"
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
