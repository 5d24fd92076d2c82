package mcpserver_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/mcpserver"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot/snapshottest"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/tools"
)

// autoSource makes real sessions with automatic checkpoints, as sandloop
// mcp does.
type autoSource struct{ t *testing.T }

func (s autoSource) NewSession(ctx context.Context) (mcpserver.Session, error) {
	sess, err := session.New(ctx, &session.Options{Checkpoints: session.CheckpointsAuto})
	if err == nil {
		s.t.Cleanup(func() { sess.Close() })
	}
	return sess, err
}

// checkpoint and undo on a connection's session: back to before the last
// call, or to a named checkpoint; the model is told what came back.
func TestCheckpointAndUndo(t *testing.T) {
	cs := connect(t, newServer(t, autoSource{t}, nil), nil)
	if res := call(t, cs, "undo", nil); !res.IsError || !strings.Contains(text(res), "no code has run") {
		t.Errorf("undo before any code: %s", text(res))
	}
	exec := func(code string) string { t.Helper(); return executeOK(t, cs, code) }
	exec("rows = [1, 2]\nopen('a.txt', 'w').write('a')")
	res := call(t, cs, "checkpoint", map[string]any{"name": "two rows"})
	id := regexp.MustCompile(`Checkpoint (cp\d+) taken`).FindStringSubmatch(text(res))
	if res.IsError || id == nil || !strings.Contains(text(res), `undo {"checkpoint": "`+id[1]+`"}`) {
		t.Fatalf("checkpoint: %s", text(res))
	}
	exec("rows.clear()\nimport os; os.remove('a.txt')")
	res = call(t, cs, "undo", nil)
	if res.IsError || !strings.Contains(text(res), "Restored from undo: 1 file") {
		t.Fatalf("undo: %s", text(res))
	}
	if out := exec("print(rows, open('a.txt').read())"); !strings.Contains(out, "[1, 2] a") {
		t.Errorf("after undo: %s", out)
	}
	exec("rows = None")
	exec("rows = 'later'")
	res = call(t, cs, "undo", map[string]any{"checkpoint": id[1]})
	if res.IsError || !strings.Contains(text(res), "Restored from checkpoint "+id[1]) {
		t.Fatalf("undo to %s: %s", id[1], text(res))
	}
	if out := exec("print(rows)"); !strings.Contains(out, "[1, 2]") {
		t.Errorf("after undo to %s: %s", id[1], out)
	}
	if res := call(t, cs, "undo", map[string]any{"checkpoint": "cp999"}); !res.IsError || !strings.Contains(text(res), `"cp999" not found`) {
		t.Errorf("undo to an unknown checkpoint: %s", text(res))
	}
	// sandloop mcp's own source cannot fork: the tool is not offered.
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if tool.Name == "fork_session" {
			t.Error("fork_session offered by a source that cannot fork")
		}
	}
}

// forkSource makes sessions in a manager and forks them, as serve's /mcp does.
type forkSource struct{ m *session.Manager }

func (s forkSource) NewSession(ctx context.Context) (mcpserver.Session, error) {
	return s.m.Create(ctx, session.CreateOptions{Owner: "mcp", Checkpoints: session.CheckpointsAuto})
}

func (s forkSource) Fork(ctx context.Context, parent mcpserver.Session) (mcpserver.Session, *tools.Restored, error) {
	ms := parent.(*session.Managed)
	kids, r, err := s.m.Fork(ctx, ms.Owner, ms.ID(), session.ForkOptions{Count: 1})
	if err != nil {
		return nil, nil, err
	}
	return kids[0], &tools.Restored{From: r.From, Files: r.Files, Variables: r.Variables, NotRestored: r.NotRestored, ExecutionCount: r.ExecutionCount}, nil
}

// fork_session continues in a copy; switch_to goes back; both sessions go
// with the connection.
func TestForkSession(t *testing.T) {
	mgr := session.NewManager(&session.ManagerOptions{})
	t.Cleanup(func() { mgr.Close() })
	cs := connect(t, newServer(t, forkSource{mgr}, nil), nil)
	exec := func(code string) string { t.Helper(); return executeOK(t, cs, code) }
	exec("x = 1\ngen = (i for i in range(3))")
	res := call(t, cs, "fork_session", nil)
	m := regexp.MustCompile(`now working in session (\S+), a copy of (\S+)\.`).FindStringSubmatch(text(res))
	if res.IsError || m == nil || !strings.Contains(text(res), "NOT restored") || !strings.Contains(text(res), "gen") {
		t.Fatalf("fork_session: %s", text(res))
	}
	child, parent := m[1], m[2]
	if out := exec("x = 'child'\nx"); !strings.Contains(out, "child") {
		t.Errorf("in the child: %s", out)
	}
	if res := call(t, cs, "fork_session", map[string]any{"switch_to": parent}); res.IsError {
		t.Fatalf("switch to the parent: %s", text(res))
	}
	if out := exec("print(x)"); !strings.Contains(out, "1") || strings.Contains(out, "child") {
		t.Errorf("back in the parent: %s", out)
	}
	call(t, cs, "fork_session", map[string]any{"switch_to": child})
	if out := exec("print(x)"); !strings.Contains(out, "child") {
		t.Errorf("back in the child: %s", out)
	}
	if res := call(t, cs, "fork_session", map[string]any{"switch_to": "nope"}); !res.IsError || !strings.Contains(text(res), parent) {
		t.Errorf("switch to an unknown session: %s", text(res))
	}
	if n := len(mgr.List("mcp")); n != 2 {
		t.Errorf("%d sessions, want the parent and the child", n)
	}
	cs.Close()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := len(mgr.List("mcp")); n != 0 {
			return fmt.Errorf("%d sessions left after the connection ended", n)
		}
		return nil
	})
}

// A session woken from its sleep on a snapshot (idle past serve's
// --idle-hibernate, or its keeper's death) by a call tells the model, in
// that call, what came back and what did not; the next call says nothing.
func TestWokenSessionSaysWhatCameBack(t *testing.T) {
	st := snapshottest.Dir(t)
	mgr := session.NewManager(&session.ManagerOptions{Snapshots: st})
	t.Cleanup(func() { mgr.Close() })
	cs := connect(t, newServer(t, forkSource{mgr}, nil), nil)
	exec := func(code string) string { t.Helper(); return executeOK(t, cs, code) }
	exec("x = 41\ngen = (i for i in range(3))\nopen('kept.txt', 'w').write('k')")
	list := mgr.List("mcp")
	if len(list) != 1 {
		t.Fatalf("%d sessions, want 1", len(list))
	}
	if _, err := list[0].Hibernate(t.Context()); err != nil {
		t.Fatal(err)
	}
	out := exec("print(x + 1, open('kept.txt').read())")
	for _, want := range []string{"note: this sandbox session had been put to sleep on a snapshot", "Restored from hibernation: 1 file", "Variables back: x", "NOT restored", "gen", "42 k"} {
		if !strings.Contains(out, want) {
			t.Errorf("the call that woke the session lacks %q:\n%s", want, out)
		}
	}
	if out := exec("x"); strings.Contains(out, "note:") {
		t.Errorf("the next call repeats a note:\n%s", out)
	}
	if res := call(t, cs, "list_files", map[string]any{}); res.IsError || strings.Contains(text(res), "note:") {
		t.Errorf("list_files: %s", text(res))
	}
}

// executeOK runs code with execute_python and returns the result's text;
// a tool error fails the test.
func executeOK(t *testing.T, cs *mcp.ClientSession, code string) string {
	t.Helper()
	res := call(t, cs, "execute_python", map[string]any{"code": code})
	if res.IsError {
		t.Fatalf("%s: %s", code, text(res))
	}
	return text(res)
}
