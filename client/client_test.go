package client_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

func newClient(t testing.TB, url string, opts *client.Options) *client.Client {
	t.Helper()
	c, err := client.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newSession creates a session deleted when the test ends.
func newSession(t testing.TB, c *client.Client, opts *client.CreateOptions) *client.Session {
	t.Helper()
	s, err := c.CreateSession(context.Background(), opts)
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	t.Cleanup(func() {
		if err := c.DeleteSession(context.Background(), s.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("delete session %s: %v", s.ID, err)
		}
	})
	return s
}

func apiError(t *testing.T, err error) *client.APIError {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("want *client.APIError, got %T %v", err, err)
	}
	return ae
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://host", "http://", "://x"} {
		if _, err := client.New(u, nil); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	if _, err := client.New("http://127.0.0.1:8080/", nil); err != nil {
		t.Errorf("trailing slash: %v", err)
	}
}

func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, &client.CreateOptions{TimeoutS: 30, MemoryMB: 128, Env: map[string]string{"GREETING": "hi"}})
	if s.ID == "" || s.Status != "ready" || s.TimeoutS != 30 || s.MemoryMB != 128 || s.FromPool {
		t.Fatalf("created: %+v", s)
	}
	r, err := c.Execute(ctx, s.ID, "import os; x = 1; os.environ['GREETING']", nil)
	if err != nil || r.Text() != "'hi'" {
		t.Fatalf("execute: %+v %v", r, err)
	}
	got, err := c.GetSession(ctx, s.ID)
	if err != nil || got.ID != s.ID || got.Status != "ready" || got.LastUsedAt.Before(s.CreatedAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := c.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		found = found || l.ID == s.ID
	}
	if !found {
		t.Errorf("list %+v lacks %s", list, s.ID)
	}
	if _, err := c.Restart(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Execute(ctx, s.ID, "'x' in globals()", nil); err != nil || r.Text() != "False" {
		t.Errorf("after restart: %+v %v", r, err)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"get":       func() error { _, err := c.GetSession(ctx, s.ID); return err },
		"delete":    func() error { return c.DeleteSession(ctx, s.ID) },
		"execute":   func() error { _, err := c.Execute(ctx, s.ID, "1", nil); return err },
		"stream":    func() error { _, err := c.ExecuteStream(ctx, s.ID, "1", nil, nil); return err },
		"interrupt": func() error { return c.Interrupt(ctx, s.ID) },
		"restart":   func() error { _, err := c.Restart(ctx, s.ID); return err },
		"list":      func() error { _, err := c.ListFiles(ctx, s.ID, ""); return err },
		"upload":    func() error { _, err := c.Upload(ctx, s.ID, "a", strings.NewReader("")); return err },
		"archive":   func() error { _, err := c.Archive(ctx, s.ID, io.Discard, nil); return err },
	} {
		if err := call(); !client.IsNotFound(err) {
			t.Errorf("%s after delete: %v, want 404", name, err)
		}
	}
}

func TestExecuteAndStreamAgree(t *testing.T) {
	t.Parallel()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, nil)
	tests := []struct {
		name, code string
		status     client.Status
		stdout     string
		stderr     string
		text       string
		errName    string
		types      []string // event types, in order
	}{
		{"expression", "1+1", client.StatusOK, "", "", "2", "", []string{"result", "end"}},
		{"print", "print('a'); print('b')", client.StatusOK, "a\nb\n", "", "", "", []string{"stdout", "end"}},
		{"stderr", "import sys; sys.stderr.write('w\\n')", client.StatusOK, "", "w\n", "2", "", []string{"stderr", "result", "end"}},
		{"raise", "print('before'); {}['k']", client.StatusError, "before\n", "", "", "KeyError", []string{"stdout", "error", "end"}},
		{"display", "display(7); 8", client.StatusOK, "", "", "8", "", []string{"result", "result", "end"}},
		{"timeout", "import time; time.sleep(5)", client.StatusTimeout, "", "", "", "TimeoutError", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			opts := &client.ExecuteOptions{TimeoutS: 0.3}
			if tc.status != client.StatusTimeout {
				opts = nil
			}
			r, err := c.Execute(ctx, s.ID, tc.code, opts)
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			var events []client.Event
			rs, err := c.ExecuteStream(ctx, s.ID, tc.code, opts, func(ev client.Event) {
				// How output is cut into events is not a contract: count
				// consecutive stdout (or stderr) events once.
				if n := len(types); n == 0 || types[n-1] != ev.Type || ev.Type != client.EventStdout && ev.Type != client.EventStderr {
					types = append(types, ev.Type)
				}
				events = append(events, ev)
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, got := range []*client.Result{r, rs} {
				if got.Status != tc.status || got.Stdout != tc.stdout || got.Stderr != tc.stderr || got.Text() != tc.text {
					t.Errorf("result %+v, want status %s stdout %q stderr %q text %q", got, tc.status, tc.stdout, tc.stderr, tc.text)
				}
				if (got.Error != nil) != (tc.errName != "") || got.Error != nil && (got.Error.Name != tc.errName || got.Error.Traceback == "") {
					t.Errorf("error %+v, want %q", got.Error, tc.errName)
				}
			}
			if rs.ExecutionCount != r.ExecutionCount+1 {
				t.Errorf("execution counts %d then %d", r.ExecutionCount, rs.ExecutionCount)
			}
			if !reflect.DeepEqual(r.Results, rs.Results) {
				t.Errorf("results differ: %+v vs %+v", r.Results, rs.Results)
			}
			if tc.types != nil && !reflect.DeepEqual(types, tc.types) {
				t.Errorf("event types %v, want %v", types, tc.types)
			}
			if last := events[len(events)-1]; last.Type != client.EventEnd || last.Status != tc.status {
				t.Errorf("last event %+v", last)
			}
		})
	}
}

// rawRecorder keeps every response body read through it, to see what the
// server sent before the client filtered it.
type rawRecorder struct {
	mu  sync.Mutex
	raw bytes.Buffer
}

func (rr *rawRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(resp.Body, rr), resp.Body}
	}
	return resp, err
}

func (rr *rawRecorder) Write(p []byte) (int, error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.raw.Write(p)
}

func TestStreamFiltersKeepalives(t *testing.T) {
	t.Parallel()
	url := newServer(t, &host.Config{Keepalive: 20 * time.Millisecond})
	rec := &rawRecorder{}
	c := newClient(t, url, &client.Options{HTTPClient: &http.Client{Transport: rec}})
	s := newSession(t, c, nil)
	var types []string
	r, err := c.ExecuteStream(context.Background(), s.ID, "import time; time.sleep(0.3); 'slept'", nil, func(ev client.Event) {
		types = append(types, ev.Type)
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "'slept'" || !reflect.DeepEqual(types, []string{"result", "end"}) {
		t.Errorf("result %+v events %v", r, types)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !strings.Contains(rec.raw.String(), `"keepalive"`) {
		t.Errorf("the server sent no keepalive, so the filter went untested: %s", rec.raw.String())
	}
}

func TestCancelInterruptsAndStateSurvives(t *testing.T) {
	t.Parallel()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := c.ExecuteStream(ctx, s.ID, "x = 5\nimport time\nprint('started', flush=True)\ntime.sleep(60)", nil, func(ev client.Event) {
		if ev.Type == client.EventStdout {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled stream: %v", err)
	}
	// The next execution waits for the interrupted one to stop; its
	// globals survive the interrupt.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	r, err := c.Execute(ctx2, s.ID, "x", nil)
	if err != nil || r.Text() != "5" {
		t.Fatalf("after cancel: %+v %v", r, err)
	}
}

func TestInterrupt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, nil)
	done := make(chan *client.Result, 1)
	go func() {
		r, err := c.ExecuteStream(ctx, s.ID, "import time\nprint('go', flush=True)\ntime.sleep(60)", nil, func(ev client.Event) {
			if ev.Type == client.EventStdout {
				if err := c.Interrupt(ctx, s.ID); err != nil {
					t.Errorf("interrupt: %v", err)
				}
			}
		})
		if err != nil {
			t.Errorf("stream: %v", err)
		}
		done <- r
	}()
	if r := <-done; r == nil || r.Status != client.StatusInterrupted {
		t.Errorf("interrupted execution: %+v", r)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, nil)
	uploads := map[string]string{
		"a.txt":                  "alpha",
		"dir/b.bin":              "\x00\x01\x02",
		"dir/with space #?%.txt": "odd name",
		"/leading/slash.txt":     "slash",
	}
	for p, content := range uploads {
		f, err := c.Upload(ctx, s.ID, p, strings.NewReader(content))
		if err != nil {
			t.Fatalf("upload %s: %v", p, err)
		}
		if f.Size != int64(len(content)) || f.Type != "file" || f.Path != strings.TrimPrefix(p, "/") {
			t.Errorf("upload %s: %+v", p, f)
		}
		got, err := c.ReadFile(ctx, s.ID, p)
		if err != nil || string(got) != content {
			t.Errorf("read %s: %q %v", p, got, err)
		}
	}
	// The kernel sees them in its working directory.
	r, err := c.Execute(ctx, s.ID, "open('dir/with space #?%.txt').read()", nil)
	if err != nil || r.Text() != "'odd name'" {
		t.Errorf("kernel view: %+v %v", r, err)
	}
	list, err := c.ListFiles(ctx, s.ID, "dir")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	if want := []string{"b.bin", "with space #?%.txt"}; !reflect.DeepEqual(names, want) {
		t.Errorf("list dir: %v, want %v", names, want)
	}

	var tgz bytes.Buffer
	if _, err := c.Archive(ctx, s.ID, &tgz, nil); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(&tgz)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	inTar := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			inTar[h.Name] = string(b)
		}
	}
	var zbuf bytes.Buffer
	if _, err := c.Archive(ctx, s.ID, &zbuf, &client.ArchiveOptions{Format: client.FormatZip, Path: "dir"}); err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(zbuf.Bytes()), int64(zbuf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var inZip []string
	for _, f := range zr.File {
		if !f.FileInfo().IsDir() {
			inZip = append(inZip, f.Name)
		}
	}
	sort.Strings(inZip)
	want := map[string]string{}
	for p, content := range uploads {
		want[strings.TrimPrefix(p, "/")] = content
	}
	if !reflect.DeepEqual(inTar, want) {
		t.Errorf("tar.gz holds %q, want %q", inTar, want)
	}
	if len(inZip) != 2 || !strings.HasSuffix(inZip[0], "b.bin") {
		t.Errorf("zip of dir holds %q", inZip)
	}

	if err := c.DeleteFile(ctx, s.ID, "a.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, s.ID, "a.txt"); !client.IsNotFound(err) {
		t.Errorf("read deleted file: %v", err)
	}
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const tokenA, tokenB = "client-test-token-aaaa", "client-test-token-bbbb"
	url := newServer(t, &host.Config{MaxSessions: 1, Tokens: []string{tokenA, tokenB}, MaxFileBytes: 1024})
	a := newClient(t, url, &client.Options{Token: tokenA})
	b := newClient(t, url, &client.Options{Token: tokenB})
	anon := newClient(t, url, nil)
	s := newSession(t, a, nil)
	tests := []struct {
		name   string
		call   func() error
		status int
		code   string
	}{
		{"no token", func() error { _, err := anon.ListSessions(ctx); return err }, 401, "unauthorized"},
		{"other token's session", func() error { _, err := b.GetSession(ctx, s.ID); return err }, 404, "not_found"},
		{"unknown session", func() error { _, err := a.Execute(ctx, "nope", "1", nil); return err }, 404, "not_found"},
		{"bad limit", func() error { _, err := a.CreateSession(ctx, &client.CreateOptions{MemoryMB: 1}); return err }, 400, "bad_request"},
		{"limit above max", func() error { _, err := a.CreateSession(ctx, &client.CreateOptions{CPUs: 64}); return err }, 400, "limit_too_high"},
		{"server full", func() error { _, err := b.CreateSession(ctx, nil); return err }, 429, "too_many_sessions"},
		{"absolute path", func() error { _, err := a.ListFiles(ctx, s.ID, "../etc"); return err }, 400, "bad_path"},
		{"file too large", func() error {
			_, err := a.Upload(ctx, s.ID, "big", strings.NewReader(strings.Repeat("x", 2048)))
			return err
		}, 413, "too_large"},
		{"bad archive format", func() error {
			_, err := a.Archive(ctx, s.ID, io.Discard, &client.ArchiveOptions{Format: "rar"})
			return err
		}, 400, "bad_request"},
		{"negative timeout", func() error {
			_, err := a.Execute(ctx, s.ID, "1", &client.ExecuteOptions{TimeoutS: -1})
			return err
		}, 400, "bad_request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ae := apiError(t, tc.call())
			if ae.StatusCode != tc.status || ae.Code != tc.code || ae.Message == "" {
				t.Errorf("got %+v, want %d %s", ae, tc.status, tc.code)
			}
			if (ae.StatusCode == 429) != (ae.RetryAfter > 0) {
				t.Errorf("Retry-After %v with status %d", ae.RetryAfter, ae.StatusCode)
			}
			if !strings.Contains(ae.Error(), tc.code) {
				t.Errorf("Error() = %q lacks the code", ae.Error())
			}
		})
	}
}

// TestDotDotRefusedLocally: a ".." segment in a file's URL path would be
// cleaned by the server's router before reaching the workspace checks, so
// the client refuses it itself, with an error that says why.
func TestDotDotRefusedLocally(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, serverURL, nil)
	s := newSession(t, c, nil)
	for _, p := range []string{"../x", "a/../../x", "..", "a/.."} {
		_, err := c.Upload(ctx, s.ID, p, strings.NewReader("x"))
		var ae *client.APIError
		if err == nil || errors.As(err, &ae) || !strings.Contains(err.Error(), `".."`) {
			t.Errorf("upload %q: %v", p, err)
		}
		if _, err := c.ReadFile(ctx, s.ID, p); err == nil || !strings.Contains(err.Error(), `".."`) {
			t.Errorf("read %q: %v", p, err)
		}
		if err := c.DeleteFile(ctx, s.ID, p); err == nil || !strings.Contains(err.Error(), `".."`) {
			t.Errorf("delete %q: %v", p, err)
		}
	}
	if _, err := c.Upload(ctx, s.ID, "a..b/c..", strings.NewReader("dots")); err != nil {
		t.Errorf("dots inside names: %v", err)
	}
}

// TestStreamProtocolEdges plays server responses that a healthy server
// rarely sends, to check how the client reads them.
func TestStreamProtocolEdges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		ctype   string
		body    string
		wantErr func(error) bool
		events  int
	}{
		{"fatal mid-stream", 200, "application/x-ndjson",
			`{"type":"stdout","text":"a\n"}` + "\n" + `{"type":"keepalive"}` + "\n" + `{"type":"fatal","code":"internal","message":"kernel pipe broke"}` + "\n",
			func(err error) bool {
				var ae *client.APIError
				return errors.As(err, &ae) && ae.StatusCode == 0 && ae.Code == "internal" && ae.Message == "kernel pipe broke"
			}, 1},
		{"cut before end", 200, "application/x-ndjson", `{"type":"stdout","text":"a\n"}` + "\n",
			func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }, 1},
		{"JSON error", 409, "application/json", `{"error":{"code":"restart_required","message":"the kernel died"}}`,
			func(err error) bool {
				var ae *client.APIError
				return errors.As(err, &ae) && ae.StatusCode == 409 && ae.Code == "restart_required"
			}, 0},
		{"not sandloop", 502, "text/html", "<html>bad gateway</html>",
			func(err error) bool {
				var ae *client.APIError
				return errors.As(err, &ae) && ae.StatusCode == 502 && ae.Code == "" && strings.Contains(ae.Message, "bad gateway")
			}, 0},
		{"not a stream", 200, "application/json", `{"status":"ok"}`,
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "not NDJSON") }, 0},
		{"garbage line", 200, "application/x-ndjson", "{oops\n",
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "bad event") }, 0},
		{"end without trailing newline", 200, "application/x-ndjson", `{"type":"end","status":"ok","execution_count":1}`,
			func(err error) bool { return err == nil }, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Accept") != "application/x-ndjson" || r.URL.Path != "/v1/sessions/s%2F1/execute" && r.URL.RawPath != "/v1/sessions/s%2F1/execute" {
					http.Error(w, "unexpected request "+r.URL.String(), 400)
					return
				}
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			t.Cleanup(hs.Close)
			c := newClient(t, hs.URL, nil)
			n := 0
			_, err := c.ExecuteStream(context.Background(), "s/1", "1", nil, func(ev client.Event) {
				if ev.Type == "keepalive" || ev.Type == "fatal" {
					t.Errorf("passed on %+v", ev)
				}
				n++
			})
			if !tc.wantErr(err) {
				t.Errorf("error %v", err)
			}
			if n != tc.events {
				t.Errorf("%d events passed on, want %d", n, tc.events)
			}
		})
	}
}
