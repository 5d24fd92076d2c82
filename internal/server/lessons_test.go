package server

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

func TestLessonsRoutes(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{"alice-token", "bob-token"}, Lessons: st})
	bob := &testServer{Server: ts.Server, token: "bob-token"}

	type lesson struct {
		ID, Scope, Text, Signature, Detail, Files, Source string
		Shown                                             int
	}
	var a lesson
	resp := ts.do(t, "POST", "/v1/lessons", `{"text":"sales.csv's date column is day","files":"sales.csv","signature":"KeyError: 'date'"}`, &a)
	if resp.StatusCode != 201 || a.ID == "" || a.Scope != "files" || a.Signature != "KeyError: <q>" || a.Detail != "date" || a.Source != "user" {
		t.Fatalf("post: %d %+v", resp.StatusCode, a)
	}
	var list struct{ Lessons []lesson }
	resp = ts.do(t, "POST", "/v1/lessons", `{"lessons":[{"text":"seaborn is not installed: plot with matplotlib","scope":"global"},{"id":"`+a.ID+`","text":"sales.csv: the date column is called day","files":"sales.csv"}]}`, &list)
	if resp.StatusCode != 201 || len(list.Lessons) != 2 || list.Lessons[1].ID != a.ID {
		t.Fatalf("import: %d %+v", resp.StatusCode, list)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"text":""}`, "needs a text"},
		{`{"text":"x","scope":"everywhere"}`, "not global, files or task"},
		{`{"text":"x","colour":"red"}`, "colour"},
		{`{"lessons":[{"text":"ok"},{"text":"x","scope":"files"}]}`, "names the files"},
		{`{"text":"` + strings.Repeat("x", 600) + `"}`, "keep a lesson under"},
	} {
		resp := ts.do(t, "POST", "/v1/lessons", bad.body, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), bad.want) {
			t.Errorf("%s: %d %s", bad.body, resp.StatusCode, b)
		}
	}

	list.Lessons = nil
	if resp := ts.do(t, "GET", "/v1/lessons?q=matplotlib+heatmap", "", &list); resp.StatusCode != 200 || len(list.Lessons) != 1 || !strings.Contains(list.Lessons[0].Text, "seaborn") {
		t.Errorf("search: %d %+v", resp.StatusCode, list)
	}
	var one lesson
	if resp := ts.do(t, "GET", "/v1/lessons/"+a.ID, "", &one); resp.StatusCode != 200 || one.Text != "sales.csv: the date column is called day" {
		t.Errorf("get: %d %+v", resp.StatusCode, one)
	}

	// Bob sees, reads and deletes none of alice's lessons.
	list.Lessons = nil
	if resp := bob.do(t, "GET", "/v1/lessons", "", &list); resp.StatusCode != 200 || len(list.Lessons) != 0 {
		t.Errorf("bob's list: %d %+v", resp.StatusCode, list)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if resp := bob.do(t, m, "/v1/lessons/"+a.ID, "", nil); resp.StatusCode != 404 {
			t.Errorf("bob %s alice's lesson: %d", m, resp.StatusCode)
		}
	}
	// Bob importing alice's id makes his own lesson, leaving hers alone.
	var bobs lesson
	if resp := bob.do(t, "POST", "/v1/lessons", `{"id":"`+a.ID+`","text":"mine","scope":"task"}`, &bobs); resp.StatusCode != 201 || bobs.ID == a.ID {
		t.Errorf("bob's post with alice's id: %d %+v", resp.StatusCode, bobs)
	}

	if resp := ts.do(t, "DELETE", "/v1/lessons/"+a.ID, "", nil); resp.StatusCode != 204 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	if resp := ts.do(t, "GET", "/v1/lessons/"+a.ID, "", nil); resp.StatusCode != 404 {
		t.Errorf("get after delete: %d", resp.StatusCode)
	}
	if resp := (&testServer{Server: ts.Server}).do(t, "GET", "/v1/lessons", "", nil); resp.StatusCode != 401 {
		t.Errorf("no token: %d", resp.StatusCode)
	}

	off := newTestServer(t, session.ManagerOptions{}, Options{})
	if resp := off.do(t, "GET", "/v1/lessons", "", nil); resp.StatusCode != 501 {
		t.Errorf("without lessons: %d", resp.StatusCode)
	}
}
