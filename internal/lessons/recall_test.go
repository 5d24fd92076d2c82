package lessons_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/jail/jailtest"
	"github.com/sandloop/sandloop/internal/lessons"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

func TestMain(m *testing.M) { jailtest.Main(m) }

func openStore(t testing.TB) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newSession(t testing.TB) *session.Session {
	t.Helper()
	s, err := session.New(context.Background(), &session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func provider(srv *llmtest.Server) llm.Provider {
	return llm.NewOpenAI(&llm.OpenAIOptions{BaseURL: srv.URL, APIKey: "test", Model: "gpt-4o-mini", Retry: llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}})
}

func py(code string) []llmtest.ToolCall {
	b, _ := json.Marshal(map[string]string{"code": code})
	return []llmtest.ToolCall{{Name: agent.ToolExecutePython, Arguments: string(b)}}
}

func finish(summary string) []llmtest.ToolCall {
	return []llmtest.ToolCall{{Name: agent.ToolFinish, Arguments: `{"summary":"` + summary + `"}`}}
}

const (
	// DataFrame.map is new in pandas 2.1; this sandbox has 1.5.3.
	mapCode = "import pandas as pd\na = pd.DataFrame({'x': [1, 2]})\nc = a.map(str)\nc.x.tolist()"
	fixCode = "import pandas as pd\na = pd.DataFrame({'x': [1, 2]})\nc = a.applymap(str)\nc.x.tolist()"
	mapText = "pandas here is 1.5.3: DataFrame.map does not exist, use DataFrame.applymap for element-wise functions"
)

type collected struct{ ev []agent.Event }

func (c *collected) add(e agent.Event) { c.ev = append(c.ev, e) }
func (c *collected) lessons(kind string) []agent.LessonRef {
	var out []agent.LessonRef
	for _, e := range c.ev {
		if e.Type == agent.EventLessons && e.Text == kind {
			out = append(out, e.Lessons...)
		}
	}
	return out
}

func run(t *testing.T, st *store.Store, owner, task string, p llm.Provider) (*agent.Report, *collected) {
	t.Helper()
	ev := &collected{}
	rep, err := agent.Run(context.Background(), &agent.Options{
		Task: task, Provider: p, Session: newSession(t), OnEvent: ev.add,
		Lessons: lessons.NewRun(&lessons.Options{Store: st, Owner: owner, RunID: "run-" + owner}),
	})

	if err != nil {
		t.Fatal(err)
	}
	return rep, ev
}

// A run that fixes an error teaches a lesson (through the model's
// distilling call, counted in its usage); the next run on a similar task
// is shown it at the start and makes no mistake; a run that makes the
// mistake anyway is told "seen before" in the failing tool result.
func TestLearnRecallAndSeenBefore(t *testing.T) {
	st := openStore(t)
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py(mapCode)},
		{ToolCalls: py(fixCode)},
		{ToolCalls: finish("stacked the frames")},
		{Text: "```json\n{\"lessons\":[{\"item\":1,\"text\":\"" + mapText + "\"}]}\n```", Usage: llmtest.Usage{InputTokens: 7000, OutputTokens: 50}},
	})
	rep, _ := run(t, st, "alice", "turn every cell of the pandas frame into text", provider(srv))
	if rep.Status != agent.StatusDone || len(rep.LessonsLearned) != 1 || rep.LessonsLearned[0].Text != mapText {
		t.Fatalf("run A: %s, learned %+v", rep.Status, rep.LessonsLearned)
	}
	if rep.Usage.InputTokens != 3*100+7000 {
		t.Errorf("the distilling call is not in the run's usage: %+v", rep.Usage)
	}
	distilReq := srv.Requests()[3]
	if !strings.Contains(distilReq.System(), "lessons") || !strings.Contains(string(distilReq.Body), "a.applymap(str)") {
		t.Errorf("the distilling call lacks the fix:\n%s", distilReq.Body)
	}
	learned, err := st.GetLesson(context.Background(), "alice", rep.LessonsLearned[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if learned.Scope != "global" || learned.Source != "model" || learned.Signature != "AttributeError: <q> object has no attribute <q>" || learned.Detail != "DataFrame map" || learned.RunID != "run-alice" || learned.Step != 1 || !strings.Contains(learned.Fix, "+c = a.applymap(str)") {
		t.Errorf("stored lesson: %+v", learned)
	}

	// Run B: a different task on frames; the lesson is in the system prompt.
	srv = llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py(fixCode)},
		{ToolCalls: finish("done")},
	})
	rep, ev := run(t, st, "alice", "format each cell of a pandas frame as text", provider(srv))
	if sys := srv.Requests()[0].System(); !strings.Contains(sys, "Lessons from earlier runs") || !strings.Contains(sys, mapText) {
		t.Errorf("the lesson is not in the system prompt:\n%s", sys)
	}
	if got := ev.lessons("start"); len(got) != 1 || got[0].ID != learned.ID {
		t.Errorf("start lessons event: %+v", got)
	}
	if rep.Status != agent.StatusDone || len(rep.LessonsUsed) != 1 || len(rep.LessonsLearned) != 0 {
		t.Errorf("run B: %s used %+v learned %+v", rep.Status, rep.LessonsUsed, rep.LessonsLearned)
	}
	if l, _ := st.GetLesson(context.Background(), "alice", learned.ID); l.Shown != 1 || l.Helped != 1 || l.Recurred != 0 || l.LastUsedAt.IsZero() {
		t.Errorf("counts after a helpful run: %+v", l)
	}

	// Run C: an unrelated task (no recall at start) makes the mistake; the
	// failing result says "seen before", the model fixes it in one step.
	srv = llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py(mapCode)},
		{ToolCalls: py(fixCode)},
		{ToolCalls: finish("done")},
	})
	rep, ev = run(t, st, "alice", "count words in a sentence", provider(srv))
	if sys := srv.Requests()[0].System(); strings.Contains(sys, mapText) {
		t.Errorf("an unrelated task was shown the lesson at the start")
	}
	res := srv.Requests()[1].ToolResults()
	if len(res) != 1 || !strings.Contains(res[0].Text, "AttributeError") || !strings.HasSuffix(res[0].Text, "seen before: "+mapText) {
		t.Errorf("the failing result lacks the lesson: %+v", res)
	}
	if got := ev.lessons("seen_before"); len(got) != 1 || got[0].ID != learned.ID {
		t.Errorf("seen_before event: %+v", got)
	}
	// The error it prevents did not come back after the note: it helped; a
	// known lesson that held is not learned again (no distilling call: the
	// script has no turn for one).
	if l, _ := st.GetLesson(context.Background(), "alice", learned.ID); l.Shown != 2 || l.Helped != 2 {
		t.Errorf("counts after seen before: %+v", l)
	}
	if rep.Status != agent.StatusDone || len(rep.LessonsLearned) != 0 {
		t.Errorf("run C: %s learned %+v", rep.Status, rep.LessonsLearned)
	}

	// Another owner sees none of it.
	srv = llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py(mapCode)},
		{ToolCalls: py(fixCode)},
		{ToolCalls: finish("done")},
		{Text: `{"lessons":[]}`},
	})
	run(t, st, "bob", "format each cell of a pandas frame as text", provider(srv))
	if strings.Contains(string(srv.Requests()[0].Body), mapText) || strings.Contains(string(srv.Requests()[1].Body), "seen before") {
		t.Error("bob was shown alice's lesson")
	}
	if _, err := st.GetLesson(context.Background(), "bob", learned.ID); err == nil {
		t.Error("bob can read alice's lesson")
	}
}

// When the distilling call fails, or its answer is unusable (the
// signature's placeholders, issue 31.5), the lesson is written without the
// model: the error's signature and the fix, and no secret of the code gets in.
func TestDistilFallback(t *testing.T) {
	bad := "d = {'day': 1}\nprint('sk-live-0123456789abcdefghij', d['date'])"
	good := "d = {'day': 1}\nprint('sk-live-0123456789abcdefghij', d['day'])"
	for name, answer := range map[string]llmtest.Turn{
		"failed":      {Status: 400, Error: "context too long"},
		"placeholder": {Text: `{"lessons":[{"item":1,"text":"To avoid KeyError: <q>, use <q>"}]}`},
	} {
		st := openStore(t)
		srv := llmtest.NewOpenAIServer(t, llmtest.Script{
			{ToolCalls: py(bad)},
			{ToolCalls: py(good)},
			{ToolCalls: finish("read the day")},
			answer,
		})
		rep, _ := run(t, st, "", "read the day field", provider(srv))
		if len(srv.Requests()) != 4 {
			t.Fatalf("%s: no distilling call was made: %d requests", name, len(srv.Requests()))
		}
		if len(rep.LessonsLearned) != 1 {
			t.Fatalf("%s: learned %+v", name, rep.LessonsLearned)
		}
		l, err := st.GetLesson(context.Background(), "", rep.LessonsLearned[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		// Readable on its own: the error as Python said it and a compact
		// before/after, no placeholders of the signature.
		if l.Source != "fallback" || l.Text != "KeyError: 'date': write `d['day']` instead of `d['date']`." || !strings.Contains(l.Fix, "+print('<redacted>', d['day'])") {
			t.Errorf("%s: fallback lesson: %+v", name, l)
		}
		if strings.Contains(string(srv.Requests()[3].Body), "sk-live-0123456789abcdefghij") {
			t.Errorf("%s: the distilling call carried the secret", name)
		}
		all, _ := json.Marshal(l)
		if strings.Contains(string(all), "sk-live-0123456789abcdefghij") {
			t.Errorf("%s: a secret got into the lesson: %s", name, all)
		}
	}
}

// Once the run's budget is spent, no distilling call is made: the fallback
// writes the lesson (the script has no turn for a fourth request).
func TestNoDistilWhenBudgetSpent(t *testing.T) {
	st := openStore(t)
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py(mapCode)},
		{ToolCalls: py(fixCode)},
		{ToolCalls: finish("done")},
	})
	rep, err := agent.Run(context.Background(), &agent.Options{
		Task: "format cells", Provider: provider(srv), Session: newSession(t), MaxTokens: 250,
		Lessons: lessons.NewRun(&lessons.Options{Store: st}),
	})

	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != agent.StatusBudgetExceeded || len(srv.Requests()) != 3 || len(rep.LessonsLearned) != 1 || rep.Usage.InputTokens != 300 {
		t.Fatalf("%s, %d requests, learned %+v, usage %+v", rep.Status, len(srv.Requests()), rep.LessonsLearned, rep.Usage)
	}
	if l, _ := st.GetLesson(context.Background(), "", rep.LessonsLearned[0].ID); l == nil || l.Source != "fallback" {
		t.Errorf("lesson %+v", l)
	}
}

// Recall needs the task's own words (the mode every run has is not one),
// and a lesson shown counts as helped, and is reported used, only when the
// run did what it says; merely shown, it is only shown.
func TestRecallNeedsRelevanceAndHelpedNeedsUse(t *testing.T) {
	st := openStore(t)
	const text = "numpy here is 1.24: np.float is gone, write float or np.float64"
	stored, err := st.PutLesson(context.Background(), store.Lesson{
		Scope: "global", Text: text, Source: "model",
		Signature: "AttributeError: module <q> has no attribute <q>", Detail: "numpy float",
		// As lessons learned before were stored: the mode among the keywords.
		Keywords: "generate normalize portfolio weights numpy sum one", Packages: "numpy",
		Fix: "-w = np.array([2, 3, 5]).astype(np.float)\n+w = np.array([2, 3, 5]).astype(float)",
	})
	if err != nil {
		t.Fatal(err)
	}
	counts := func() *store.Lesson {
		l, err := st.GetLesson(context.Background(), "", stored.ID)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// An unrelated task sharing one word and the mode: not recalled.
	srv := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py("ps = [n for n in range(2, 600) if all(n % d for d in range(2, n))][:100]\nsum(ps)")},
		{ToolCalls: finish("24133")},
	})
	rep, ev := run(t, st, "", "sum the first 100 primes", provider(srv))
	if sys := srv.Requests()[0].System(); strings.Contains(sys, text) || len(ev.lessons("start")) != 0 || len(rep.LessonsShown) != 0 {
		t.Errorf("an unrelated task was shown the lesson:\n%s", sys)
	}

	// A related task whose run never touches numpy: shown, not helped, not used.
	srv = llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py("w = [2, 3, 5]\n[x / sum(w) for x in w]")},
		{ToolCalls: finish("normalized")},
	})
	rep, _ = run(t, st, "", "normalize the portfolio weights in plain lists", provider(srv))
	if !strings.Contains(srv.Requests()[0].System(), text) || len(rep.LessonsShown) != 1 {
		t.Fatalf("the related task was not shown the lesson: %+v", rep.LessonsShown)
	}
	if len(rep.LessonsUsed) != 0 {
		t.Errorf("a lesson merely shown is reported used: %+v", rep.LessonsUsed)
	}
	if l := counts(); l.Shown != 1 || l.Helped != 0 {
		t.Errorf("counts after a run that did not need it: shown %d helped %d", l.Shown, l.Helped)
	}

	// A run that does what it says: used, helped.
	srv = llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: py("import numpy as np\nw = np.array([2, 3, 5]).astype(float)\nw / w.sum()")},
		{ToolCalls: finish("normalized")},
	})
	rep, _ = run(t, st, "", "normalize the portfolio weights with numpy", provider(srv))
	if len(rep.LessonsUsed) != 1 || rep.LessonsUsed[0].ID != stored.ID {
		t.Errorf("a lesson followed is not reported used: %+v", rep.LessonsUsed)
	}
	if l := counts(); l.Shown != 2 || l.Helped != 1 {
		t.Errorf("counts after a run that followed it: shown %d helped %d", l.Shown, l.Helped)
	}
}
