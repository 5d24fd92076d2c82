package main

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/snapshot/snapshottest"
)

// mcpWithSnapshots is serve's /mcp (mcpHandler) over a manager with a
// snapshot store in a temporary directory (and session records in
// records, if set), and an MCP client connected to it.
func mcpWithSnapshots(t *testing.T, records string) (*session.Manager, *snapshot.Store, *mcp.ClientSession) {
	t.Helper()
	st := snapshottest.Dir(t)
	mgr := session.NewManager(&session.ManagerOptions{Snapshots: st, Records: records})
	t.Cleanup(func() { mgr.Close() })
	h, err := mcpHandler(mgr)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	cl := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := cl.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: ts.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return mgr, st, cs
}

// The snapshot tool on serve's /mcp (mcpHandler over a manager with a
// snapshot store): it saves the session and names what it could not;
// restore continues in a new session from it.
func TestMCPSnapshotTool(t *testing.T) {
	ctx := context.Background()
	_, _, cs := mcpWithSnapshots(t, "")
	call := func(name string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				parts = append(parts, tc.Text)
			}
		}
		return strings.Join(parts, "\n"), res.IsError
	}
	if out, bad := call("execute_python", map[string]any{"code": "x = 5\ngen = (i for i in [1])\nopen('k.txt','w').write('k')"}); bad {
		t.Fatal(out)
	}
	out, bad := call("snapshot", map[string]any{"name": "before"})
	m := regexp.MustCompile(`Snapshot (snap-\S+) saved: 1 file`).FindStringSubmatch(out)
	if bad || m == nil || !strings.Contains(out, "x") || !strings.Contains(out, "NOT saved") || !strings.Contains(out, "gen") {
		t.Fatalf("snapshot: %s", out)
	}
	if out, bad := call("execute_python", map[string]any{"code": "x = 6\nimport os; os.remove('k.txt')"}); bad {
		t.Fatal(out)
	}
	out, bad = call("snapshot", map[string]any{"restore": m[1]})
	if bad || !strings.Contains(out, "started from "+m[1]) || !strings.Contains(out, "NOT restored") {
		t.Fatalf("restore: %s", out)
	}
	if out, _ := call("execute_python", map[string]any{"code": "x, open('k.txt').read()"}); !strings.Contains(out, "(5, 'k')") {
		t.Errorf("in the restored session: %s", out)
	}
	if out, bad := call("snapshot", map[string]any{"restore": "snap-nonexistent000"}); !bad || !strings.Contains(out, "not found") {
		t.Errorf("restore of an unknown snapshot: %s", out)
	}
}

// A file written with MCP's write_file is a use of the server's session:
// the next automatic snapshot holds it (before, the tool wrote to the
// session's directory behind the manager's back, and a session whose last
// use was a write_file was never written again).
func TestMCPWriteFileIsAUse(t *testing.T) {
	ctx := context.Background()
	mgr, st, cs := mcpWithSnapshots(t, t.TempDir())
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"execute_python", map[string]any{"code": "1"}},
		{"write_file", map[string]any{"path": "w.txt", "content": "w"}},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", c.tool, err, res)
		}
		if n := mgr.SnapshotChanged(ctx, 0); n != 1 {
			t.Fatalf("after %s: %d automatic snapshots written, want 1", c.tool, n)
		}
	}
	list, err := st.List(ctx, mcpOwner)
	if err != nil || len(list) != 1 {
		t.Fatalf("the session's snapshots: %+v, %v", list, err)
	}
	man, err := st.Get(ctx, mcpOwner, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range man.Files {
		found = found || f.Path == "w.txt"
	}
	if !found {
		t.Errorf("the automatic snapshot after write_file lacks w.txt: %+v", man.Files)
	}
}
