package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

func TestLessonsCLI(t *testing.T) {
	data := t.TempDir()
	// A run that fixes an error learns a lesson; with --no-lessons the same
	// run learns nothing and makes no distilling call (the script has no
	// turn for one).
	fail, fix := `{"code":"import numpy as np\nx = np.array([1, 2], dtype=np.float)\nx.sum()"}`, `{"code":"import numpy as np\nx = np.array([1, 2], dtype=float)\nx.sum()"}`
	lesson := "numpy here is 1.24: np.float is gone, write float or np.float64"
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", fail)},
		{ToolCalls: tc("execute_python", fix)},
		{ToolCalls: tc("finish", `{"summary":"summed"}`)},
		{Text: `{"lessons":[{"item":1,"text":"` + lesson + ` (API_KEY=sk-abcdefghijklmnop1234)"}]}`},
	})
	code, stdout, stderr := sandloop(t, "", "agent", "sum an array of floats with numpy", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "lesson learned: "+lesson) {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if strings.Contains(stdout, "sk-abcdefghijklmnop1234") {
		t.Error("a secret reached a lesson")
	}
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", fail)},
		{ToolCalls: tc("execute_python", fix)},
		{ToolCalls: tc("finish", `{"summary":"summed"}`)},
	})
	code, stdout, stderr = sandloop(t, "", "agent", "sum an array of floats with numpy", "--data-dir", data, "--no-lessons")
	if code != 0 || strings.Contains(stdout, "lesson") {
		t.Fatalf("--no-lessons: exit %d\n%s\n%s", code, stdout, stderr)
	}

	code, stdout, _ = sandloop(t, "", "lessons", "ls", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "global") || !strings.Contains(stdout, "numpy here is 1.24") || strings.Count(stdout, "\n") != 2 {
		t.Fatalf("ls: %d\n%s", code, stdout)
	}
	id := strings.Fields(strings.Split(stdout, "\n")[1])[0]
	code, stdout, _ = sandloop(t, "", "lessons", "show", id[:6], "--data-dir", data)
	for _, want := range []string{"lesson " + id, "from model", "error:      AttributeError: module <q> has no attribute <q>", "names:      numpy float", "packages:   numpy", "step 1", "shown 0, helped 0", "+x = np.array([1, 2], dtype=float)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, stdout)
		}
	}

	code, stdout, stderr = sandloop(t, "", "lessons", "add", "sales.csv's date column is day", "--file", "sales.csv", "--error", "KeyError: 'date'", "--data-dir", data)
	if code != 0 {
		t.Fatalf("add: %d %s", code, stderr)
	}
	added := strings.TrimSpace(stdout)
	code, stdout, _ = sandloop(t, "", "lessons", "show", added, "--data-dir", data)
	if !strings.Contains(stdout, "· files · from user") || !strings.Contains(stdout, "error:      KeyError: <q>") || !strings.Contains(stdout, "files:      sales.csv") {
		t.Errorf("added lesson:\n%s", stdout)
	}
	if code, _, stderr := sandloop(t, "", "lessons", "add", "x", "--scope", "files", "--data-dir", data); code != 2 || !strings.Contains(stderr, "names the files") {
		t.Errorf("bad add: %d %s", code, stderr)
	}
	if code, stdout, _ := sandloop(t, "", "lessons", "ls", "-q", "date column", "--data-dir", data); code != 0 || !strings.Contains(stdout, added) || strings.Contains(stdout, id) {
		t.Errorf("ls -q: %d\n%s", code, stdout)
	}

	export := filepath.Join(t.TempDir(), "lessons.json")
	if code, _, stderr := sandloop(t, "", "lessons", "export", "-o", export, "--data-dir", data); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	b, _ := os.ReadFile(export)
	var e struct {
		Lessons []struct{ ID, Text string }
	}
	if err := json.Unmarshal(b, &e); err != nil || len(e.Lessons) != 2 {
		t.Fatalf("export: %v\n%s", err, b)
	}
	other := t.TempDir()
	if code, _, stderr := sandloop(t, "", "lessons", "import", export, "--data-dir", other); code != 0 || !strings.Contains(stderr, "2 lesson(s) imported") {
		t.Fatalf("import: %d %s", code, stderr)
	}
	if code, stdout, _ := sandloop(t, "", "lessons", "show", id, "--data-dir", other); code != 0 || !strings.Contains(stdout, "numpy here is 1.24") {
		t.Errorf("imported lesson: %d\n%s", code, stdout)
	}
	if code, _, stderr := sandloop(t, `{"lessons":[{"text":""}]}`, "lessons", "import", "-", "--data-dir", other); code != 2 || !strings.Contains(stderr, "lessons[0].text") {
		t.Errorf("bad import: %d %s", code, stderr)
	}

	if code, _, _ := sandloop(t, "", "lessons", "rm", id, added, "--data-dir", data); code != 0 {
		t.Fatal("rm failed")
	}
	if code, _, stderr := sandloop(t, "", "lessons", "show", id, "--data-dir", data); code != 2 || !strings.Contains(stderr, "no lesson") {
		t.Errorf("show after rm: %d %s", code, stderr)
	}
}
