package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

// Config sizes a load run.
type Config struct {
	// Duration of the load. If zero, 2 minutes.
	Duration time.Duration
	// Clients execute code on a session of their own. If zero, 50.
	Clients int
	// Creators create a session, execute once and delete it, in a loop. If zero, 4.
	Creators int
	// PoolSize is the server's warm pool. If zero, 4.
	PoolSize int
	// MaxSessions is the server's cap. If zero, Clients+2: creators then
	// share two slots and meet 429s, which they retry after Retry-After.
	MaxSessions int
	// Log receives progress lines. If nil, none.
	Log io.Writer
}

// Report is what a run measured and found.
type Report struct {
	Config   Config
	Elapsed  time.Duration
	Requests int64 // HTTP requests answered (429s included)
	Retried  int64 // 429s met by creators, retried after Retry-After
	Failures []string

	Exec, Create, CreatePooled, CreateCold []time.Duration
	ExecByKind                             map[string]int

	Leaks Leaks
}

// Problems lists every failed check; none means the run passed.
func (r *Report) Problems() []string {
	var out []string
	if n := len(r.Failures); n > 0 {
		out = append(out, fmt.Sprintf("%d failed requests", n))
	}
	if len(r.Exec) == 0 || len(r.Create) == 0 {
		out = append(out, "no execution or no create succeeded")
	}
	return append(out, r.Leaks.problems()...)
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "load: %d clients executing, %d creators, pool %d, max sessions %d, for %v\n",
		c.Clients, c.Creators, c.PoolSize, c.MaxSessions, r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "requests: %d (%.0f/s), failed: %d, 429 retried: %d\n",
		r.Requests, float64(r.Requests)/r.Elapsed.Seconds(), len(r.Failures), r.Retried)
	kinds := make([]string, 0, len(r.ExecByKind))
	for k := range r.ExecByKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.ExecByKind[k]))
	}
	fmt.Fprintf(w, "executions by kind: %s\n", strings.Join(parts, ", "))
	line := func(name string, d []time.Duration) {
		if len(d) == 0 {
			fmt.Fprintf(w, "%-16s n=0\n", name)
			return
		}
		fmt.Fprintf(w, "%-16s n=%-7d p50 %8.2f ms  p99 %8.2f ms  max %8.2f ms\n", name, len(d),
			ms(percentile(d, 50)), ms(percentile(d, 99)), ms(slices.Max(d)))
	}
	line("execute", r.Exec)
	line("create", r.Create)
	line("create (pooled)", r.CreatePooled)
	line("create (cold)", r.CreateCold)
	r.Leaks.print(w)
	for i, f := range r.Failures {
		if i == 20 {
			fmt.Fprintf(w, "... and %d more failures\n", len(r.Failures)-20)
			break
		}
		fmt.Fprintf(w, "FAIL %s\n", f)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// recorder collects latencies and failures from many goroutines.
type recorder struct {
	requests, retried atomic.Int64

	mu                                   sync.Mutex
	exec, create, createPooled, createCo []time.Duration
	byKind                               map[string]int
	failures                             []string
}

func (r *recorder) fail(format string, args ...any) {
	r.mu.Lock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) execDone(kind string, d time.Duration) {
	r.mu.Lock()
	r.exec = append(r.exec, d)
	r.byKind[kind]++
	r.mu.Unlock()
}

func (r *recorder) createDone(pooled bool, d time.Duration) {
	r.mu.Lock()
	r.create = append(r.create, d)
	if pooled {
		r.createPooled = append(r.createPooled, d)
	} else {
		r.createCo = append(r.createCo, d)
	}
	r.mu.Unlock()
}

// Run starts an in-process server with real jails, loads it for
// cfg.Duration, shuts it down and looks for anything left behind. The
// process must have called jail.MaybeInit first. Run changes TMPDIR for
// its duration (so the workspaces it makes are told apart from other
// programs') and makes the process a child subreaper (so an escaped
// sandbox process would be found among its descendants).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Duration == 0 {
		cfg.Duration = 2 * time.Minute
	}
	if cfg.Clients == 0 {
		cfg.Clients = 50
	}
	if cfg.Creators == 0 {
		cfg.Creators = 4
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 4
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = cfg.Clients + 2
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	if err := becomeSubreaper(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "sandloop-load-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	oldTmp, hadTmp := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", tmp)
	defer func() {
		if hadTmp {
			os.Setenv("TMPDIR", oldTmp)
		} else {
			os.Unsetenv("TMPDIR")
		}
	}()
	before := takeSnapshot()

	// The real host, as sandloop serve runs it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h, err := host.New(ctx, ln, &host.Config{PoolSize: cfg.PoolSize, MaxSessions: cfg.MaxSessions})
	if err != nil {
		ln.Close()
		return nil, err
	}
	go h.Serve(context.WithoutCancel(ctx)) // until Close
	// Count every answered request (429s included) as it comes back.
	rec := &recorder{byKind: map[string]int{}}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = cfg.Clients + cfg.Creators + 8
	counted := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := tr.RoundTrip(r)
		if err == nil {
			rec.requests.Add(1)
		}
		return resp, err
	})
	c, err := client.New(h.URL(), &client.Options{HTTPClient: &http.Client{Transport: counted}})
	if err != nil {
		h.Close()
		return nil, err
	}
	sampler := startSampler()

	start := time.Now()
	deadline := start.Add(cfg.Duration)
	loadCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var wg sync.WaitGroup
	// Clients first, so the creators' slots are what remains.
	ready := make(chan struct{})
	var readyN atomic.Int64
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runClient(loadCtx, c, rec, i, func() {
				if readyN.Add(1) == int64(cfg.Clients) {
					close(ready)
				}
			})
		}()
	}
	select {
	case <-ready:
	case <-loadCtx.Done():
	}
	logf("load: %d client sessions up after %v; creators start", readyN.Load(), time.Since(start).Round(time.Millisecond))
	for i := range cfg.Creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runCreator(loadCtx, c, rec, i)
		}()
	}
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-t.C:
				rec.mu.Lock()
				logf("load: %v: %d requests, %d executions, %d creates, %d failures", time.Since(start).Round(time.Second),
					rec.requests.Load(), len(rec.exec), len(rec.create), len(rec.failures))
				rec.mu.Unlock()
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)

	// Every session was deleted by its user: the server must hold none.
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	if h, err := c.Health(hctx); err != nil {
		rec.fail("healthz after the load: %v", err)
	} else if h.Sessions != 0 {
		rec.fail("the server still holds %d sessions after every one was deleted", h.Sessions)
	}
	hcancel()
	tr.CloseIdleConnections()
	if err := h.Close(); err != nil {
		rec.fail("host close: %v", err)
	}
	sampler.stop()
	logf("load: server shut down; looking for leftovers")

	rep := &Report{
		Config: cfg, Elapsed: elapsed, Requests: rec.requests.Load(), Retried: rec.retried.Load(),
		Failures: rec.failures, Exec: rec.exec, Create: rec.create, CreatePooled: rec.createPooled,
		CreateCold: rec.createCo, ExecByKind: rec.byKind,
	}
	rep.Leaks = findLeaks(before, sampler.names(), tmp, 5*time.Second)
	return rep, nil
}

const reqTimeout = 60 * time.Second

// cell is one kind of code a client runs, with what its result must be.
type cell struct {
	kind  string
	code  func(n int) string
	check func(r *client.Result, n int) error
}

var cells = []cell{
	{"quick", func(int) string { return "1+1" }, func(r *client.Result, _ int) error {
		return want(r.Status == client.StatusOK && r.Text() == "2", r)
	}},
	{"state", func(n int) string { return "counter = globals().get('counter', 0) + 1\ncounter" }, func(r *client.Result, n int) error {
		return want(r.Status == client.StatusOK && r.Text() == strconv.Itoa(n), r)
	}},
	{"print", func(n int) string { return fmt.Sprintf("for i in range(3): print('line', i, %d)", n) }, func(r *client.Result, n int) error {
		return want(r.Status == client.StatusOK && r.Stdout == fmt.Sprintf("line 0 %d\nline 1 %d\nline 2 %d\n", n, n, n), r)
	}},
	{"error", func(int) string { return "print('about to fail')\n{}['missing']" }, func(r *client.Result, _ int) error {
		return want(r.Status == client.StatusError && r.Error != nil && r.Error.Name == "KeyError" && r.Stdout == "about to fail\n", r)
	}},
	{"work", func(int) string { return "sum(i * i for i in range(20000))" }, func(r *client.Result, _ int) error {
		return want(r.Status == client.StatusOK && r.Text() == "2666466670000", r)
	}},
}

func want(ok bool, r *client.Result) error {
	if ok {
		return nil
	}
	return fmt.Errorf("unexpected result: status %s text %q stdout %q error %+v", r.Status, r.Text(), r.Stdout, r.Error)
}

// runClient keeps one session busy until ctx is done, then deletes it.
func runClient(ctx context.Context, c *client.Client, rec *recorder, i int, up func()) {
	s := createRetrying(ctx, c, rec, nil, fmt.Sprintf("client %d", i))
	if s == nil {
		up()
		return
	}
	up()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
		defer cancel()
		if err := c.DeleteSession(dctx, s.ID); err != nil {
			rec.fail("client %d: delete %s: %v", i, s.ID, err)
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	counter := 0
	for n := 0; ctx.Err() == nil; n++ {
		cl := cells[rng.IntN(len(cells))]
		arg := n
		if cl.kind == "state" {
			counter++
			arg = counter
		}
		stream := rng.IntN(4) == 0
		// Requests already sent finish even when the load ends: only a
		// request of our own that fails is a failure.
		rctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
		t0 := time.Now()
		var r *client.Result
		var err error
		if stream {
			r, err = c.ExecuteStream(rctx, s.ID, cl.code(arg), nil, nil)
		} else {
			r, err = c.Execute(rctx, s.ID, cl.code(arg), nil)
		}
		d := time.Since(t0)
		cancel()
		if err == nil {
			err = cl.check(r, arg)
		}
		if err != nil {
			rec.fail("client %d: %s (stream %v): %v", i, cl.kind, stream, err)
			continue
		}
		kind := cl.kind
		if stream {
			kind += "/stream"
		}
		rec.execDone(kind, d)
		if n%25 == 24 { // now and then, a file round trip
			if err := fileRoundTrip(c, s.ID, n); err != nil {
				rec.fail("client %d: files: %v", i, err)
			}
		}
	}
}

func fileRoundTrip(c *client.Client, id string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	content := []byte(strings.Repeat(strconv.Itoa(n), 100))
	if _, err := c.Upload(ctx, id, "data/in.txt", bytes.NewReader(content)); err != nil {
		return err
	}
	got, err := c.ReadFile(ctx, id, "data/in.txt")
	if err != nil {
		return err
	}
	if !bytes.Equal(got, content) {
		return fmt.Errorf("read back %d bytes, want %d", len(got), len(content))
	}
	return nil
}

// createRetrying creates a session, retrying after Retry-After while the
// server is full. It returns nil when ctx ends first or on a failure.
func createRetrying(ctx context.Context, c *client.Client, rec *recorder, opts *client.CreateOptions, who string) *client.Session {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
		t0 := time.Now()
		s, err := c.CreateSession(rctx, opts)
		d := time.Since(t0)
		cancel()
		var ae *client.APIError
		if errors.As(err, &ae) && ae.StatusCode == http.StatusTooManyRequests && ae.RetryAfter > 0 {
			rec.retried.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(ae.RetryAfter):
			}
			continue
		}
		if err != nil {
			rec.fail("%s: create: %v", who, err)
			return nil
		}
		rec.createDone(s.FromPool, d)
		return s
	}
	return nil
}

// runCreator creates a session, executes once in it and deletes it, in a
// loop; one create in four asks for its own memory limit, so it starts
// cold instead of from the pool.
func runCreator(ctx context.Context, c *client.Client, rec *recorder, i int) {
	for n := 0; ctx.Err() == nil; n++ {
		var opts *client.CreateOptions
		if n%4 == 3 {
			opts = &client.CreateOptions{MemoryMB: 128}
		}
		who := fmt.Sprintf("creator %d", i)
		s := createRetrying(ctx, c, rec, opts, who)
		if s == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
		t0 := time.Now()
		r, err := c.Execute(rctx, s.ID, "6*7", nil)
		d := time.Since(t0)
		if err == nil {
			err = want(r.Status == client.StatusOK && r.Text() == "42", r)
		}
		if err != nil {
			rec.fail("%s: first execute: %v", who, err)
		} else {
			rec.execDone("first", d)
		}
		if err := c.DeleteSession(rctx, s.ID); err != nil {
			rec.fail("%s: delete %s: %v", who, s.ID, err)
		}
		cancel()
	}
}

// cgroupParents are the directories where this process's sandboxes get
// their groups: its own group in each hierarchy (see internal/jail's
// cgroup_linux.go), or that group's parent when it moved itself into a
// sandloop-supervisor leaf.
func cgroupParents() []string {
	self := map[string]string{}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			self[c] = parts[2] // "" for v2
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		root, point, fstype := f[3], f[4], f[sep+1]
		var keys []string
		switch fstype {
		case "cgroup2":
			keys = []string{""}
		case "cgroup":
			keys = strings.Split(f[sep+3], ",")
		default:
			continue
		}
		for _, k := range keys {
			p, ok := self[k]
			if !ok {
				continue
			}
			p = strings.TrimSuffix(p, "/sandloop-supervisor")
			dir := filepath.Join(point, strings.TrimPrefix(p, root))
			if !seen[dir] {
				seen[dir] = true
				out = append(out, dir)
			}
		}
	}
	return out
}

// cgroupDirs lists the sandbox groups (sandloop-*) under the parents.
func cgroupDirs() []string {
	var out []string
	for _, d := range cgroupParents() {
		m, _ := filepath.Glob(filepath.Join(d, "sandloop-*"))
		for _, x := range m {
			if !strings.HasSuffix(x, "sandloop-supervisor") {
				out = append(out, x)
			}
		}
	}
	return out
}

// roundTripFunc is an http.RoundTripper in one func.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
