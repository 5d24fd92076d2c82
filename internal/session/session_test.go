package session

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image"
	_ "image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/keeper"
	"github.com/sandloop/sandloop/internal/kernel"
)

func TestMain(m *testing.M) {
	jail.MaybeInit()
	keeper.MaybeRun() // the keepers TestKeeperDiedWhileCreating starts are this binary
	code := m.Run()
	if shared.s != nil {
		shared.s.Close() // its cgroup too: nothing may be left behind
	}
	os.Exit(code)
}

func newSession(t *testing.T, opts Options) *Session {
	t.Helper()
	s, err := New(context.Background(), &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// shared is one session for tests that only add state under their own names.
var shared struct {
	once sync.Once
	s    *Session
	err  error
}

func sharedSession(t *testing.T) *Session {
	t.Helper()
	shared.once.Do(func() {
		shared.s, shared.err = New(context.Background(), &Options{})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.s
}

// run executes code and returns the result and the events, failing the
// test on a Go error.
func run(t *testing.T, s *Session, req kernel.Request) (*kernel.Result, []kernel.Event) {
	t.Helper()
	var events []kernel.Event
	r, err := s.Execute(context.Background(), req, func(e kernel.Event) { events = append(events, e) })
	if err != nil {
		t.Fatalf("execute %q: %v", req.Code, err)
	}
	return r, events
}

func runCode(t *testing.T, s *Session, code string) *kernel.Result {
	t.Helper()
	r, _ := run(t, s, kernel.Request{Code: code})
	return r
}

func mustOK(t *testing.T, r *kernel.Result) {
	t.Helper()
	if r.Status != kernel.StatusOK {
		t.Fatalf("status %s, want ok; error %+v; stderr %q", r.Status, r.Error, r.Stderr)
	}
}

func mainText(r *kernel.Result) string { return r.MainResult()["text/plain"] }

func TestStatePersists(t *testing.T) {
	s := sharedSession(t)
	mustOK(t, runCode(t, s, "persist_x = 41\nimport math as persist_math"))
	r := runCode(t, s, "persist_x + 1, round(persist_math.pi, 2)")
	mustOK(t, r)
	if got := mainText(r); got != "(42, 3.14)" {
		t.Fatalf("main result %q, want (42, 3.14)", got)
	}
}

func TestRichDisplay(t *testing.T) {
	s := sharedSession(t)
	mustOK(t, runCode(t, s, `
import base64 as _b64
class RichHTML:
    def _repr_html_(self): return "<b>hi</b>"
    def __repr__(self): return "RichHTML()"
class RichMD:
    def _repr_markdown_(self): return "# title"
class RichJSON:
    def _repr_json_(self): return {"a": [1, 2]}
class RichSVG:
    def _repr_svg_(self): return "<svg></svg>"
class RichPNG:
    def _repr_png_(self): return b"\x89PNG fake"
class NoText:
    def __repr__(self): raise ValueError("no repr")
    def _repr_html_(self): return "<i>only html</i>"
`))
	tests := []struct {
		code   string
		mime   string
		want   string
		noText bool
	}{
		{code: "RichHTML()", mime: "text/html", want: "<b>hi</b>"},
		{code: "RichMD()", mime: "text/markdown", want: "# title"},
		{code: "RichJSON()", mime: "application/json", want: `{"a": [1, 2]}`},
		{code: "RichSVG()", mime: "image/svg+xml", want: "<svg></svg>"},
		{code: "RichPNG()", mime: "image/png", want: base64.StdEncoding.EncodeToString([]byte("\x89PNG fake"))},
		{code: "NoText()", mime: "text/html", want: "<i>only html</i>", noText: true},
		{code: "'plain'", mime: "text/plain", want: "'plain'"},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			r := runCode(t, s, tc.code)
			mustOK(t, r)
			data := r.MainResult()
			if data == nil {
				t.Fatalf("no main result in %+v", r.Results)
			}
			if data[tc.mime] != tc.want {
				t.Errorf("%s = %q, want %q", tc.mime, data[tc.mime], tc.want)
			}
			if _, has := data["text/plain"]; has == tc.noText {
				t.Errorf("text/plain present = %v, want %v (%v)", has, !tc.noText, data)
			}
		})
	}
	t.Run("display", func(t *testing.T) {
		r, events := run(t, s, kernel.Request{Code: "print('a'); display(RichHTML(), 7); print('b'); 'last'"})
		mustOK(t, r)
		var kinds []string
		for _, e := range events {
			k := e.Type
			if e.Type == kernel.EventResult {
				k += ":" + e.Data["text/plain"]
				if e.IsMainResult {
					k += ":main"
				}
			}
			if e.Type == kernel.EventStdout {
				k += ":" + e.Text
			}
			kinds = append(kinds, k)
		}
		want := []string{"stdout:a\n", "result:RichHTML()", "result:7", "stdout:b\n", "result:'last':main", "end"}
		if strings.Join(kinds, "|") != strings.Join(want, "|") {
			t.Fatalf("events %q, want %q", kinds, want)
		}
	})
	t.Run("display between fd-level output", func(t *testing.T) {
		r, events := run(t, s, kernel.Request{Code: "import os\nprint('a')\nos.system('echo b')\ndisplay(1)\nos.write(1, b'c\\n')\nos.system('echo e >&2')\ndisplay(2)\nprint('\\x1b]sl;x;1\\x07d')"})
		mustOK(t, r)
		var got []string
		for _, e := range events {
			switch e.Type {
			case kernel.EventStdout, kernel.EventStderr:
				for _, line := range strings.SplitAfter(e.Text, "\n") {
					if line != "" {
						got = append(got, e.Type+":"+line)
					}
				}
			case kernel.EventResult:
				got = append(got, "result:"+e.Data["text/plain"])
			default:
				got = append(got, e.Type)
			}
		}
		want := []string{"stdout:a\n", "stdout:b\n", "result:1", "stdout:c\n", "stderr:e\n", "result:2", "stdout:\x1b]sl;x;1\x07d\n", "end"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("events %q, want %q", got, want)
		}
	})
	t.Run("semicolon hides the result", func(t *testing.T) {
		r := runCode(t, s, "1 + 1;")
		mustOK(t, r)
		if len(r.Results) != 0 {
			t.Fatalf("results %+v, want none", r.Results)
		}
	})
}

func decodePNG(t *testing.T, b64 string) image.Image {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("base64: %v", err)
	}
	img, format, err := image.Decode(bytes.NewReader(raw))
	if err != nil || format != "png" {
		t.Fatalf("decode png: %v (%s)", err, format)
	}
	return img
}

func TestLibraries(t *testing.T) {
	s := sharedSession(t)
	t.Run("matplotlib show and open figures", func(t *testing.T) {
		r := runCode(t, s, `
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(4, 3), dpi=100)
plt.plot([1, 2, 3])
plt.show()
plt.figure(figsize=(2, 1), dpi=50)
plt.plot([3, 2, 1])
`)
		mustOK(t, r)
		var sizes []image.Point
		for _, o := range r.Results {
			if png, ok := o.Data["image/png"]; ok {
				sizes = append(sizes, decodePNG(t, png).Bounds().Size())
			}
		}
		want := []image.Point{{400, 300}, {100, 50}}
		if len(sizes) != 2 || sizes[0] != want[0] || sizes[1] != want[1] {
			t.Fatalf("figure sizes %v, want %v", sizes, want)
		}
		r = runCode(t, s, "len(plt.get_fignums())")
		mustOK(t, r)
		if mainText(r) != "0" || len(r.Results) != 1 {
			t.Fatalf("figures left open: %q, results %d", mainText(r), len(r.Results))
		}
	})
	t.Run("pandas DataFrame", func(t *testing.T) {
		r := runCode(t, s, "import pandas as pd\npd.DataFrame({'col_a': [1, 2], 'col_b': ['x', 'y']})")
		mustOK(t, r)
		data := r.MainResult()
		if !strings.Contains(data["text/html"], "<table") || !strings.Contains(data["text/html"], "col_b") {
			t.Errorf("text/html %q lacks the table", data["text/html"])
		}
		if !strings.Contains(data["text/plain"], "col_a") {
			t.Errorf("text/plain %q lacks the columns", data["text/plain"])
		}
	})
	t.Run("PIL image", func(t *testing.T) {
		r := runCode(t, s, "from PIL import Image\nImage.new('RGB', (7, 5), 'red')")
		mustOK(t, r)
		if got := decodePNG(t, r.MainResult()["image/png"]).Bounds().Size(); got != (image.Point{7, 5}) {
			t.Fatalf("image size %v, want 7x5", got)
		}
	})
}

func TestOutputStreams(t *testing.T) {
	s := sharedSession(t)
	tests := []struct {
		name, code     string
		stdout, stderr string
	}{
		{
			name: "fd level in order",
			code: `import os, subprocess, sys, ctypes
print("1 print")
subprocess.run(["echo", "2 subprocess"])
os.system("echo 3 os.system")
os.write(1, b"4 os.write\n")
ctypes.CDLL(None).write(1, b"5 libc\n", 7)
print("6 print")`,
			stdout: "1 print\n2 subprocess\n3 os.system\n4 os.write\n5 libc\n6 print\n",
		},
		{
			name:   "stderr",
			code:   "import sys, os\nsys.stderr.write('e1\\n')\nos.system('echo e2 >&2')",
			stderr: "e1\ne2\n",
		},
		{
			name:   "shell lines",
			code:   "!echo hi from shell\nfor i in range(2):\n    !echo loop\n!pwd",
			stdout: "hi from shell\nloop\nloop\n/workspace\n",
		},
		{
			name:   "utf-8",
			code:   "print('héllo ✓ 日本')",
			stdout: "héllo ✓ 日本\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, events := run(t, s, kernel.Request{Code: tc.code})
			mustOK(t, r)
			var streamed strings.Builder
			for _, e := range events {
				if e.Type == kernel.EventStdout {
					streamed.WriteString(e.Text)
				}
			}
			if r.Stdout != tc.stdout || streamed.String() != tc.stdout {
				t.Errorf("stdout %q, streamed %q, want %q", r.Stdout, streamed.String(), tc.stdout)
			}
			if r.Stderr != tc.stderr {
				t.Errorf("stderr %q, want %q", r.Stderr, tc.stderr)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	s := sharedSession(t)
	tests := []struct {
		name, code string
		errName    string
		inValue    string
		inTB       []string
		frames     int // "File " lines in the traceback; -1: don't check
	}{
		{
			name:    "three calls deep",
			code:    "def err_f():\n    return 1 / 0\ndef err_g():\n    return err_f()\ndef err_h():\n    return err_g()\nerr_h()",
			errName: "ZeroDivisionError", inValue: "division by zero",
			inTB:   []string{"line 7, in <module>", "line 6, in err_h", "line 4, in err_g", "line 2, in err_f", "return 1 / 0"},
			frames: 4,
		},
		{
			name: "syntax error", code: "x = (\n", errName: "SyntaxError", inValue: "never closed",
			inTB: []string{"line 1", "x = ("}, frames: 1,
		},
		{
			name: "indentation error", code: "if True:\n    a = 1\n  b = 2", errName: "IndentationError",
			inTB: []string{"line 3", "b = 2"}, frames: 1,
		},
		{
			name: "input", code: "input('name? ')", errName: "StdinNotImplementedError", inValue: "no stdin",
			frames: 1,
		},
		{
			name: "shell exit status", code: "!exit 3", errName: "subprocess.CalledProcessError", inValue: "exit status 3",
			inTB: []string{"!exit 3"}, frames: 1,
		},
		{
			name: "library frames kept", code: "import json\njson.loads('{')", errName: "json.decoder.JSONDecodeError",
			inTB: []string{"line 2, in <module>", "json/decoder.py"}, frames: -1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runCode(t, s, tc.code)
			if r.Status != kernel.StatusError || r.Error == nil {
				t.Fatalf("status %s error %+v, want an error", r.Status, r.Error)
			}
			e := r.Error
			if e.Name != tc.errName || !strings.Contains(e.Value, tc.inValue) {
				t.Errorf("error %s: %s, want %s containing %q", e.Name, e.Value, tc.errName, tc.inValue)
			}
			for _, want := range append(tc.inTB, "<cell ") {
				if !strings.Contains(e.Traceback, want) {
					t.Errorf("traceback lacks %q:\n%s", want, e.Traceback)
				}
			}
			if strings.Contains(e.Traceback, "kernel.py") || strings.Contains(e.Traceback, "sandloop") {
				t.Errorf("traceback shows kernel frames:\n%s", e.Traceback)
			}
			if n := strings.Count(e.Traceback, "File "); tc.frames >= 0 && n != tc.frames {
				t.Errorf("traceback has %d frames, want %d:\n%s", n, tc.frames, e.Traceback)
			}
		})
	}
}

func TestExecutionCount(t *testing.T) {
	s := newSession(t, Options{})
	for i, code := range []string{"1", "x = (", "1/0", "2", "!false", "3"} {
		r := runCode(t, s, code)
		if r.ExecutionCount != i+1 {
			t.Fatalf("cell %d (%q): execution_count %d", i+1, code, r.ExecutionCount)
		}
	}
}

func TestEnvPerExecution(t *testing.T) {
	s := sharedSession(t)
	r, _ := run(t, s, kernel.Request{
		Code: "import os, subprocess\nprint(os.environ['SL_TEST_VAR'])\nsubprocess.run('echo $SL_TEST_VAR', shell=True)",
		Env:  map[string]string{"SL_TEST_VAR": "v1"},
	})
	mustOK(t, r)
	if r.Stdout != "v1\nv1\n" {
		t.Fatalf("stdout %q, want the variable twice", r.Stdout)
	}
	r = runCode(t, s, "import os, subprocess\nprint(os.environ.get('SL_TEST_VAR'))\nsubprocess.run('echo x${SL_TEST_VAR}x', shell=True)")
	mustOK(t, r)
	if r.Stdout != "None\nxx\n" {
		t.Fatalf("stdout %q: the variable leaked into the next execution", r.Stdout)
	}
}

func TestUsage(t *testing.T) {
	s := newSession(t, Options{})
	r := runCode(t, s, "big = bytearray(96 << 20)\nsum(range(3_000_000))")
	mustOK(t, r)
	if r.MemoryPeakBytes < 96<<20 {
		t.Errorf("memory_peak_bytes %d, want at least 96 MiB", r.MemoryPeakBytes)
	}
	if r.CPUMS <= 0 || r.DurationMS <= 0 {
		t.Errorf("cpu_ms %v duration_ms %v, want > 0", r.CPUMS, r.DurationMS)
	}
	mustOK(t, runCode(t, s, "del big"))
	r = runCode(t, s, "1")
	mustOK(t, r)
	if r.MemoryPeakBytes >= 96<<20 {
		t.Errorf("memory_peak_bytes %d after freeing: the peak is not per execution", r.MemoryPeakBytes)
	}
}

func TestTimeoutKeepsState(t *testing.T) {
	s := newSession(t, Options{})
	mustOK(t, runCode(t, s, "kept = 'yes'"))
	r, _ := run(t, s, kernel.Request{Code: "import time\nwhile True: time.sleep(0.01)", Timeout: 300 * time.Millisecond})
	if r.Status != kernel.StatusTimeout || r.Error == nil || r.Error.Name != "TimeoutError" {
		t.Fatalf("status %s error %+v, want timeout", r.Status, r.Error)
	}
	if !strings.Contains(r.Error.Traceback, "<cell 2>") {
		t.Errorf("the traceback does not say where the code was:\n%s", r.Error.Traceback)
	}
	r = runCode(t, s, "kept")
	mustOK(t, r)
	if mainText(r) != "'yes'" {
		t.Fatalf("state lost after a timeout: %q", mainText(r))
	}
}

func TestTimeoutKillsStubbornCode(t *testing.T) {
	s := newSession(t, Options{InterruptGrace: 300 * time.Millisecond})
	mustOK(t, runCode(t, s, "x = 1"))
	r, _ := run(t, s, kernel.Request{
		Code:    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
		Timeout: 200 * time.Millisecond,
	})
	if r.Status != kernel.StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, "timeout") {
		t.Fatalf("status %s error %+v, want killed after the timeout", r.Status, r.Error)
	}
	if err := s.Err(); !errors.Is(err, ErrRestartRequired) {
		t.Fatalf("Err() = %v, want ErrRestartRequired", err)
	}
	if _, err := s.Execute(context.Background(), kernel.Request{Code: "1"}, nil); !errors.Is(err, ErrRestartRequired) {
		t.Fatalf("Execute after kill: %v, want ErrRestartRequired", err)
	}
	if err := s.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	r = runCode(t, s, "'x' in globals()")
	mustOK(t, r)
	if mainText(r) != "False" {
		t.Fatalf("state survived a restart: %q", mainText(r))
	}
}

func TestKernelDeath(t *testing.T) {
	tests := []struct {
		name, code string
		opts       Options
		inReason   []string // any of
	}{
		{name: "os._exit", code: "import os\nos._exit(3)", inReason: []string{"status 3"}},
		{name: "segfault", code: "import ctypes\nctypes.string_at(0)", inReason: []string{"SIGSEGV"}},
		{
			name: "out of memory", opts: Options{Limits: jail.Limits{Memory: 128 << 20}},
			code:     "hog = []\nwhile True: hog.append(bytearray(16 << 20))",
			inReason: []string{"out-of-memory", "SIGKILL"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSession(t, tc.opts)
			mustOK(t, runCode(t, s, "before = 1"))
			r, events := run(t, s, kernel.Request{Code: "print('going')\n" + tc.code})
			if tc.name == "out of memory" && r.Status == kernel.StatusError && r.Error.Name == "MemoryError" {
				t.Skip("no memory cgroup here: the rlimit makes it a MemoryError")
			}
			if r.Status != kernel.StatusKilled || r.Error == nil || r.Error.Name != "KernelDied" {
				t.Fatalf("status %s error %+v, want killed", r.Status, r.Error)
			}
			found := false
			for _, want := range tc.inReason {
				found = found || strings.Contains(r.Error.Value, want)
			}
			if !found {
				t.Errorf("reason %q says none of %q", r.Error.Value, tc.inReason)
			}
			if r.Stdout != "going\n" || events[len(events)-1].Type != kernel.EventEnd {
				t.Errorf("stdout %q, last event %+v", r.Stdout, events[len(events)-1])
			}
			if r.ExecutionCount != 2 {
				t.Errorf("execution_count %d, want 2", r.ExecutionCount)
			}
			if !errors.Is(s.Err(), ErrRestartRequired) {
				t.Fatalf("Err() = %v, want ErrRestartRequired", s.Err())
			}
			if err := s.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			r = runCode(t, s, "'before' in globals()")
			mustOK(t, r)
			if mainText(r) != "False" {
				t.Fatalf("after restart: %q", mainText(r))
			}
		})
	}
}

func TestProtocolGarbageFromUserCode(t *testing.T) {
	tests := []struct{ name, code string }{
		{"garbage line", "import os\nfor fd in range(100, 110):\n    try: os.write(fd, b'this is not json\\n')\n    except OSError: pass"},
		{"closed channel", "import os\nfor fd in range(100, 110):\n    try: os.close(fd)\n    except OSError: pass\nimport time; time.sleep(30)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSession(t, Options{})
			r, events := run(t, s, kernel.Request{Code: tc.code, Timeout: 2 * time.Second})
			if r.Status != kernel.StatusKilled {
				t.Logf("events %+v", events)
				t.Fatalf("status %s error %+v, want killed", r.Status, r.Error)
			}
			if err := s.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			mustOK(t, runCode(t, s, "1"))
		})
	}
}

func TestInterrupt(t *testing.T) {
	s := newSession(t, Options{})
	mustOK(t, runCode(t, s, "kept = 5"))
	var once sync.Once
	r, err := s.Execute(context.Background(), kernel.Request{Code: "import time\nprint('started', flush=True)\ntime.sleep(60)"}, func(e kernel.Event) {
		if e.Type == kernel.EventStdout {
			once.Do(func() { s.Interrupt() })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != kernel.StatusInterrupted || r.Error == nil || r.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("status %s error %+v, want interrupted", r.Status, r.Error)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err = s.Execute(ctx, kernel.Request{Code: "import time\nprint('started', flush=True)\ntime.sleep(60)"}, func(e kernel.Event) {
		if e.Type == kernel.EventStdout {
			cancel()
		}
	})
	if err != nil || r.Status != kernel.StatusInterrupted {
		t.Fatalf("cancel: %v, %+v; want interrupted", err, r)
	}
	r = runCode(t, s, "kept")
	mustOK(t, r)
	if mainText(r) != "5" {
		t.Fatalf("state lost after interrupts: %q", mainText(r))
	}
}

func TestOneExecutionAtATime(t *testing.T) {
	s := newSession(t, Options{})
	started := make(chan struct{})
	first := make(chan *kernel.Result)
	go func() {
		r, _ := s.Execute(context.Background(), kernel.Request{Code: "import os, time\nprint('in', flush=True)\nwhile not os.path.exists('go'): time.sleep(0.01)\n'first'"}, func(e kernel.Event) {
			if e.Type == kernel.EventStdout {
				close(started)
			}
		})
		first <- r
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Execute(ctx, kernel.Request{Code: "'second'"}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second execution did not wait its turn: %v", err)
	}
	second := make(chan *kernel.Result)
	go func() {
		r, _ := s.Execute(context.Background(), kernel.Request{Code: "'second'"}, nil)
		second <- r
	}()
	if err := os.WriteFile(filepath.Join(s.Workspace(), "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r1, r2 := <-first, <-second
	if mainText(r1) != "'first'" || mainText(r2) != "'second'" || r2.ExecutionCount != r1.ExecutionCount+1 {
		t.Fatalf("first %+v second %+v", r1, r2)
	}
}

func TestRestartKeepsWorkspace(t *testing.T) {
	s := newSession(t, Options{})
	mustOK(t, runCode(t, s, "state = 1\nopen('kept.txt', 'w').write('data')"))
	if err := s.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := runCode(t, s, "('state' in globals(), open('kept.txt').read())")
	mustOK(t, r)
	if mainText(r) != "(False, 'data')" {
		t.Fatalf("after restart: %q", mainText(r))
	}
	if r.ExecutionCount != 1 {
		t.Errorf("execution_count %d after restart, want 1", r.ExecutionCount)
	}
}

func TestClose(t *testing.T) {
	s, err := New(context.Background(), &Options{})
	if err != nil {
		t.Fatal(err)
	}
	ws := s.Workspace()
	done := make(chan *kernel.Result)
	started := make(chan struct{})
	go func() {
		r, _ := s.Execute(context.Background(), kernel.Request{Code: "import time\nprint('x', flush=True)\ntime.sleep(60)"}, func(e kernel.Event) {
			if e.Type == kernel.EventStdout {
				close(started)
			}
		})
		done <- r
	}()
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r == nil || r.Status != kernel.StatusKilled {
		t.Fatalf("running execution after Close: %+v, want killed", r)
	}
	if _, err := os.Stat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("workspace still there: %v", err)
	}
	if _, err := s.Execute(context.Background(), kernel.Request{Code: "1"}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Execute after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestCallerWorkspaceIsKept(t *testing.T) {
	dir := t.TempDir()
	s := newSession(t, Options{Workspace: dir, Env: map[string]string{"SESSION_ENV": "on"}})
	r := runCode(t, s, "import os\nopen('f.txt', 'w').write('1')\nos.environ['SESSION_ENV']")
	mustOK(t, r)
	if mainText(r) != "'on'" {
		t.Errorf("session env: %q", mainText(r))
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "f.txt")); err != nil {
		t.Fatalf("the caller's workspace was not kept: %v", err)
	}
}

func TestCheckComplete(t *testing.T) {
	s := sharedSession(t)
	tests := []struct{ code, want string }{
		{"1 + 1\n", "complete"},
		{"x = (1,\n", "incomplete"},
		{"for i in range(3):\n", "incomplete"},
		{"for i in range(3):\n    print(i)\n", "incomplete"},
		{"for i in range(3):\n    print(i)\n\n", "complete"},
		{"!ls\n", "complete"},
		{"1 +* 2\n", "invalid"},
	}
	for _, tc := range tests {
		got, err := s.CheckComplete(context.Background(), tc.code)
		if err != nil || got != tc.want {
			t.Errorf("CheckComplete(%q) = %q, %v; want %q", tc.code, got, err, tc.want)
		}
	}
}

func TestEventJSON(t *testing.T) {
	s := sharedSession(t)
	_, events := run(t, s, kernel.Request{Code: "print('o')\n1/0"})
	var lines []map[string]any
	for _, e := range events {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		lines = append(lines, m)
	}
	if len(lines) != 3 || lines[0]["type"] != "stdout" || lines[1]["type"] != "error" || lines[2]["type"] != "end" {
		t.Fatalf("events %v", lines)
	}
	for _, key := range []string{"status", "execution_count", "duration_ms", "cpu_ms", "memory_peak_bytes"} {
		if _, ok := lines[2][key]; !ok {
			t.Errorf("end event lacks %s: %v", key, lines[2])
		}
	}
	if lines[2]["status"] != "error" || lines[1]["name"] != "ZeroDivisionError" {
		t.Errorf("events %v", lines)
	}
}
