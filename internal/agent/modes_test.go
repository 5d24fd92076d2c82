package agent

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

func args(kv map[string]any) string {
	b, _ := json.Marshal(kv)
	return string(b)
}

const slowStats = `import sys

def compute(numbers):
    total = 0
    for n in numbers:
        total = total + n
    count = 0
    for n in numbers:
        count = count + 1
    mean = total / count
    squares = []
    for n in numbers:
        squares.append((n - mean) * (n - mean))
    var_total = 0
    for s in squares:
        var_total = var_total + s
    return total, mean, var_total / count

data = list(range(1, 200001))
t, m, v = compute(data)
print("total", t)
print("mean", m)
print("variance", v)
`

const cleanWrong = `import statistics

data = range(1, 200001)
print("total", sum(data))
print("mean", statistics.fmean(data))
print("variance", statistics.variance(data))
`

const cleanRight = `def describe(numbers):
    n = len(numbers)
    total = sum(numbers)
    mean = total / n
    return total, mean, sum((x - mean) ** 2 for x in numbers) / n


total, mean, variance = describe(list(range(1, 200001)))
print("total", total)
print("mean", mean)
print("variance", variance)
`

func TestRefactorCatchesChangedBehaviour(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, args(map[string]any{"path": "stats.py", "content": cleanWrong}))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"used statistics"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, args(map[string]any{"path": "stats.py", "content": cleanRight}))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"one function, generator expressions"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Task: "clean this up", Mode: ModeRefactor, Provider: p, Session: newSession(t),
		Files: map[string][]byte{"stats.py": []byte(slowStats)}})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone {
		t.Fatalf("report %+v", rep)
	}
	first := string(srv.Requests()[0].Body)
	if !strings.Contains(first, "variance 3333333333.25") || !strings.Contains(first, "peak") {
		t.Errorf("baseline not shown to the model")
	}
	refused := srv.Requests()[2].ToolResults()
	if msg := refused[len(refused)-1].Text; !strings.Contains(msg, "prints something different") || !strings.Contains(msg, "-variance 3333333333.25") {
		t.Errorf("changed behaviour not fed back: %q", msg)
	}
	m := rep.Refactor
	if m == nil || len(m.Before) != 1 || len(m.After) != 1 {
		t.Fatalf("metrics %+v", m)
	}
	b, a := m.Before[0], m.After[0]
	if b.Stdout != a.Stdout || b.WallMS <= 0 || a.WallMS <= 0 || b.PeakRSSKiB < 1000 || a.PeakRSSKiB < 1000 {
		t.Errorf("before %+v after %+v", b, a)
	}
	if m.LOCBefore <= m.LOCAfter || m.LOCAfter == 0 {
		t.Errorf("lines of code %d -> %d", m.LOCBefore, m.LOCAfter)
	}
	t.Logf("before: %.1f ms, %d KiB, %d lines; after: %.1f ms, %d KiB, %d lines", b.WallMS, b.PeakRSSKiB, m.LOCBefore, a.WallMS, a.PeakRSSKiB, m.LOCAfter)
}

func TestRefactorWithTests(t *testing.T) {
	p, _ := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, args(map[string]any{"path": "mathx.py", "content": "def add(a, b):\n    return a - b\n"}))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"simplified"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolWriteFile, args(map[string]any{"path": "mathx.py", "content": "def add(a, b):\n    return a + b\n"}))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"simplified"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Task: "tidy", Mode: ModeRefactor, Provider: p, Session: newSession(t), Files: map[string][]byte{
		"mathx.py":      []byte("def add(a, b):\n    result = a\n    result = result + b\n    return result\n"),
		"test_mathx.py": []byte("from mathx import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
	}})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone || rep.Steps != 4 || rep.Refactor.TestsBefore == nil || !rep.Refactor.TestsBefore.Passed || !rep.Refactor.TestsAfter.Passed {
		t.Errorf("report %+v metrics %+v", rep, rep.Refactor)
	}
}

const flaskApp = `from flask import Flask, jsonify, request

app = Flask(__name__)
NOTES = {}


@app.get("/notes")
def list_notes():
    return jsonify(sorted(NOTES.values(), key=lambda n: n["id"]))


@app.post("/notes")
def add_note():
    note = {"id": len(NOTES) + 1, "text": request.get_json()["text"]}
    NOTES[note["id"]] = note
    return jsonify(note), 201


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=5000)
`

const flaskTests = `from app import app


def test_add_and_list():
    c = app.test_client()
    r = c.post("/notes", json={"text": "hello"})
    assert r.status_code == 201
    assert c.get("/notes").get_json() == [{"id": 1, "text": "hello"}]
`

// AppScript is the model's side of building the notes API; shared with
// the runs package's export test.
func appScript() llmtest.Script {
	return llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{
			call(ToolWriteFile, args(map[string]any{"path": "app.py", "content": flaskApp})),
			call(ToolWriteFile, args(map[string]any{"path": "test_app.py", "content": flaskTests})),
			call(ToolInstallPackages, `{"names":["flask"]}`),
		}},
		{ToolCalls: []llmtest.ToolCall{call(ToolStartProcess, `{"name":"server","command":"python3 app.py"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("import requests, time\nfor _ in range(50):\n    try:\n        r = requests.post('http://127.0.0.1:5000/notes', json={'text': 'hi'}); break\n    except requests.ConnectionError:\n        time.sleep(0.1)\nprint(r.status_code, r.json())\nr = requests.get('http://127.0.0.1:5000/notes')\nprint(r.status_code, r.headers['Content-Type'], r.json())"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolRunShell, `{"command":"python3 -m pytest -q"}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"notes API"}`)}},
		{ToolCalls: []llmtest.ToolCall{
			call(ToolWriteFile, args(map[string]any{"path": "requirements.txt", "content": "flask\n"})),
			call(ToolWriteFile, args(map[string]any{"path": "README.md", "content": "# Notes API\n\nRun: python3 app.py\nTest: python3 -m pytest -q\n"})),
			call(ToolStopProcess, `{"name":"server"}`),
		}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"a Flask notes API with tests, requirements and README"}`)}},
	}
}

func TestAppModeServerTestsAndChecks(t *testing.T) {
	p, srv := newProvider(t, openAI, appScript())
	rep, err := Run(context.Background(), &Options{Task: "a Flask REST API for notes, with tests", Mode: ModeApp, Provider: p, Session: newSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != StatusDone || rep.Tests == nil || !rep.Tests.Passed {
		t.Fatalf("report %+v tests %+v", rep, rep.Tests)
	}
	res := srv.Requests()[1].ToolResults()
	if !strings.Contains(res[2].Text, "flask: already installed") {
		t.Errorf("install_packages: %q", res[2].Text)
	}
	res = srv.Requests()[2].ToolResults()
	if !strings.Contains(res[len(res)-1].Text, `process "server"`) || !strings.Contains(res[len(res)-1].Text, "running") {
		t.Errorf("start_process: %q", res[len(res)-1].Text)
	}
	res = srv.Requests()[3].ToolResults()
	if out := res[len(res)-1].Text; !strings.Contains(out, "201 {'id': 1, 'text': 'hi'}") || !strings.Contains(out, "200 application/json [{'id': 1, 'text': 'hi'}]") {
		t.Errorf("HTTP check from inside: %q", out)
	}
	res = srv.Requests()[5].ToolResults()
	if !strings.Contains(res[len(res)-1].Text, "write requirements.txt and README.md first") {
		t.Errorf("finish without README: %q", res[len(res)-1].Text)
	}
	for _, f := range []string{"app.py", "test_app.py", "requirements.txt", "README.md"} {
		if !contains(rep.Files, f) {
			t.Errorf("final files %v lack %s", rep.Files, f)
		}
	}
}

func TestInstallPackagesWithoutNetwork(t *testing.T) {
	p, srv := newProvider(t, openAI, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{call(ToolInstallPackages, `{"names":["numpy","pandas>=1.0","leftpad-nonexistent"]}`)}},
		{ToolCalls: []llmtest.ToolCall{call(ToolExecutePython, pyArgs("print('fallback')"))}},
		{ToolCalls: []llmtest.ToolCall{call(ToolFinish, `{"summary":"ok"}`)}},
	})
	rep, err := Run(context.Background(), &Options{Task: "t", Provider: p, Session: newSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	res := srv.Requests()[1].ToolResults()[0]
	for _, want := range []string{"numpy: already installed (version", "pandas>=1.0: already installed", "leftpad-nonexistent: NOT installed", "no network access", "Use what is installed"} {
		if !strings.Contains(res.Text, want) {
			t.Errorf("install_packages result lacks %q: %q", want, res.Text)
		}
	}
	if rep.Status != StatusDone {
		t.Errorf("report %+v", rep)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
