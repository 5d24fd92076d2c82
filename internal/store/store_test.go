package store

import (
	"archive/zip"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clock is a settable test clock, so stored times can be compared exactly.
type clock struct{ ms atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ms.Store(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	return c
}

func (c *clock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

func open(t *testing.T, path string, c *clock) *Store {
	t.Helper()
	return sqliteBackend.open(t, path, c).(*Store)
}

// backend is one implementation of History under the shared suite.
type backend struct {
	// fresh names a new, empty database.
	fresh func(t *testing.T) string
	// openRaw opens a database fresh named.
	openRaw func(ctx context.Context, db string, opts *Options) (History, error)
	// checkSchema checks that every migration has been applied, once.
	checkSchema func(t *testing.T, h History)
}

var sqliteBackend = backend{
	fresh:   tempDB,
	openRaw: func(ctx context.Context, db string, opts *Options) (History, error) { return Open(ctx, db, opts) },
	checkSchema: func(t *testing.T, h History) {
		s := h.(*Store)
		var version int
		var mode string
		if err := s.r.QueryRowContext(t.Context(), "PRAGMA user_version").Scan(&version); err != nil || version != len(migrations) {
			t.Errorf("user_version = %d (%v), want %d", version, err, len(migrations))
		}
		if err := s.r.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("journal_mode = %q (%v)", mode, err)
		}
	},
}

// shared is the suite both backends pass.
var shared = []struct {
	name string
	test func(t *testing.T, b backend)
}{
	{"RunLifecycle", testRunLifecycle},
	{"NotFound", testNotFound},
	{"StepsAccumulateUsage", testStepsAccumulateUsage},
	{"Events", testEvents},
	{"ListRuns", testListRuns},
	{"LookupRunID", testLookupRunID},
	{"ArtifactsAndExport", testArtifactsAndExport},
	{"ArtifactPathsRejected", testArtifactPathsRejected},
	{"DeleteRunCascades", testDeleteRunCascades},
	{"ConcurrentWriters", testConcurrentWriters},
	{"ReopenKeepsDataAndSchema", testReopenKeepsDataAndSchema},
	{"ConcurrentOpenOfNewDatabase", testConcurrentOpenOfNewDatabase},
	{"ContextCancelled", testContextCancelled},
}

func runShared(t *testing.T, b backend) {
	for _, tc := range shared {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, b) })
	}
}

func TestSQLite(t *testing.T) { runShared(t, sqliteBackend) }

// open opens db, closed in t's cleanup; c, if not nil, is its clock.
func (b backend) open(t *testing.T, db string, c *clock) History {
	t.Helper()
	opts := &Options{}
	if c != nil {
		opts.Now = c.now
	}
	s, err := b.openRaw(t.Context(), db, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func tempDB(t *testing.T) string { return filepath.Join(t.TempDir(), "runs.db") }

func testRunLifecycle(t *testing.T, b backend) {
	c := newClock()
	s := b.open(t, b.fresh(t), c)
	ctx := t.Context()

	r, err := s.CreateRun(ctx, Run{Task: "print primes", Mode: "generate", Model: "openai/gpt-4o-mini"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ID) != 16 || r.Status != "running" || !r.CreatedAt.Equal(c.now()) {
		t.Errorf("created = %+v", r)
	}
	c.advance(time.Minute)
	updated, err := s.UpdateRun(ctx, r.ID, func(r *Run) error {
		r.Status, r.Steps, r.Summary = "succeeded", 3, "done"
		r.Report = json.RawMessage(`{"root_cause":"off by one"}`)
		r.ID, r.CreatedAt = "hijack", time.Time{} // ignored: identity is fixed
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := Run{
		ID: r.ID, CreatedAt: r.CreatedAt, UpdatedAt: r.CreatedAt.Add(time.Minute),
		Task: "print primes", Mode: "generate", Model: "openai/gpt-4o-mini",
		Status: "succeeded", Steps: 3, Summary: "done", Report: json.RawMessage(`{"root_cause":"off by one"}`),
	}
	if !equalRun(*got, want) || !equalRun(*updated, want) {
		t.Errorf("got\n%+v\nupdated\n%+v\nwant\n%+v", *got, *updated, want)
	}

	// An update that fails writes nothing.
	boom := errors.New("boom")
	if _, err := s.UpdateRun(ctx, r.ID, func(r *Run) error { r.Status = "x"; return boom }); !errors.Is(err, boom) {
		t.Errorf("err = %v", err)
	}
	if got, _ := s.GetRun(ctx, r.ID); got.Status != "succeeded" {
		t.Errorf("failed update was written: %q", got.Status)
	}
	if _, err := s.UpdateRun(ctx, r.ID, func(r *Run) error { r.Report = json.RawMessage(`{`); return nil }); err == nil {
		t.Error("invalid report JSON accepted")
	}
	// A cost that leaves out unpriced calls says so, in lists too.
	if _, err := s.UpdateRun(ctx, r.ID, func(r *Run) error { r.CostUnknown = true; return nil }); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListRuns(ctx, ListOptions{})
	if got, _ := s.GetRun(ctx, r.ID); err != nil || len(list) != 1 || !list[0].CostUnknown || !got.CostUnknown {
		t.Errorf("cost_unknown not kept: list %+v, err %v", list, err)
	}
}

func equalRun(a, b Run) bool {
	ra, rb := a.Report, b.Report
	a.Report, b.Report = nil, nil
	return a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt) &&
		fmt.Sprint(withoutTimes(a)) == fmt.Sprint(withoutTimes(b)) && bytes.Equal(ra, rb)
}

func withoutTimes(r Run) Run { r.CreatedAt, r.UpdatedAt = time.Time{}, time.Time{}; return r }

func testNotFound(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), nil)
	ctx := t.Context()
	cases := map[string]func() error{
		"GetRun":        func() error { _, err := s.GetRun(ctx, "nope"); return err },
		"UpdateRun":     func() error { _, err := s.UpdateRun(ctx, "nope", func(*Run) error { return nil }); return err },
		"AppendStep":    func() error { _, err := s.AppendStep(ctx, Step{RunID: "nope", Kind: "model"}); return err },
		"ListSteps":     func() error { _, err := s.ListSteps(ctx, "nope"); return err },
		"AppendEvent":   func() error { _, err := s.AppendEvent(ctx, "nope", "x", nil); return err },
		"ListEvents":    func() error { _, err := s.ListEvents(ctx, "nope", 0, 0); return err },
		"PutArtifacts":  func() error { return s.PutArtifacts(ctx, "nope", nil) },
		"ListArtifacts": func() error { _, err := s.ListArtifacts(ctx, "nope"); return err },
		"Artifact":      func() error { _, err := s.Artifact(ctx, "nope", "a.py"); return err },
		"ExportRun":     func() error { return s.ExportRun(ctx, "nope", io.Discard) },
		"DeleteRun":     func() error { return s.DeleteRun(ctx, "nope") },
		"LookupRunID":   func() error { _, err := s.LookupRunID(ctx, "nope"); return err },
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, ErrNotFound) {
				t.Errorf("err = %v, want ErrNotFound", err)
			}
		})
	}
}

func testStepsAccumulateUsage(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), newClock())
	ctx := t.Context()
	r, err := s.CreateRun(ctx, Run{Task: "t", Mode: "debug", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 123e6, time.UTC)
	inputs := []Step{
		{RunID: r.ID, Kind: "model", Data: json.RawMessage(`{"text":"let me run it"}`), TokensIn: 100, TokensOut: 20, CostUSD: 0.25, StartedAt: start, EndedAt: start.Add(time.Second)},
		{RunID: r.ID, Kind: "tool", Name: "execute_python", Data: json.RawMessage(`{"stderr":"Traceback ...\nZeroDivisionError"}`)},
		{RunID: r.ID, Kind: "model", TokensIn: 300, TokensOut: 30, CostUSD: 0.5},
	}
	for i, in := range inputs {
		st, err := s.AppendStep(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if st.Index != i {
			t.Errorf("step %d got index %d", i, st.Index)
		}
	}
	steps, err := s.ListSteps(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 || steps[1].Name != "execute_python" || !strings.Contains(string(steps[1].Data), "ZeroDivisionError") ||
		!steps[0].StartedAt.Equal(start) || !steps[0].EndedAt.Equal(start.Add(time.Second)) || steps[2].Data != nil {
		t.Errorf("steps = %+v", steps)
	}
	got, _ := s.GetRun(ctx, r.ID)
	if got.TokensIn != 400 || got.TokensOut != 50 || got.CostUSD != 0.75 {
		t.Errorf("totals = %d/%d/%v", got.TokensIn, got.TokensOut, got.CostUSD)
	}
	if _, err := s.AppendStep(ctx, Step{RunID: r.ID, Kind: "x", Data: json.RawMessage(`not json`)}); err == nil {
		t.Error("invalid step JSON accepted")
	}
}

func testEvents(t *testing.T, be backend) {
	s := be.open(t, be.fresh(t), newClock())
	ctx := t.Context()
	a, _ := s.CreateRun(ctx, Run{Task: "a"})
	b, _ := s.CreateRun(ctx, Run{Task: "b"})
	for i := 1; i <= 5; i++ {
		ev, err := s.AppendEvent(ctx, a.ID, "stdout", json.RawMessage(fmt.Sprintf(`{"text":"line %d"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq != int64(i) {
			t.Errorf("seq = %d, want %d", ev.Seq, i)
		}
	}
	if ev, _ := s.AppendEvent(ctx, b.ID, "end", nil); ev.Seq != 1 {
		t.Errorf("other run's seq = %d, want its own count from 1", ev.Seq)
	}
	batch, err := s.AppendEvents(ctx, b.ID, []Event{{Type: "stdout", Data: json.RawMessage(`{}`)}, {Type: "end"}})
	if err != nil || len(batch) != 2 || batch[0].Seq != 2 || batch[1].Seq != 3 || batch[1].RunID != b.ID {
		t.Errorf("batch = %+v, %v", batch, err)
	}
	if _, err := s.AppendEvents(ctx, b.ID, []Event{{Type: "ok"}, {Type: "bad", Data: json.RawMessage(`{`)}}); err == nil {
		t.Error("a batch with invalid JSON was accepted")
	}
	if evs, _ := s.ListEvents(ctx, b.ID, 0, 0); len(evs) != 3 {
		t.Errorf("a rejected batch wrote %d events", len(evs)-3)
	}
	cases := []struct {
		since    int64
		limit    int
		wantSeqs string
	}{
		{0, 0, "1,2,3,4,5"},
		{2, 0, "3,4,5"},
		{2, 2, "3,4"},
		{5, 0, ""},
	}
	for _, tc := range cases {
		evs, err := s.ListEvents(ctx, a.ID, tc.since, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []string
		for _, e := range evs {
			seqs = append(seqs, fmt.Sprint(e.Seq))
			if e.RunID != a.ID || e.Type != "stdout" || !strings.Contains(string(e.Data), fmt.Sprintf("line %d", e.Seq)) {
				t.Errorf("event = %+v", e)
			}
		}
		if got := strings.Join(seqs, ","); got != tc.wantSeqs {
			t.Errorf("since %d limit %d: seqs %q, want %q", tc.since, tc.limit, got, tc.wantSeqs)
		}
	}
}

func testListRuns(t *testing.T, b backend) {
	c := newClock()
	s := b.open(t, b.fresh(t), c)
	ctx := t.Context()
	var ids []string
	for i := range 7 {
		mode := "generate"
		if i%2 == 1 {
			mode = "debug"
		}
		owner := ""
		if i%3 == 0 {
			owner = "alice"
		}
		r, err := s.CreateRun(ctx, Run{Task: fmt.Sprint("task ", i), Mode: mode, Owner: owner, Report: json.RawMessage(`{"big":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
		c.advance(time.Second)
	}
	if _, err := s.UpdateRun(ctx, ids[6], func(r *Run) error { r.Status = "failed"; r.Owner = "mallory"; return nil }); err != nil {
		t.Fatal(err)
	}
	alice, nobody := "alice", ""
	cases := []struct {
		name string
		opts ListOptions
		want []int // indexes into ids, newest first
	}{
		{"all", ListOptions{}, []int{6, 5, 4, 3, 2, 1, 0}},
		{"page", ListOptions{Limit: 2, Offset: 1}, []int{5, 4}},
		{"past the end", ListOptions{Offset: 10}, []int{}},
		{"mode", ListOptions{Mode: "debug"}, []int{5, 3, 1}},
		{"status", ListOptions{Status: "failed"}, []int{6}},
		{"status and mode", ListOptions{Status: "running", Mode: "generate", Limit: 2}, []int{4, 2}},
		{"owner (which UpdateRun cannot change)", ListOptions{Owner: &alice}, []int{6, 3, 0}},
		{"no owner", ListOptions{Owner: &nobody}, []int{5, 4, 2, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runs, err := s.ListRuns(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, r := range runs {
				got = append(got, r.ID)
				if r.Report != nil {
					t.Errorf("list carries the report of %s", r.ID)
				}
			}
			for _, i := range tc.want {
				want = append(want, ids[i])
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

func testLookupRunID(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), nil)
	ctx := t.Context()
	for _, id := range []string{"abc123", "abd456", "abc"} {
		if _, err := s.CreateRun(ctx, Run{ID: id, Task: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		prefix, want string
		err          error
	}{
		{"abd", "abd456", nil},
		{"abc1", "abc123", nil},
		{"abc", "abc", nil}, // exact beats prefix
		{"ab", "", ErrAmbiguous},
		{"zz", "", ErrNotFound},
		{"", "", ErrNotFound},
		{"%", "", ErrNotFound}, // not a LIKE pattern
	}
	for _, tc := range cases {
		got, err := s.LookupRunID(ctx, tc.prefix)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("LookupRunID(%q) = %q, %v; want %q, %v", tc.prefix, got, err, tc.want, tc.err)
		}
	}
	if _, err := s.CreateRun(ctx, Run{ID: "abc", Task: "dup"}); err == nil {
		t.Error("duplicate id accepted")
	}
}

func testArtifactsAndExport(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), newClock())
	ctx := t.Context()
	r, _ := s.CreateRun(ctx, Run{Task: "fix app", Mode: "debug", Model: "m", Report: json.RawMessage(`{"diff":"-a\n+b"}`)})
	if _, err := s.AppendStep(ctx, Step{RunID: r.ID, Kind: "tool", Name: "execute_python", Data: json.RawMessage(`{"traceback":"Traceback ..."}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, r.ID, "end", json.RawMessage(`{"status":"ok"}`)); err != nil {
		t.Fatal(err)
	}
	// A first set, replaced by the final one.
	if err := s.PutArtifacts(ctx, r.ID, []Artifact{{Path: "old.py", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	files := []Artifact{
		{Path: "app.py", Mode: 0o644, Data: []byte("print('fixed')\n")},
		{Path: "bin/run.sh", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
		{Path: "empty.txt"},
	}
	if err := s.PutArtifacts(ctx, r.ID, files); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListArtifacts(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	var desc []string
	for _, a := range list {
		desc = append(desc, fmt.Sprintf("%s %o %d %v", a.Path, a.Mode, a.Size, a.Data != nil))
	}
	if got, want := strings.Join(desc, "|"), "app.py 644 15 false|bin/run.sh 755 10 false|empty.txt 644 0 false"; got != want {
		t.Errorf("list = %s, want %s", got, want)
	}
	a, err := s.Artifact(ctx, r.ID, "bin/run.sh")
	if err != nil || string(a.Data) != "#!/bin/sh\n" || a.Mode != 0o755 {
		t.Errorf("artifact = %+v, %v", a, err)
	}
	if _, err := s.Artifact(ctx, r.ID, "old.py"); !errors.Is(err, ErrNotFound) {
		t.Errorf("replaced file still there: %v", err)
	}

	var buf bytes.Buffer
	if err := s.ExportRun(ctx, r.ID, &buf); err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	contents := map[string]string{}
	modes := map[string]fs.FileMode{}
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		contents[f.Name] = string(b)
		modes[f.Name] = f.Mode()
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	if got := strings.Join(names, ","); got != "run.json,steps.json,events.jsonl,files/app.py,files/bin/run.sh,files/empty.txt" {
		t.Errorf("zip entries = %s", got)
	}
	var run Run
	if err := json.Unmarshal([]byte(contents["run.json"]), &run); err != nil || run.ID != r.ID || run.Task != "fix app" || !strings.Contains(string(run.Report), "diff") {
		t.Errorf("run.json = %s (%v)", contents["run.json"], err)
	}
	var steps []Step
	if err := json.Unmarshal([]byte(contents["steps.json"]), &steps); err != nil || len(steps) != 1 || !strings.Contains(string(steps[0].Data), "Traceback") {
		t.Errorf("steps.json = %s (%v)", contents["steps.json"], err)
	}
	if !strings.Contains(contents["events.jsonl"], `"type":"end"`) || strings.Count(contents["events.jsonl"], "\n") != 1 {
		t.Errorf("events.jsonl = %q", contents["events.jsonl"])
	}
	if contents["files/app.py"] != "print('fixed')\n" || modes["files/bin/run.sh"] != 0o755 || modes["files/app.py"] != 0o644 {
		t.Errorf("files: %q, modes %v", contents["files/app.py"], modes)
	}
}

func testArtifactPathsRejected(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), nil)
	r, _ := s.CreateRun(t.Context(), Run{Task: "t"})
	for _, p := range []string{"../escape.py", "/etc/passwd", "a/../../b", "", ".", "a//b", "./a"} {
		if err := s.PutArtifacts(t.Context(), r.ID, []Artifact{{Path: p, Data: []byte("x")}}); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
	if err := s.PutArtifacts(t.Context(), r.ID, []Artifact{{Path: "a.py"}, {Path: "a.py"}}); err == nil {
		t.Error("duplicate path accepted")
	}
	if list, _ := s.ListArtifacts(t.Context(), r.ID); len(list) != 0 {
		t.Errorf("rejected input left files: %v", list)
	}
}

func testDeleteRunCascades(t *testing.T, b backend) {
	s := b.open(t, b.fresh(t), nil)
	ctx := t.Context()
	r, _ := s.CreateRun(ctx, Run{Task: "t"})
	_, _ = s.AppendStep(ctx, Step{RunID: r.ID, Kind: "model"})
	_, _ = s.AppendEvent(ctx, r.ID, "x", nil)
	_ = s.PutArtifacts(ctx, r.ID, []Artifact{{Path: "a"}})
	if err := s.DeleteRun(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	// A new run under the same id starts empty: nothing of the old one is left.
	if _, err := s.CreateRun(ctx, Run{ID: r.ID, Task: "again"}); err != nil {
		t.Fatal(err)
	}
	steps, err1 := s.ListSteps(ctx, r.ID)
	events, err2 := s.ListEvents(ctx, r.ID, 0, 0)
	files, err3 := s.ListArtifacts(ctx, r.ID)
	if len(steps)+len(events)+len(files) != 0 || errors.Join(err1, err2, err3) != nil {
		t.Errorf("left behind: %d steps, %d events, %d files (%v)", len(steps), len(events), len(files), errors.Join(err1, err2, err3))
	}
}

func testConcurrentWriters(t *testing.T, b backend) {
	path := b.fresh(t)
	// Two Stores on one file stand in for two processes (server and CLI): they share
	// nothing in memory, only SQLite's locks.
	s1 := b.open(t, path, nil)
	s2 := b.open(t, path, nil)
	ctx := t.Context()
	r, err := s1.CreateRun(ctx, Run{Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each*3)
	for w := range writers {
		s := s1
		if w%2 == 1 {
			s = s2
		}
		wg.Go(func() {
			for i := range each {
				if _, err := s.AppendEvent(ctx, r.ID, "tick", json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))); err != nil {
					errs <- err
				}
				if _, err := s.AppendStep(ctx, Step{RunID: r.ID, Kind: "model", TokensIn: 1, CostUSD: 0.5}); err != nil {
					errs <- err
				}
				if _, err := s.UpdateRun(ctx, r.ID, func(r *Run) error { r.Steps++; return nil }); err != nil {
					errs <- err
				}
				// Readers run alongside, never blocked by WAL writers.
				if _, err := s.ListEvents(ctx, r.ID, 0, 10); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	const total = writers * each
	evs, err := s2.ListEvents(ctx, r.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: gaps or duplicates", i, e.Seq)
		}
	}
	steps, _ := s1.ListSteps(ctx, r.ID)
	got, _ := s1.GetRun(ctx, r.ID)
	if len(evs) != total || len(steps) != total || got.Steps != total || got.TokensIn != total || got.CostUSD != total*0.5 {
		t.Errorf("events %d, steps %d, run %+v; want %d each (no lost updates)", len(evs), len(steps), got, total)
	}
}

func testReopenKeepsDataAndSchema(t *testing.T, b backend) {
	path := b.fresh(t)
	ctx := t.Context()
	s, err := b.openRaw(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.CreateRun(ctx, Run{Task: "persist me"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetRun(ctx, r.ID); err == nil {
		t.Error("a closed store still answers")
	}
	// Reopening applies no migration twice and keeps the data.
	for range 3 {
		s = b.open(t, path, nil)
		got, err := s.GetRun(ctx, r.ID)
		if err != nil || got.Task != "persist me" {
			t.Fatalf("after reopen: %+v, %v", got, err)
		}
		b.checkSchema(t, s)
	}
}

func testConcurrentOpenOfNewDatabase(t *testing.T, b backend) {
	path := b.fresh(t)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			s, err := b.openRaw(t.Context(), path, nil)
			if err != nil {
				errs <- err
				return
			}
			errs <- s.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err) // e.g. "table runs already exists": a migration applied twice
		}
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := tempDB(t)
	s := open(t, path, nil)
	if _, err := s.w.ExecContext(t.Context(), fmt.Sprintf("PRAGMA user_version = %d", len(migrations)+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), path, nil); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("err = %v, want a refusal of the newer schema", err)
	}
}

func TestReadersCannotWrite(t *testing.T) {
	s := open(t, tempDB(t), nil)
	if _, err := s.r.ExecContext(t.Context(), "CREATE TABLE x (a)"); err == nil {
		t.Error("the read pool accepted a write")
	}
}

func TestPathWithSpecialCharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "my runs?#%20.db")
	s := open(t, path, nil)
	if _, err := s.CreateRun(t.Context(), Run{Task: "t"}); err != nil {
		t.Fatal(err)
	}
	// The file is where we asked, under its literal name.
	db, err := sql.Open("sqlite", "file:"+strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23", " ", "%20").Replace(path)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM runs").Scan(&n); err != nil || n != 1 {
		t.Errorf("runs in %s: %d (%v)", path, n, err)
	}
}

func testContextCancelled(t *testing.T, b backend) {
	s := open(t, tempDB(t), nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.CreateRun(ctx, Run{Task: "t"}); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}
