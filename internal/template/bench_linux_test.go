package template_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

// BenchmarkTemplateSession measures, in one run, the time from asking for
// a session to the end of its first import of pandas and of a package
// the default environment lacks, three ways: a session of a template
// with --preload pandas,PKG forked from the template's zygote; the same
// template's session started cold; and a default session that installs
// the package with pip at run time (from a local index through the
// egress proxy). Run with -benchtime=1x: each way is measured 7 times
// whatever b.N is, and the medians and ratios are printed.
func BenchmarkTemplateSession(b *testing.B) {
	if err := zygote.Supported(); err != nil {
		b.Skipf("no zygote on this host: %v", err)
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
	if _, err := st.Build(context.Background(), "bench", template.Spec{Pip: []string{"sandloop-bench-pkg"}, Preload: []string{"pandas", "sandloop_bench_pkg"}},
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
	const imports = "import pandas, sandloop_bench_pkg\nprint(sandloop_bench_pkg.VALUE)"

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
	b.Logf("session + first `import pandas, PKG`, median of %d: template forked from its zygote %s; same template cold %s (%.1fx slower); default session + pip install at run time %s (%.1fx slower). Template build: %s",
		n, warm.Round(100*time.Microsecond), cold.Round(100*time.Microsecond), float64(cold)/float64(warm), pip.Round(time.Millisecond), float64(pip)/float64(warm), build.Round(time.Millisecond))
}
