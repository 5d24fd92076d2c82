package server

import (
	"encoding/json"
	"io"
	"mime"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

// A session's notebook is kept by the server for its owner: saved, read
// back, refused when stale or too large, and gone with the session.
func TestNotebook(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{"alice-token-0123456789", "bob-token-0123456789ab"}, MaxNotebookBytes: 1 << 20})
	ts.token = "alice-token-0123456789"
	id := ts.create(t, "")
	base := "/v1/sessions/" + id + "/notebook"

	var nb Notebook
	if resp := ts.do(t, "GET", base, "", &nb); resp.StatusCode != 200 || nb.Cells == nil || len(nb.Cells) != 0 || nb.Revision != 0 {
		t.Fatalf("a new session's notebook: %d %+v", resp.StatusCode, nb)
	}
	put := `{"cells":[{"id":"a","source":"x = 6*7\nprint(x)","execution_count":1,"status":"ok","outputs":[{"type":"stdout","text":"42\n"}]},{"source":""}]}`
	if resp := ts.do(t, "PUT", base, put, &nb); resp.StatusCode != 200 || nb.Revision != 1 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("save: %d %s", resp.StatusCode, b)
	}
	var got Notebook
	ts.do(t, "GET", base, "", &got)
	if len(got.Cells) != 2 || got.Cells[0].Source != "x = 6*7\nprint(x)" || *got.Cells[0].ExecutionCount != 1 ||
		got.Cells[0].Outputs[0].Text != "42\n" || got.Cells[1].ID == "" || got.Cells[1].Type != "code" || got.Cells[1].ExecutionCount != nil {
		t.Errorf("read back: %+v", got)
	}

	for _, tc := range []struct{ name, body, code string }{
		{"stale revision", `{"cells":[],"revision":0}`, "notebook_changed"},
		{"no cells", `{}`, "bad_request"},
		{"duplicate ids", `{"cells":[{"id":"a","source":""},{"id":"a","source":""}]}`, "bad_request"},
		{"bad id", `{"cells":[{"id":"a b","source":""}]}`, "bad_request"},
		{"bad output", `{"cells":[{"source":"","outputs":[{"type":"keepalive"}]}]}`, "bad_request"},
		{"unknown field", `{"cells":[{"source":"","code":"x"}]}`, "bad_request"},
		{"too large", `{"cells":[{"source":"` + strings.Repeat("x", 1<<20) + `"}]}`, "notebook_too_large"},
	} {
		resp := ts.do(t, "PUT", base, tc.body, nil)
		if code := errCode(t, resp); code != tc.code {
			t.Errorf("%s: %d %s, want %s", tc.name, resp.StatusCode, code, tc.code)
		}
	}
	if resp := ts.do(t, "PUT", base, `{"cells":[],"revision":1}`, &nb); resp.StatusCode != 200 || nb.Revision != 2 {
		t.Errorf("save at the current revision: %d %+v", resp.StatusCode, nb)
	}

	// Another token's caller sees no such session, nor its notebook.
	ts.token = "bob-token-0123456789ab"
	if resp := ts.do(t, "GET", base, "", nil); resp.StatusCode != 404 {
		t.Errorf("another owner read the notebook: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "PUT", base, `{"cells":[]}`, nil); resp.StatusCode != 404 {
		t.Errorf("another owner wrote the notebook: %d", resp.StatusCode)
	}
	// Deleted, the session's notebook is let go at the next save.
	ts.token = "alice-token-0123456789"
	ts.do(t, "DELETE", "/v1/sessions/"+id, "", nil)
	if resp := ts.do(t, "GET", base, "", nil); resp.StatusCode != 404 {
		t.Errorf("a deleted session's notebook: %d", resp.StatusCode)
	}
	other := ts.create(t, "")
	ts.do(t, "PUT", "/v1/sessions/"+other+"/notebook", `{"cells":[]}`, nil)
	ts.srv.notebooks.mu.Lock()
	_, kept := ts.srv.notebooks.m[id]
	ts.srv.notebooks.mu.Unlock()
	if kept {
		t.Error("the deleted session's notebook is still held")
	}
}

// The .ipynb export of a notebook with real outputs (text, a DataFrame,
// a figure, a traceback) is valid nbformat 4 by Debian's python3-nbformat,
// and imports back to the same cells.
func TestNotebookIpynb(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import nbformat").Run(); err != nil {
		t.Skipf("needs Debian's python3-nbformat (scripts/deps.sh installs it; apt-get install python3-nbformat): %v", err)
	}
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	id := ts.create(t, "")
	var cells []NotebookCell
	for _, code := range []string{
		"import pandas as pd\nprint('rows: 2')\npd.DataFrame({'a': [1, 2]})",
		"import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
		"import sys\nprint('warn', file=sys.stderr)\n1 / 0",
	} {
		cells = append(cells, cellOf(code, ts.exec(t, id, code)))
	}
	cells = append(cells,
		NotebookCell{ID: "md", Type: "markdown", Source: "# Notes\nsome *text*", Outputs: []CellOutput{}},
		NotebookCell{ID: "json", Type: "code", Source: "data", ExecutionCount: ptr(9), Status: "ok", Outputs: []CellOutput{
			{Type: "result", IsMainResult: true, Data: map[string]string{"application/json": `{"a":[1,2]}`, "text/plain": "{'a': [1, 2]}"}}}},
		NotebookCell{ID: "unrun", Type: "code", Source: "not run yet", Outputs: []CellOutput{}})
	for i, want := range []string{"text/html", "image/png"} {
		if len(cells[i].Outputs) == 0 || cells[i].Outputs[len(cells[i].Outputs)-1].Data[want] == "" {
			t.Fatalf("cell %d has no %s output: %+v", i, want, cells[i].Outputs)
		}
	}
	b, _ := json.Marshal(map[string]any{"cells": cells})
	var saved Notebook
	if resp := ts.do(t, "PUT", "/v1/sessions/"+id+"/notebook", string(b), &saved); resp.StatusCode != 200 {
		t.Fatalf("save: %d", resp.StatusCode)
	}

	resp := ts.do(t, "GET", "/v1/sessions/"+id+"/notebook.ipynb", "", nil)
	ipynb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ipynb+json" {
		t.Fatalf("export: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), ipynb)
	}
	if _, p, _ := mime.ParseMediaType(resp.Header.Get("Content-Disposition")); !strings.HasSuffix(p["filename"], ".ipynb") {
		t.Errorf("Content-Disposition %q", resp.Header.Get("Content-Disposition"))
	}
	path := filepath.Join(t.TempDir(), "export.ipynb")
	os.WriteFile(path, ipynb, 0o644)
	out, err := exec.Command(python, "-c", `import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)
nbformat.validate(nb)
print(nb.nbformat, nb.nbformat_minor, len(nb.cells), nb.cells[0].outputs[-1].output_type, nb.cells[2].outputs[-1].ename)`, path).CombinedOutput()
	if err != nil {
		t.Fatalf("nbformat.validate refuses the export: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "4 5 6 execute_result ZeroDivisionError" {
		t.Errorf("nbformat reads the export as %q", got)
	}

	// Into another session: the same cells.
	other := ts.create(t, "")
	var imported Notebook
	if resp := ts.do(t, "PUT", "/v1/sessions/"+other+"/notebook.ipynb", string(ipynb), &imported, "Content-Type", "application/x-ipynb+json"); resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("import: %d %s", resp.StatusCode, b)
	}
	for i := range saved.Cells {
		// Timings and memory are not in nbformat.
		saved.Cells[i].DurationMS, saved.Cells[i].MemoryPeakBytes = 0, 0
	}
	if !reflect.DeepEqual(imported.Cells, saved.Cells) {
		a, _ := json.MarshalIndent(saved.Cells, "", " ")
		b, _ := json.MarshalIndent(imported.Cells, "", " ")
		t.Errorf("re-imported cells differ:\nsaved:    %s\nimported: %s", a, b)
	}

	for _, tc := range []struct{ name, body string }{
		{"not JSON", "hello"},
		{"nbformat 3", `{"nbformat":3,"worksheets":[]}`},
		{"bad output", `{"nbformat":4,"cells":[{"cell_type":"code","source":"","outputs":[{"output_type":"bogus"}]}]}`},
	} {
		if resp := ts.do(t, "PUT", "/v1/sessions/"+other+"/notebook.ipynb", tc.body, nil); resp.StatusCode != 400 {
			t.Errorf("import of %s: %d, want 400", tc.name, resp.StatusCode)
		}
	}
	// A Jupyter notebook of before 4.5 (no ids, lists of lines) imports.
	old := `{"nbformat":4,"nbformat_minor":2,"metadata":{},"cells":[{"cell_type":"code","execution_count":3,"metadata":{},"source":["x = 1\n","x"],"outputs":[{"output_type":"execute_result","execution_count":3,"metadata":{},"data":{"text/plain":["1"]}}]}]}`
	if resp := ts.do(t, "PUT", "/v1/sessions/"+other+"/notebook.ipynb", old, &imported); resp.StatusCode != 200 ||
		len(imported.Cells) != 1 || imported.Cells[0].ID == "" || imported.Cells[0].Source != "x = 1\nx" || imported.Cells[0].Outputs[0].Data["text/plain"] != "1" {
		t.Errorf("import of nbformat 4.2: %d %+v", resp.StatusCode, imported)
	}
}

// cellOf is the cell the web UI saves after running code.
func cellOf(code string, r kernel.Result) NotebookCell {
	c := NotebookCell{ID: "c" + string(rune('0'+r.ExecutionCount)), Type: "code", Source: code, ExecutionCount: ptr(r.ExecutionCount),
		Status: string(r.Status), DurationMS: r.DurationMS, MemoryPeakBytes: r.MemoryPeakBytes, Outputs: []CellOutput{}}
	if r.Stdout != "" {
		c.Outputs = append(c.Outputs, CellOutput{Type: "stdout", Text: r.Stdout})
	}
	if r.Stderr != "" {
		c.Outputs = append(c.Outputs, CellOutput{Type: "stderr", Text: r.Stderr})
	}
	for _, o := range r.Results {
		c.Outputs = append(c.Outputs, CellOutput{Type: "result", IsMainResult: o.IsMainResult, Data: o.Data})
	}
	if r.Error != nil {
		c.Outputs = append(c.Outputs, CellOutput{Type: "error", Name: r.Error.Name, Value: r.Error.Value, Traceback: r.Error.Traceback})
	}
	return c
}

func ptr[T any](v T) *T { return &v }

// With NotebookDir (sessions that outlive their server), a session's
// notebook is kept there too: the next server on the same sessions shows
// its cells, and its revisions go on; the files of sessions no longer held
// go, at the next server's start and at a save.
func TestNotebookKeptForTheNextServer(t *testing.T) {
	dir := t.TempDir()
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{"alice-token-0123456789"}, NotebookDir: dir})
	id := ts.create(t, "")
	gone := ts.create(t, "")
	base := "/v1/sessions/" + id + "/notebook"
	var nb Notebook
	if resp := ts.do(t, "PUT", base, `{"cells":[{"id":"a","source":"x = 1","execution_count":1,"outputs":[]}]}`, &nb); resp.StatusCode != 200 || nb.Revision != 1 {
		t.Fatalf("save: %d %+v", resp.StatusCode, nb)
	}
	ts.do(t, "PUT", "/v1/sessions/"+gone+"/notebook", `{"cells":[]}`, nil)
	if fi, err := os.Stat(filepath.Join(dir, id+".json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kept notebook: %v %v", fi, err)
	}
	ts.do(t, "DELETE", "/v1/sessions/"+gone, "", nil)
	os.WriteFile(filepath.Join(dir, "0123456789abcdef.json"), []byte(`{"owner":"alice","notebook":{"cells":[]}}`), 0o600)

	// The next server, on the same sessions.
	srv2, err := New(&Options{Manager: ts.mgr, Tokens: []string{"alice-token-0123456789"}, NotebookDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "0123456789abcdef.json")); err == nil {
		t.Error("the notebook of a session no server holds was kept")
	}
	if _, err := os.Stat(filepath.Join(dir, gone+".json")); err == nil {
		t.Error("a deleted session's notebook was kept")
	}
	hs2 := httptest.NewServer(srv2)
	defer hs2.Close()
	ts2 := &testServer{Server: hs2, mgr: ts.mgr, srv: srv2, token: "alice-token-0123456789"}
	var got Notebook
	if resp := ts2.do(t, "GET", base, "", &got); resp.StatusCode != 200 || len(got.Cells) != 1 || got.Cells[0].Source != "x = 1" || got.Revision != 1 {
		t.Fatalf("the next server's notebook: %d %+v", resp.StatusCode, got)
	}
	if resp := ts2.do(t, "PUT", base, `{"cells":[],"revision":1}`, &got); resp.StatusCode != 200 || got.Revision != 2 {
		t.Errorf("a save at the kept revision: %d %+v", resp.StatusCode, got)
	}
}
