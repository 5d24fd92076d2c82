//go:build linux

package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// fakePrelude answers the hello like kernel.py; fake kernels then misbehave.
const fakePrelude = `import os, sys, time
os.dup2(5, 1); os.dup2(6, 2)
req = os.fdopen(3, "rb")
req.readline()
os.write(4, b'{"type":"ready"}\n')
req.readline()
`

func TestProtocolViolations(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		opts     Options
		inReason string
	}{
		{name: "garbage", script: `os.write(4, b"\x00\xffnot json\n"); time.sleep(60)`, inReason: "protocol error"},
		{name: "event without type", script: `os.write(4, b'{"text":"x"}\n'); time.sleep(60)`, inReason: "protocol error"},
		{name: "line too long", script: `os.write(4, b'{"type":"stdout","text":"' + b"x" * 300000); time.sleep(60)`, opts: Options{MaxEventBytes: 100000}, inReason: "longer than"},
		{name: "closes the channel", script: `os.close(4); time.sleep(60)`, inReason: "closed its event channel"},
		{name: "exits", script: `print("bye", flush=True); os._exit(7)`, inReason: "exit status 7"},
		{name: "ignores interrupts", script: `import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)`, opts: Options{InterruptGrace: 200 * time.Millisecond}, inReason: "did not stop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := startHost(t, []byte(fakePrelude+tc.script+"\n"), &tc.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var events []Event
			r, err := k.Execute(ctx, Request{Code: "1", Timeout: 300 * time.Millisecond}, func(e Event) { events = append(events, e) })
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != StatusKilled || r.Error == nil || !strings.Contains(r.Error.Value, tc.inReason) {
				t.Fatalf("status %s error %+v, want killed with %q", r.Status, r.Error, tc.inReason)
			}
			if last := events[len(events)-1]; last.Type != EventEnd || last.Status != StatusKilled {
				t.Errorf("last event %+v", last)
			}
			if !errors.Is(k.Err(), ErrDead) {
				t.Errorf("Err() = %v, want ErrDead", k.Err())
			}
			if _, err := k.Execute(ctx, Request{Code: "1"}, nil); !errors.Is(err, ErrDead) {
				t.Errorf("Execute on a dead kernel: %v, want ErrDead", err)
			}
		})
	}
}

func TestStartFailure(t *testing.T) {
	_, err := Start(context.Background(), hostLauncher(t, []byte("import sys\nsys.stderr.write('broken install\\n')\nsys.exit(2)\n")), nil)
	if err == nil || !strings.Contains(err.Error(), "exited during start") {
		t.Fatalf("Start of a kernel that exits: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Start(ctx, hostLauncher(t, []byte("import time\ntime.sleep(60)\n")), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start of a kernel that never answers: %v, want the ctx's error", err)
	}
}

func TestHostKernel(t *testing.T) {
	k := startHost(t, nil, nil)
	r, err := k.Execute(context.Background(), Request{Code: "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx = 6 * 7\nx"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != StatusOK || r.Stdout != "out\n" || r.Stderr != "err\n" || r.MainResult()["text/plain"] != "42" {
		t.Fatalf("result %+v", r)
	}
	// A cell from the compile cache names its own cell in tracebacks.
	for i := range 2 {
		r, err = k.Execute(context.Background(), Request{Code: "def f():\n    raise ValueError('v')\nf()"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"<cell 2>", "<cell 3>"}[i]
		if r.Error == nil || strings.Count(r.Error.Traceback, want) != 2 {
			t.Fatalf("run %d: traceback should name %s twice:\n%+v", i, want, r.Error)
		}
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Execute(context.Background(), Request{Code: "1"}, nil); !errors.Is(err, ErrDead) {
		t.Fatalf("Execute after Close: %v, want ErrDead", err)
	}
}

func TestCapture(t *testing.T) {
	tests := []struct {
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{limit: 10, writes: []string{"abc", "de"}, want: "abcde"},
		{limit: 10, writes: []string{"0123456789"}, want: "0123456789"},
		{limit: 10, writes: []string{"01234", "56789", "abcdefgh"}, want: "01234\n[... 8 bytes dropped ...]\ndefgh", truncated: true},
		{limit: 4, writes: []string{"ab", "cdefghij"}, want: "ab\n[... 6 bytes dropped ...]\nij", truncated: true},
	}
	for _, tc := range tests {
		c := capture{limit: tc.limit}
		for _, w := range tc.writes {
			c.write(w)
		}
		if got := c.String(); got != tc.want || c.truncated() != tc.truncated {
			t.Errorf("capture(%d, %q) = %q truncated %v; want %q %v", tc.limit, tc.writes, got, c.truncated(), tc.want, tc.truncated)
		}
	}
}

func TestRuneBoundary(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"abc", 3},
		{"ab\xe2\x9c", 2},     // ✓ cut after two of three bytes
		{"ab\xe2\x9c\x93", 5}, // ✓ whole
		{"\xf0\x9f", 0},
		{"a\xff", 2}, // invalid, not incomplete: pass it on
	}
	for _, tc := range tests {
		if got := runeBoundary([]byte(tc.in)); got != tc.want {
			t.Errorf("runeBoundary(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestEventJSONShapes(t *testing.T) {
	tests := []struct {
		ev   Event
		want string
	}{
		{Event{Type: EventStdout, Text: "hi\n"}, `{"type":"stdout","text":"hi\n"}`},
		{Event{Type: EventResult, IsMainResult: false, Data: map[string]string{"text/plain": "2"}}, `{"type":"result","is_main_result":false,"data":{"text/plain":"2"}}`},
		{Event{Type: EventError, Name: "E", Value: "v"}, `{"type":"error","name":"E","value":"v","traceback":""}`},
		{Event{Type: EventEnd, Status: StatusOK, ExecutionCount: 3, DurationMS: 1.5}, `{"type":"end","status":"ok","execution_count":3,"duration_ms":1.5,"cpu_ms":0,"memory_peak_bytes":0}`},
	}
	for _, tc := range tests {
		b, err := json.Marshal(tc.ev)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", tc.ev, b, err, tc.want)
		}
	}
}

type textSink struct{ out []string }

func (t *textSink) text(stream int, s string) { t.out = append(t.out, s) }
func (t *textSink) event(*wireEvent) bool     { return false }

func TestPumpMarkers(t *testing.T) {
	tests := []struct {
		name    string
		chunks  []string
		want    string // text passed on, "|" between calls
		blocked int64
	}{
		{"plain", []string{"ab", "cd"}, "ab|cd", 0},
		{"marker stops", []string{"ab\x1b]sl;T;7\x07cd"}, "ab", 7},
		{"marker split across reads", []string{"ab\x1b]s", "l;T;", "12\x07cd"}, "ab", 12},
		{"lookalike passes", []string{"\x1b]sl;T;x\x07z"}, "\x1b]sl;T;|x\x07z", 0},
		{"other token passes", []string{"\x1b]sl;U;1\x07"}, "\x1b]sl;U;1\x07", 0},
		{"utf-8 split", []string{"h\xc3", "\xa9"}, "h|\u00e9", 0},
	}
	for _, tc := range tests {
		p := &pipes{prefix: []byte("\x1b]sl;T;")}
		s := &textSink{}
		for _, c := range tc.chunks {
			p.out[streamStdout].pend = append(p.out[streamStdout].pend, c...)
			p.pump(streamStdout, s, false)
		}
		if got := strings.Join(s.out, "|"); got != tc.want || p.out[streamStdout].blocked != tc.blocked {
			t.Errorf("%s: passed on %q blocked at %d; want %q at %d", tc.name, got, p.out[streamStdout].blocked, tc.want, tc.blocked)
		}
	}
}

func TestParseStateData(t *testing.T) {
	tests := []struct {
		line  string
		ok    bool
		tag   int64
		chunk string
	}{
		{`{"type":"state_data","tag":7,"chunk":"QUJD"}`, true, 7, "QUJD"},
		{`{"type":"state_data","tag":0,"chunk":""}`, true, 0, ""},
		{`{"type":"state_data","tag":x,"chunk":"QUJD"}`, false, 0, ""},
		{`{"type":"state_data","tag":7,"chunk":"QU\"JD"}`, false, 0, ""},
		{`{"type":"state_data","tag":7,"chunk":"QUJD","x":1}`, false, 0, ""},
		{`{"type":"state_end","tag":7}`, false, 0, ""},
	}
	for _, tc := range tests {
		var ev wireEvent
		ok := parseStateData([]byte(tc.line), &ev)
		if ok != tc.ok || ok && (ev.Type != "state_data" || ev.Tag != tc.tag || string(ev.chunk) != tc.chunk) {
			t.Errorf("parseStateData(%s) = %v %+v", tc.line, ok, ev)
		}
	}
}
