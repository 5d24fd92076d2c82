package template_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/template/templatetest"
	"github.com/sandloop/sandloop/internal/zygote"
)

// demo is one template built for the tests of this file, with its module
// preloaded: "demo", from a requirements file.
var demo struct {
	once  sync.Once
	store *template.Store
	ix    *templatetest.Index
	err   error
}

func demoStore(t testing.TB) *template.Store {
	t.Helper()
	demo.once.Do(func() {
		// The index lives as long as the first test: build at once.
		demo.ix = templatetest.NewIndex(t, "sandloop-tmpl-demo", "from the template")
		dir, err := makeTempDir()
		if err != nil {
			demo.err = err
			return
		}
		if demo.store, demo.err = template.Open(dir); demo.err != nil {
			return
		}
		_, demo.err = demo.store.Build(context.Background(), "demo", template.Spec{Requirements: "sandloop-tmpl-demo==1.0\n", Preload: []string{"sandloop_tmpl_demo", "json"}}, demo.ix.BuildOptions())
	})
	if demo.err != nil {
		t.Fatal(demo.err)
	}
	return demo.store
}

func execute(t testing.TB, s *session.Managed, code string) *kernel.Result {
	t.Helper()
	r, err := s.Execute(context.Background(), kernel.Request{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSessionOfATemplate(t *testing.T) {
	st := demoStore(t)
	pool := template.NewPool(st, nil)
	t.Cleanup(pool.Close)
	m := session.NewManager(&session.ManagerOptions{Templates: pool})
	t.Cleanup(func() { m.Close() })
	forked := zygote.Supported() == nil
	if forked {
		if err := pool.Warm(context.Background(), []string{"demo"}); err != nil {
			t.Fatal(err)
		}
	}

	s, err := m.Create(context.Background(), session.CreateOptions{Template: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	r := execute(t, s, `
import sys, os
preloaded = "sandloop_tmpl_demo" in sys.modules
import sandloop_tmpl_demo, numpy, subprocess
print("VALUE", sandloop_tmpl_demo.VALUE, sys.prefix, os.environ["VIRTUAL_ENV"], "preloaded", preloaded)
print(subprocess.run(["python3", "-c", "import sandloop_tmpl_demo; print('sub', sandloop_tmpl_demo.VALUE)"], capture_output=True, text=True).stdout)
try:
    open(sandloop_tmpl_demo.__file__, "a").write("x"); print("WROTE")
except OSError as e:
    print("refused", e.errno)
print("read-only mount", bool(os.statvfs("/opt/sandloop/env").f_flag & os.ST_RDONLY))
`)
	want := []string{"VALUE from the template /opt/sandloop/env /opt/sandloop/env", "sub from the template", "refused 13", "read-only mount True"}
	if forked {
		want = append(want, "preloaded True")
	}
	for _, w := range want {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("missing %q in:\n%s\n%s %+v", w, r.Stdout, r.Stderr, r.Error)
		}
	}
	if s.Template != "demo" {
		t.Errorf("Managed.Template = %q", s.Template)
	}

	// The default session does not see it.
	d, err := m.Create(context.Background(), session.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := execute(t, d, "import sandloop_tmpl_demo"); r.Error == nil || r.Error.Name != "ModuleNotFoundError" {
		t.Errorf("the default session imports the template's package: %+v %s", r.Error, r.Stdout)
	}

	// Removal is refused while the session lives.
	var inUse *template.InUseError
	if err := pool.Remove("demo"); !errors.As(err, &inUse) {
		t.Fatalf("Remove in use: %v", err)
	}
	if _, err := m.Create(context.Background(), session.CreateOptions{Template: "nope"}); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("an unknown template: %v", err)
	}
	s.Close()
	if n := st.InUse("demo"); n != 0 {
		t.Errorf("in use by %d after its session closed", n)
	}
}

// TestDefaultTemplate: a manager's DefaultTemplate is the template of
// sessions that name none; session.NoTemplate asks for the plain one.
func TestDefaultTemplate(t *testing.T) {
	st := demoStore(t)
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	m := session.NewManager(&session.ManagerOptions{Templates: pool, DefaultTemplate: "demo"})
	t.Cleanup(func() { m.Close() })
	for _, tc := range []struct {
		ask, got string
		imports  bool
	}{{"", "demo", true}, {"demo", "demo", true}, {session.NoTemplate, "", false}} {
		s, err := m.Create(context.Background(), session.CreateOptions{Template: tc.ask})
		if err != nil {
			t.Fatal(err)
		}
		r := execute(t, s, "import sandloop_tmpl_demo")
		if s.Template != tc.got || (r.Error == nil) != tc.imports {
			t.Errorf("asked %q: template %q, import error %+v", tc.ask, s.Template, r.Error)
		}
		if env := s.Environment(); env.Template != tc.got || env.Python == "" || (tc.got != "" && len(env.Packages) == 0) {
			t.Errorf("asked %q: Environment %+v", tc.ask, env)
		}
		s.Close()
	}
}
