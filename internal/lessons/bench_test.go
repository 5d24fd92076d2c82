package lessons_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/lessons"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/store"
)

// pair is a benchmark case: run A makes a mistake and fixes it; run B is a
// different task that walks into the same mistake unless it was told.
type pair struct {
	name  string
	files map[string]string
	// hint is what the model must have been shown to avoid the mistake:
	// a phrase of the lesson the model writes when distilling (lesson).
	hint, lesson string
	// errMatch finds this pair's error in a distilling request.
	errMatch string
	a, b     runScript
	// more are other tasks that would hit the same mistake, for measuring
	// recall alone.
	more []string
}

// runScript is one run's task and the code the scripted model writes.
type runScript struct {
	task                 string
	mistake, look, fixed string
}

var pairs = []pair{{
	name: "pandas-map", hint: "applymap", errMatch: "has no attribute 'map'",
	lesson: "pandas here is 1.5.3: DataFrame.map does not exist; use DataFrame.applymap for element-wise functions",
	a: runScript{
		task:    "turn every value of the scores table into text",
		mistake: "import pandas as pd\nscores = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\ntext = scores.map(str)\ntext",
		look:    "import pandas as pd\npd.__version__",
		fixed:   "import pandas as pd\nscores = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\ntext = scores.applymap(str)\ntext",
	},
	b: runScript{
		task:    "round every cell of the prices table (a pandas DataFrame) to one decimal, as strings",
		mistake: "import pandas as pd\nprices = pd.DataFrame({'x': [1.23, 4.56], 'y': [7.891, 0.12]})\nout = prices.map(lambda v: f'{v:.1f}')\nout",
		look:    "import pandas as pd\npd.__version__",
		fixed:   "import pandas as pd\nprices = pd.DataFrame({'x': [1.23, 4.56], 'y': [7.891, 0.12]})\nout = prices.applymap(lambda v: f'{v:.1f}')\nout",
	},
	more: []string{"apply a formatting function to each element of a pandas DataFrame", "convert all cells of the inventory DataFrame to upper-case strings with pandas"},
}, {
	name: "numpy-float", hint: "np.float is gone", errMatch: "has no attribute 'float'",
	lesson: "numpy here is 1.24: np.float is gone; write float or np.float64",
	a: runScript{
		task:    "compute the mean of the sensor readings as floats with numpy",
		mistake: "import numpy as np\nreadings = np.array([3, 4, 5], dtype=np.float)\nreadings.mean()",
		look:    "import numpy as np\nnp.__version__",
		fixed:   "import numpy as np\nreadings = np.array([3, 4, 5], dtype=float)\nreadings.mean()",
	},
	b: runScript{
		task:    "normalize the vector of portfolio weights so they sum to one, using numpy",
		mistake: "import numpy as np\nw = np.array([2, 3, 5]).astype(np.float)\nw / w.sum()",
		look:    "import numpy as np\nnp.__version__",
		fixed:   "import numpy as np\nw = np.array([2, 3, 5]).astype(float)\nw / w.sum()",
	},
	more: []string{"cast the numpy array of prices to float and compute the standard deviation", "build a numpy float matrix of zeros and fill the diagonal"},
}, {
	name: "seaborn", hint: "seaborn is not installed", errMatch: "No module named 'seaborn'",
	lesson: "seaborn is not installed in this sandbox: plot with matplotlib (plt.hist, plt.imshow, plt.bar)",
	a: runScript{
		task:    "plot a histogram of the heights of the students",
		mistake: "import seaborn as sns\nsns.histplot([160, 172, 181, 168])",
		look:    "import importlib.util\nprint(importlib.util.find_spec('seaborn'))",
		fixed:   "import matplotlib.pyplot as plt\nplt.hist([160, 172, 181, 168])\nplt.show()",
	},
	b: runScript{
		task:    "draw a heatmap of the correlation matrix of the measurements and plot it",
		mistake: "import seaborn as sns\nimport numpy as np\nsns.heatmap(np.corrcoef(np.random.rand(3, 10)))",
		look:    "import importlib.util\nprint(importlib.util.find_spec('seaborn'))",
		fixed:   "import matplotlib.pyplot as plt\nimport numpy as np\nplt.imshow(np.corrcoef(np.random.rand(3, 10)))\nplt.show()",
	},
	more: []string{"make a scatter plot of height against weight", "plot a bar chart of the counts per category"},
}, {
	name: "sales-columns", hint: "date column is called day", errMatch: "KeyError",
	files:  map[string]string{"sales.csv": "day,region,amount\n2024-01-01,north,10\n2024-01-02,south,20\n2024-01-02,north,5\n"},
	lesson: "sales.csv's date column is called day (there is no date column)",
	a: runScript{
		task:    "total the amounts per date in sales.csv",
		mistake: "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.groupby('date').amount.sum()",
		look:    "import pandas as pd\npd.read_csv('sales.csv').columns.tolist()",
		fixed:   "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.groupby('day').amount.sum()",
	},
	b: runScript{
		task:    "how many distinct days have sales in sales.csv?",
		mistake: "import pandas as pd\nsales = pd.read_csv('sales.csv')\nsales['date'].nunique()",
		look:    "import pandas as pd\npd.read_csv('sales.csv').columns.tolist()",
		fixed:   "import pandas as pd\nsales = pd.read_csv('sales.csv')\nsales['day'].nunique()",
	},
	more: []string{"find the best selling region per month in sales.csv", "plot the amount per day from sales.csv"},
}, {
	name: "no-network", hint: "never download", errMatch: "ConnectionError",
	files:  map[string]string{"rates.csv": "currency,rate\nusd,1.08\ngbp,0.86\n", "population.csv": "city,people\nOslo,700000\nBergen,290000\n"},
	lesson: "The sandbox has no network: never download data; read the input files in /workspace",
	a: runScript{
		task:    "fetch the current exchange rates and average them",
		mistake: "import requests\nrates = requests.get('http://rates.example.invalid/eur.json', timeout=5).json()\nsum(rates.values()) / len(rates)",
		look:    "import os\nsorted(os.listdir('.'))",
		fixed:   "import pandas as pd\nrates = pd.read_csv('rates.csv')\nrates.rate.mean()",
	},
	b: runScript{
		task:    "download the latest population figures and sum them",
		mistake: "import requests\npop = requests.get('http://stats.example.invalid/population.json', timeout=5).json()\nsum(pop.values())",
		look:    "import os\nsorted(os.listdir('.'))",
		fixed:   "import pandas as pd\npop = pd.read_csv('population.csv')\npop.people.sum()",
	},
	more: []string{"download the weather data for Oslo from the API and plot it", "fetch the exchange rates from the web and convert 100 EUR"},
}, {
	name: "read-csv-date-format", hint: "read_csv has no date_format", errMatch: "unexpected keyword argument 'date_format'",
	files:  map[string]string{"events.csv": "when,what\n01/02/2024,login\n15/03/2024,logout\n", "log.csv": "stamp,level\n03/01/2024,info\n28/02/2024,error\n"},
	lesson: "pandas here is 1.5.3: read_csv has no date_format; parse dates with pd.to_datetime(column, format=...)",
	a: runScript{
		task:    "parse the dates in events.csv and list the months",
		mistake: "import pandas as pd\nev = pd.read_csv('events.csv', parse_dates=['when'], date_format='%d/%m/%Y')\nev.when.dt.month.tolist()",
		look:    "import pandas as pd\npd.__version__",
		fixed:   "import pandas as pd\nev = pd.read_csv('events.csv')\nev['when'] = pd.to_datetime(ev.when, format='%d/%m/%Y')\nev.when.dt.month.tolist()",
	},
	b: runScript{
		task:    "count the log.csv entries per month, reading the stamp column as day/month/year dates",
		mistake: "import pandas as pd\nlog = pd.read_csv('log.csv', parse_dates=['stamp'], date_format='%d/%m/%Y')\nlog.stamp.dt.month.value_counts()",
		look:    "import pandas as pd\npd.__version__",
		fixed:   "import pandas as pd\nlog = pd.read_csv('log.csv')\nlog['stamp'] = pd.to_datetime(log.stamp, format='%d/%m/%Y')\nlog.stamp.dt.month.value_counts()",
	},
	more: []string{"read the log.csv dates (day/month/year) and find the busiest weekday", "parse the events.csv timestamps in day-first format"},
}}

// model is the scripted model of the benchmark. It behaves as a real one
// would: it writes the mistaken code unless the lesson (its hint) is in the
// system prompt or in a tool result it was shown; after an unexplained
// error it first looks at the sandbox (a version, the columns, the files),
// then fixes the code, then finishes. Asked to distil, it writes each
// pair's lesson. Token counts are the request's and reply's bytes / 4.
func model(req llmtest.Request) llmtest.Turn {
	sys := req.System()
	users := req.UserTexts()
	usage := func(out string) llmtest.Usage {
		return llmtest.Usage{InputTokens: len(req.Body)/4 + 1, OutputTokens: len(out)/4 + 10}
	}
	if strings.HasPrefix(sys, "You turn what a coding agent learned") && len(users) > 0 {
		type item struct {
			Item int    `json:"item"`
			Text string `json:"text"`
		}
		var items []item
		for _, part := range strings.Split(users[0], "\nItem ")[1:] {
			var n int
			fmt.Sscanf(part, "%d", &n)
			for _, p := range pairs {
				if strings.Contains(part, p.errMatch) {
					items = append(items, item{n, p.lesson})
					break
				}
			}
		}
		b, _ := json.Marshal(map[string]any{"lessons": items})
		return llmtest.Turn{Text: string(b), Usage: usage(string(b))}
	}
	var p *pair
	var rs runScript
	for i := range pairs {
		for _, r := range []runScript{pairs[i].a, pairs[i].b} {
			if len(users) > 0 && strings.Contains(users[0], "Task: "+r.task) {
				p, rs = &pairs[i], r
			}
		}
	}
	if p == nil {
		return llmtest.Turn{Text: "I do not know this task."}
	}
	results := req.ToolResults()
	known := strings.Contains(sys, p.hint)
	for _, r := range results {
		known = known || strings.Contains(r.Text, p.hint)
	}
	code := func(c string) llmtest.Turn {
		b, _ := json.Marshal(map[string]string{"code": c})
		return llmtest.Turn{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolExecutePython, Arguments: string(b)}}, Usage: usage(string(b))}
	}
	var last string // the code of the last call
	var calls []struct {
		Function struct{ Arguments string } `json:"function"`
	}
	var body struct {
		Messages []struct {
			ToolCalls json.RawMessage `json:"tool_calls"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(req.Body, &body)
	for _, m := range body.Messages {
		if len(m.ToolCalls) > 0 && json.Unmarshal(m.ToolCalls, &calls) == nil && len(calls) > 0 {
			var a struct{ Code string }
			_ = json.Unmarshal([]byte(calls[0].Function.Arguments), &a)
			last = a.Code
		}
	}
	switch {
	case len(results) == 0 && known, last == rs.look, last == rs.mistake && known:
		return code(rs.fixed)
	case len(results) == 0:
		return code(rs.mistake)
	case last == rs.mistake:
		return code(rs.look)
	case last == rs.fixed && !results[len(results)-1].IsError && !strings.Contains(results[len(results)-1].Text, "status: error"):
		out := `{"summary":"done and checked"}`
		return llmtest.Turn{ToolCalls: []llmtest.ToolCall{{Name: agent.ToolFinish, Arguments: out}}, Usage: usage(out)}
	}
	return llmtest.Turn{Text: "I am stuck.", Usage: usage("I am stuck.")}
}

// unrelated fills a store with n lessons about other libraries, files and
// errors, in the vocabulary real lessons use (pandas, csv, columns, plots
// included), so recall has to pick the right one among look-alikes.
func unrelated(t testing.TB, st *store.Store, owner string, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(17, 17))
	mods := strings.Fields("json csv re datetime collections itertools math statistics sqlite3 pathlib os subprocess flask requests PIL matplotlib numpy pandas pytest scipy openpyxl zipfile gzip hashlib random decimal fractions textwrap string time")
	funcs := strings.Fields("loads dumps reader writer sub findall strptime strftime Counter groupby chain sqrt mean median connect Path listdir run route post open show savefig array reshape merge pivot_table to_csv fixture approx load_workbook ZipFile compress sha256 choice quantize limit_denominator dedent ascii_letters sleep")
	words := strings.Fields("orders customers invoices inventory shipments weather temperatures tickets survey answers clicks sessions images thumbnails logs errors users accounts payments refunds products reviews ratings scores grades students employees salaries budgets expenses flights airports trains stations sensors devices emails messages tweets articles words sentences genes samples patients visits")
	kinds := strings.Fields("strings integers bytes dates timestamps lists dicts floats paths")
	errs := []string{"TypeError: <q> object is not subscriptable", "ValueError: could not convert string to float: <q>", "AttributeError: <q> object has no attribute <q>", "KeyError: <q>", "IndexError: list index out of range", "FileNotFoundError: [Errno <n>] No such file or directory: <q>", "ImportError: cannot import name <q> from <q> (<path>)", "UnicodeDecodeError: <q> codec can't decode byte <addr> in position <n>: invalid start byte"}
	pick := func(l []string) string { return l[r.IntN(len(l))] }
	for i := range n {
		m, f, w1, w2, k := pick(mods), pick(funcs), pick(words), pick(words), pick(kinds)
		file := fmt.Sprintf("%s_%d.csv", w1, i)
		var l store.Lesson
		switch i % 4 {
		case 0:
			l = store.Lesson{Scope: "global", Text: fmt.Sprintf("%s.%s wants %s here; convert the %s first", m, f, k, w2)}
		case 1:
			l = store.Lesson{Scope: "files", Text: fmt.Sprintf("%s's %s column holds %s; parse it before grouping", file, w2, k), Files: lessons.FileKey(file, []byte(file))}
		case 2:
			l = store.Lesson{Scope: "task", Text: fmt.Sprintf("when summarising %s by %s, call %s.%s on %s, not on the whole table", w1, w2, m, f, k)}
		default:
			l = store.Lesson{Scope: "global", Text: fmt.Sprintf("%s is older here: %s takes %s, not a list of %s", m, f, k, w2)}
		}
		l.Owner, l.Source = owner, "model"
		l.Signature = pick(errs)
		l.Detail = f
		l.Keywords = strings.Join([]string{w1, w2, pick(words), m}, " ")
		l.Packages = m
		if _, err := st.PutLesson(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
}

// outcome of one run B.
type outcome struct {
	steps    int
	tokens   int64
	repeated bool // the pair's error happened
	system   int  // bytes of the system prompt
	recalled bool // the pair's lesson was among those shown at the start
	shown    int
}

func runPair(t testing.TB, st *store.Store, p pair, rs runScript, withLessons bool) outcome {
	t.Helper()
	srv := llmtest.NewOpenAIServerFunc(t, model)
	files := map[string][]byte{}
	for k, v := range p.files {
		files[k] = []byte(v)
	}
	var o outcome
	opts := agent.Options{Task: rs.task, Files: files, Provider: provider(srv), Session: newSession(t), MaxSteps: 10,
		OnEvent: func(e agent.Event) {
			if e.Type == agent.EventToolResult && e.IsError && strings.Contains(e.Text, p.errMatch) {
				o.repeated = true
			}
			if e.Type == agent.EventLessons && e.Text == "start" {
				o.shown = len(e.Lessons)
				for _, l := range e.Lessons {
					o.recalled = o.recalled || strings.Contains(l.Text, p.hint)
				}
			}
		}}
	if withLessons {
		opts.Lessons = lessons.NewRun(&lessons.Options{Store: st, Owner: "bench"})
	}
	rep, err := agent.Run(context.Background(), &opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != agent.StatusDone {
		t.Fatalf("%s %q: %s: %s", p.name, rs.task, rep.Status, rep.Error)
	}
	o.steps, o.tokens = rep.Steps, rep.Usage.InputTokens+rep.Usage.OutputTokens
	if reqs := srv.Requests(); len(reqs) > 0 {
		o.system = len(reqs[0].System())
	}
	return o
}

// measure runs every pair: A (learning, among 500 unrelated lessons), then
// B without lessons and B with them.
func measure(t testing.TB, ps []pair, logf func(string, ...any)) (stepsWith, stepsWithout int, tokWith, tokWithout int64, repeats, recalled, maxGrowth, precHits, precTotal int) {
	st := openStore(t)
	defer func() { precHits, precTotal = precision(t, st, ps) }()
	unrelated(t, st, "bench", 500)
	for _, p := range ps {
		if a := runPair(t, st, p, p.a, true); !a.repeated {
			t.Fatalf("%s: run A did not make the mistake", p.name)
		}
	}
	logf("%-22s %12s %12s %14s %14s %8s %8s", "pair", "steps w/o", "steps with", "tokens w/o", "tokens with", "recalled", "+prompt")
	for _, p := range ps {
		without := runPair(t, st, p, p.b, false)
		with := runPair(t, st, p, p.b, true)
		if !without.repeated {
			t.Fatalf("%s: run B without lessons did not make the mistake", p.name)
		}
		growth := (with.system - without.system + 3) / 4
		logf("%-22s %12d %12d %14d %14d %8v %7dt", p.name, without.steps, with.steps, without.tokens, with.tokens, with.recalled, growth)
		stepsWith += with.steps
		stepsWithout += without.steps
		tokWith += with.tokens
		tokWithout += without.tokens
		if with.repeated {
			repeats++
		}
		if with.recalled {
			recalled++
		}
		maxGrowth = max(maxGrowth, growth)
	}
	return
}

// precision is how many of the pairs' other tasks are shown their pair's
// lesson at the start, and how many tasks were asked.
func precision(t testing.TB, st *store.Store, ps []pair) (hits, total int) {
	for _, p := range ps {
		files := map[string][]byte{}
		for k, v := range p.files {
			files[k] = []byte(v)
		}
		for _, task := range append([]string{p.b.task}, p.more...) {
			_, shown := lessons.NewRun(&lessons.Options{Store: st, Owner: "bench"}).Recall(context.Background(), task, agent.ModeGenerate, files)
			total++
			for _, l := range shown {
				if strings.Contains(l.Text, p.hint) {
					hits++
					break
				}
			}
		}
	}
	return hits, total
}

// The benchmark's claims on two pairs, in `make test`: run B with lessons
// takes fewer steps, never repeats the error, and finds its lesson among
// 500 unrelated ones within the prompt budget.
func TestLessonsPairsSmoke(t *testing.T) {
	sw, swo, tw, two, rep, rec, growth, ph, pt := measure(t, []pair{pairs[0], pairs[3]}, t.Logf)
	if rep != 0 || rec != 2 || sw*10 > swo*6 || tw >= two || growth > 600 || ph*10 < pt*9 {
		t.Errorf("steps %d vs %d, tokens %d vs %d, repeats %d, recalled %d/2, prompt +%d tokens, precision %d/%d", sw, swo, tw, two, rep, rec, growth, ph, pt)
	}
}

// BenchmarkLessons prints, for run B of every pair, steps and tokens with
// lessons against --no-lessons in the same run, how often the right lesson
// was recalled at the start among 500 unrelated ones (top 5), and how much
// the system prompt grew.
func BenchmarkLessons(b *testing.B) {
	for range b.N {
		sw, swo, tw, two, rep, rec, growth, ph, pt := measure(b, pairs, func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
		fmt.Printf("run B with lessons: %d steps vs %d without (%.0f%%), %d tokens vs %d (%.0f%%), error repeated in %d of %d\n",
			sw, swo, 100*float64(sw)/float64(swo), tw, two, 100*float64(tw)/float64(two), rep, len(pairs))
		fmt.Printf("recall precision (right lesson in the top 5 of 506) in the runs B: %d/%d; over %d tasks (runs B and two more per pair): %d/%d = %.0f%%; largest system prompt growth: %d tokens\n",
			rec, len(pairs), pt, ph, pt, 100*float64(ph)/float64(pt), growth)
		b.ReportMetric(float64(sw)/float64(swo), "steps_with/without")
		b.ReportMetric(float64(tw)/float64(two), "tokens_with/without")
		b.ReportMetric(float64(ph)/float64(pt), "precision")
		b.ReportMetric(float64(growth), "prompt_growth_tokens")
	}
}
