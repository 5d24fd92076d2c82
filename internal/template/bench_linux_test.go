package template_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkTemplateSession measures, in one run, the time from asking for
// a session to the end of its first import of pandas, of a heavy library
// (sklearn where it is installed, else scipy.stats, which sklearn is built
// on: Debian 12's python3-sklearn is not among the sandbox's packages) and
// of a package the default environment lacks, three ways: a session of a
// template with --preload pandas,HEAVY,PKG forked from the template's
// zygote; the same template's session started cold; and a default session
// that installs the package with pip at run time (from a local index
// through the egress proxy). Run with -benchtime=1x: each way is measured
// 7 times whatever b.N is, and the medians and ratios are printed.
func BenchmarkTemplateSession(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
	}
	heavy := "sklearn"
	if exec.Command(jail.DefaultPython, "-c", "import sklearn").Run() != nil {
		heavy = "scipy.stats" // (say so below)
	}
	const n = 7
	wheels := b.TempDir()
	egresstest.BuildWheel(b, wheels, "sandloop-bench-pkg", "1.0", "bench")
	ix := httptest.NewServer(egresstest.Index(wheels))
	b.Cleanup(ix.Close)
	port := egresstest.Port(ix)
	indexURL := fmt.Sprintf("http://127.0.0.1:%d/simple/", port)
	al, err := egress.ParseAllowlist([]string{"127.0.0.1:" + strconv.Itoa(port)})
	if err != nil {
		b.Fatal(err)
	}
	policy := &egress.Policy{Allow: al}
	pipEnv := []string{"PIP_INDEX_URL=" + indexURL, "PIP_TRUSTED_HOST=127.0.0.1"}

	dir, err := makeTempDir()
	if err != nil {
		b.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if _, err := st.Build(context.Background(), "bench", template.Spec{Pip: []string{"sandloop-bench-pkg"}, Preload: []string{"pandas", heavy, "sandloop_bench_pkg"}},
		&template.BuildOptions{Egress: policy, Env: pipEnv}); err != nil {
		b.Fatal(err)
	}
	build := time.Since(t0)

	measure := func(name string, m *session.Manager, opts session.CreateOptions, code string) time.Duration {
		var ds []time.Duration
		for range n {
			time.Sleep(300 * time.Millisecond) // the zygote's next spare is ready
			start := time.Now()
			s, err := m.Create(context.Background(), opts)
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			r, err := s.Execute(context.Background(), kernel.Request{Code: code, Timeout: 5 * time.Minute}, nil)
			d := time.Since(start)
			if err != nil || r.Status != kernel.StatusOK || !strings.Contains(r.Stdout, "bench") {
				b.Fatalf("%s: %v %+v %+v", name, err, r, r.Error)
			}
			s.Close()
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return ds[n/2]
	}
	imports := "import pandas, " + heavy + ", sandloop_bench_pkg\nprint(sandloop_bench_pkg.VALUE)"

	warmPool := template.NewPool(st, nil)
	defer warmPool.Close()
	if err := warmPool.Warm(context.Background(), []string{"bench"}); err != nil {
		b.Fatal(err)
	}
	warmMgr := session.NewManager(&session.ManagerOptions{Templates: warmPool})
	defer warmMgr.Close()
	coldPool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	defer coldPool.Close()
	coldMgr := session.NewManager(&session.ManagerOptions{Templates: coldPool})
	defer coldMgr.Close()
	plainMgr := session.NewManager(&session.ManagerOptions{})
	defer plainMgr.Close()

	b.ResetTimer()
	warm := measure("template, forked", warmMgr, session.CreateOptions{Template: "bench"}, imports)
	cold := measure("template, cold", coldMgr, session.CreateOptions{Template: "bench"}, imports)
	env := map[string]string{}
	for _, kv := range pipEnv {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	pip := measure("pip at run time", plainMgr, session.CreateOptions{Egress: policy, Env: env},
		"import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', 'sandloop-bench-pkg'], capture_output=True, text=True)\nassert r.returncode == 0, r.stderr\nimport site, importlib\nsite.addsitedir(site.getusersitepackages())\nimportlib.invalidate_caches()\n"+imports)
	b.StopTimer()
	b.ReportMetric(float64(warm.Microseconds())/1000, "ms-template-forked")
	b.ReportMetric(float64(cold.Microseconds())/1000, "ms-template-cold")
	b.ReportMetric(float64(pip.Microseconds())/1000, "ms-pip-at-runtime")
	b.Logf("session + first `import pandas, %s, PKG`, median of %d: template forked from its zygote %s; same template cold %s (%.1fx slower); default session + pip install at run time %s (%.1fx slower). Template build: %s",
		heavy, n, warm.Round(100*time.Microsecond), cold.Round(100*time.Microsecond), float64(cold)/float64(warm), pip.Round(time.Millisecond), float64(pip)/float64(warm), build.Round(time.Millisecond))
}

// BenchmarkTemplateBuildFromCache measures building a template of 10
// wheels (about 0.5 MiB each) two ways, in one run: with the server's wheel
// cache empty, every wheel fetched from the index (a local one over TLS,
// the baseline; it sends at most -template-upstream MiB/s, 4 by default,
// as BenchmarkWheelCache's: a remote index is never as fast as loopback),
// and again with the cache holding them (as a host builds
// a template its sessions or another template already installed). Each
// is measured 3 times whatever b.N is (-benchtime=1x); medians and the
// ratio are printed.
func BenchmarkTemplateBuildFromCache(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
	}
	const n, wheelsN = 3, 10
	ca := egresstest.NewCA(b)
	wheels := b.TempDir()
	var pkgs []string
	for i := range wheelsN {
		name := fmt.Sprintf("sandloop-bench-wheel-%d", i)
		noise := make([]byte, 384<<10) // incompressible: the wheel is about this size
		rand.Read(noise)
		egresstest.BuildWheel(b, wheels, name, "1.0", base64.StdEncoding.EncodeToString(noise))
		pkgs = append(pkgs, name)
	}
	ix := egresstest.Index(wheels)
	rate := *templateUpstream << 20
	srv := ca.Server(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rate > 0 && strings.HasPrefix(r.URL.Path, "/files/") {
			w = &throttled{ResponseWriter: w, rate: rate, start: time.Now()}
		}
		ix.ServeHTTP(w, r)
	}), "pkgs.test")
	port := egresstest.Port(srv)
	al, err := egress.ParseAllowlist([]string{"pkgs.test:" + strconv.Itoa(port), "127.0.0.1"}) // loopback: refused unless named
	if err != nil {
		b.Fatal(err)
	}
	lookup := egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}})
	dir, err := makeTempDir()
	if err != nil {
		b.Fatal(err)
	}
	st, err := template.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	build := func(name string, cache *egress.Cache) time.Duration {
		start := time.Now()
		t, err := st.Build(context.Background(), name, template.Spec{Pip: pkgs, Preload: []string{"json"}},
			&template.BuildOptions{Egress: &egress.Policy{Allow: al}, Lookup: lookup, Cache: cache})
		d := time.Since(start)
		if err != nil {
			b.Fatalf("build %s: %v", name, err)
		}
		if len(t.Packages) < wheelsN {
			b.Fatalf("build %s: %d packages", name, len(t.Packages))
		}
		st.Remove(name)
		return d
	}
	var fromIndex, fromCache []time.Duration
	b.ResetTimer()
	for i := range n {
		cache, err := egress.OpenCache(&egress.CacheOptions{Dir: b.TempDir(), Index: fmt.Sprintf("https://pkgs.test:%d/simple/", port), RootCAs: ca.Pool()})
		if err != nil {
			b.Fatal(err)
		}
		fromIndex = append(fromIndex, build(fmt.Sprintf("ten-index-%d", i), cache))
		if s := cache.Stats(); s.Files != wheelsN {
			b.Fatalf("the first build left %d files in the cache, want %d: %+v", s.Files, wheelsN, s)
		}
		fromCache = append(fromCache, build(fmt.Sprintf("ten-cache-%d", i), cache))
		if s := cache.Stats(); s.Hits < wheelsN {
			b.Fatalf("the second build was not served from the cache: %+v", s)
		}
	}
	b.StopTimer()
	slices.Sort(fromIndex)
	slices.Sort(fromCache)
	fi, fc := fromIndex[n/2], fromCache[n/2]
	b.ReportMetric(fi.Seconds(), "s-from-index")
	b.ReportMetric(fc.Seconds(), "s-from-cache")
	b.Logf("building a template of %d wheels (0.5 MiB each), median of %d: from the wheel cache %s; with the cache empty (fetched from the index at %d MiB/s) %s (%.2fx the cached build)",
		wheelsN, n, fc.Round(time.Millisecond), *templateUpstream, fi.Round(time.Millisecond), fi.Seconds()/fc.Seconds())
}

var templateUpstream = flag.Int64("template-upstream", 4, "BenchmarkTemplateBuildFromCache: the index's speed in MiB/s (0: unthrottled loopback)")

// throttled sends at most rate bytes a second.
type throttled struct {
	http.ResponseWriter
	rate  int64
	start time.Time
	sent  int64
}

func (t *throttled) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		m, err := t.ResponseWriter.Write(p[:k])
		n += m
		t.sent += int64(m)
		if err != nil {
			return n, err
		}
		p = p[k:]
		if ahead := time.Duration(float64(t.sent)/float64(t.rate)*float64(time.Second)) - time.Since(t.start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	return n, nil
}
