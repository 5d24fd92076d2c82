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
	fail, fix := `{"code":"import numpy as np\nx = np.array([1, 2], dtype=np.float); key = 'sk-abcdefghijklmnop1234'\nx.sum()"}`, `{"code":"import numpy as np\nx = np.array([1, 2], dtype=float); key = 'sk-abcdefghijklmnop1234'\nx.sum()"}`
	lesson := "numpy here is 1.24: np.float is gone, write float or np.float64"
	srvA := useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", fail)},
		{ToolCalls: tc("execute_python", fix)},
		{ToolCalls: tc("finish", `{"summary":"summed"}`)},
		{Text: `{"lessons":[{"item":1,"text":"` + lesson + `"}]}`},
	})
	code, stdout, stderr := sandloop(t, "", "agent", "sum an array of floats with numpy", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "lesson learned: "+lesson) {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if body := string(srvA.Requests()[3].Body); !strings.Contains(body, "dtype=float") || strings.Contains(body, "sk-abcdefghijklmnop1234") {
		t.Errorf("the distilling call lacks the fix or carries the secret:\n%s", body)
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

	// Run B, another task that would hit the same error: the lesson is in
	// the system prompt, and this model (like a real one) then writes the
	// right code at once.
	srv := llmtest.NewOpenAIServerFunc(t, func(req llmtest.Request) llmtest.Turn {
		switch {
		case len(req.ToolResults()) > 0:
			return llmtest.Turn{ToolCalls: tc("finish", `{"summary":"the weights sum to 1"}`)}
		case strings.Contains(req.System(), "np.float is gone"):
			return llmtest.Turn{Text: "numpy 1.24 has no np.float, so I'll use float.", ToolCalls: tc("execute_python", `{"code":"import numpy as np\nw = np.array([2, 3, 5]).astype(float)\nw / w.sum()"}`)}
		}
		return llmtest.Turn{ToolCalls: tc("execute_python", `{"code":"import numpy as np\nw = np.array([2, 3, 5]).astype(np.float)\nw / w.sum()"}`)}
	})
	t.Setenv("OPENAI_BASE_URL", srv.URL)
	code, stdout, stderr = sandloop(t, "", "agent", "normalize the portfolio weights with numpy so they sum to one", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "lessons recalled: "+lesson) || !strings.Contains(stdout, "lesson used: "+lesson) || !strings.Contains(stdout, "done after 2 steps") || strings.Contains(stdout, "AttributeError") {
		t.Fatalf("run B: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("run B:\n%s", stdout)

	code, stdout, _ = sandloop(t, "", "lessons", "ls", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "global") || !strings.Contains(stdout, "numpy here is 1.24") || strings.Count(stdout, "\n") != 2 {
		t.Fatalf("ls: %d\n%s", code, stdout)
	}
	id := strings.Fields(strings.Split(stdout, "\n")[1])[0]
	code, stdout, _ = sandloop(t, "", "lessons", "show", id[:6], "--data-dir", data)
	for _, want := range []string{"lesson " + id, "from model", "error:      AttributeError: module <q> has no attribute <q>", "names:      numpy float", "packages:   numpy", "step 1", "shown 1, helped 1", "+x = np.array([1, 2], dtype=float); key = '<redacted>'"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "sk-abcdefghijklmnop1234") {
		t.Errorf("a secret of the code reached the lesson:\n%s", stdout)
	}

	// Run C, a related task that does without numpy: the lesson is shown,
	// and the footer says so, not that it was used. Run D, an unrelated task
	// sharing a word: no lesson at all (issue 31.4).
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"xs = [1.5, 2.5]\nsum(xs)"}`)},
		{ToolCalls: tc("finish", `{"summary":"summed"}`)},
	})
	code, stdout, stderr = sandloop(t, "", "agent", "sum an array of floats in plain Python", "--data-dir", data)
	if code != 0 || !strings.Contains(stdout, "lessons recalled: "+lesson) || !strings.Contains(stdout, "lesson shown: "+lesson) || strings.Contains(stdout, "lesson used:") {
		t.Errorf("run C: exit %d\n%s\n%s", code, stdout, stderr)
	}
	srvD := useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"ps = [n for n in range(2, 600) if all(n % d for d in range(2, n))][:100]\nsum(ps)"}`)},
		{ToolCalls: tc("finish", `{"summary":"24133"}`)},
	})
	code, stdout, stderr = sandloop(t, "", "agent", "sum the first 100 primes", "--data-dir", data)
	if code != 0 || strings.Contains(stdout, "lesson") || strings.Contains(srvD.Requests()[0].System(), "np.float") {
		t.Errorf("run D, unrelated: exit %d\n%s\n%s", code, stdout, stderr)
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
