package e2b

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// A PTY over the process RPCs at the wire level: output only in data.pty,
// input as input.pty (input.stdin refused), resize through Update, and
// the end with the shell's exit code.
func TestProcessPTY(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, Options{})
	c := ts.create(t, keyA, `{}`)
	done := make(chan []map[string]any, 1)
	go func() {
		msgs, _ := ts.stream(t, c, "process.Process/Start", map[string]any{
			"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-i", "-l"}, "envs": map[string]string{"TERM": "xterm-256color"}},
			"pty":     map[string]any{"size": map[string]any{"cols": 80, "rows": 24}},
		}, "Connect-Timeout-Ms", "60000")
		done <- msgs
	}()
	var sel map[string]any
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, m := ts.rpc(t, c, "process.Process/List", map[string]any{})
		ps, _ := m["processes"].([]any)
		if len(ps) != 1 {
			return errors.New("List shows no process")
		}
		p := ps[0].(map[string]any)
		if cfg := p["config"].(map[string]any); cfg["cmd"] != "/bin/bash" || fmt.Sprint(cfg["args"]) != "[-i -l]" {
			return fmt.Errorf("List: %v", p)
		}
		sel = map[string]any{"pid": p["pid"]}
		return nil
	})
	input := func(key, text string) (int, map[string]any) {
		return ts.rpc(t, c, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{key: base64.StdEncoding.EncodeToString([]byte(text))}})
	}
	if st, m := input("stdin", "echo no\n"); st != 400 || m["code"] != "failed_precondition" {
		t.Errorf("input.stdin to a PTY: %d %v", st, m)
	}
	for _, size := range []map[string]any{nil, {"cols": 0, "rows": 10}} {
		msg := map[string]any{"process": sel}
		if size != nil {
			msg["pty"] = map[string]any{"size": size}
		}
		if st, m := ts.rpc(t, c, "process.Process/Update", msg); st != 400 || m["code"] != "invalid_argument" {
			t.Errorf("Update with size %v: %d %v", size, st, m)
		}
	}
	if st, m := ts.rpc(t, c, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 101, "rows": 33}}}); st != 200 {
		t.Fatalf("Update: %d %v", st, m)
	}
	if st, m := input("pty", "stty size; tty -s && echo tty-$((6*7)); exit 3\n"); st != 200 {
		t.Fatalf("input.pty: %d %v", st, m)
	}
	msgs := <-done
	var screen strings.Builder
	var end map[string]any
	for _, m := range msgs[1:] {
		ev := m["event"].(map[string]any)
		if d, ok := ev["data"].(map[string]any); ok {
			if d["stdout"] != nil || d["stderr"] != nil {
				t.Errorf("a PTY's output came as %v, not data.pty", d)
			}
			b, _ := base64.StdEncoding.DecodeString(d["pty"].(string))
			screen.Write(b)
		}
		if e, ok := ev["end"].(map[string]any); ok {
			end = e
		}
	}
	if out := screen.String(); !strings.Contains(out, "\r33 101\r\n") || !strings.Contains(out, "\r\ntty-42\r\n") {
		t.Errorf("the terminal showed %q, want the new size and tty-42", out)
	}
	if end["exitCode"] != 3.0 {
		t.Errorf("end %v, want exit code 3", end)
	}
	// A command without a PTY takes no PTY input and cannot be resized.
	go func() {
		msgs, _ := ts.stream(t, c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "cat"}, "stdin": true})
		done <- msgs
	}()
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, m := ts.rpc(t, c, "process.Process/List", map[string]any{})
		if ps, _ := m["processes"].([]any); len(ps) == 1 {
			sel = map[string]any{"pid": ps[0].(map[string]any)["pid"]}
			return nil
		}
		return errors.New("cat is not listed")
	})
	if st, m := input("pty", "x"); st != 400 || m["code"] != "failed_precondition" {
		t.Errorf("input.pty without a PTY: %d %v", st, m)
	}
	if st, m := ts.rpc(t, c, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 80, "rows": 24}}}); st != 400 || m["code"] != "failed_precondition" {
		t.Errorf("Update without a PTY: %d %v", st, m)
	}
	ts.rpc(t, c, "process.Process/SendSignal", map[string]any{"process": sel, "signal": "SIGNAL_SIGKILL"})
	<-done
}
