package lessons

import (
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/kernel"
)

func errResult(name, value string) *kernel.Result {
	return &kernel.Result{Status: kernel.StatusError, Error: &kernel.Exception{Name: name, Value: value}}
}

func TestSignatureNormalization(t *testing.T) {
	sig := func(name, value string) Sig {
		s, ok := SignatureOf(agent.ToolExecutePython, errResult(name, value))
		if !ok {
			t.Fatalf("%s: %s: not seen as a failure", name, value)
		}
		return s
	}
	same := [][2][2]string{
		{{"FileNotFoundError", "[Errno 2] No such file or directory: '/workspace/a/sales.csv'"}, {"FileNotFoundError", "[Errno 2] No such file or directory: '/tmp/x/sales.csv'"}},
		{{"ZeroDivisionError", "division by zero at line 12"}, {"ZeroDivisionError", "division by zero at line 3"}},
		{{"MemoryError", "Unable to allocate 7.45 GiB for an array with shape (1000000000,) and data type float64"}, {"MemoryError", "Unable to allocate 3.1 GiB for an array with shape (400000000,) and data type float64"}},
		{{"TypeError", "<object at 0x7f3a2b1c0d90> is not callable, see /usr/lib/python3/dist-packages/x.py"}, {"TypeError", "<object at 0x55aa00112233> is not callable, see /workspace/y.py"}},
		{{"ConnectionError", "HTTPSConnectionPool(host='example.invalid', port=443): Max retries exceeded with url: https://example.invalid/a.csv"}, {"ConnectionError", "HTTPSConnectionPool(host='example.invalid', port=80): Max retries exceeded with url: http://example.invalid/b.csv"}},
	}
	for _, c := range same {
		a, b := sig(c[0][0], c[0][1]), sig(c[1][0], c[1][1])
		if a.Text != b.Text || a.Detail != b.Detail {
			t.Errorf("same error, different signatures:\n  %q (%q)\n  %q (%q)", a.Text, a.Detail, b.Text, b.Detail)
		}
	}
	different := [][2][2]string{
		{{"KeyError", "'date'"}, {"AttributeError", "'DataFrame' object has no attribute 'append'"}},
		{{"ModuleNotFoundError", "No module named 'seaborn'"}, {"ModuleNotFoundError", "No module named 'sklearn'"}},
		{{"AttributeError", "'DataFrame' object has no attribute 'append'"}, {"AttributeError", "module 'numpy' has no attribute 'float'"}},
		{{"ValueError", "invalid literal for int() with base 10: 'x'"}, {"TypeError", "invalid literal for int() with base 10: 'x'"}},
	}
	for _, c := range different {
		a, b := sig(c[0][0], c[0][1]), sig(c[1][0], c[1][1])
		if a.Text == b.Text && a.Detail == b.Detail {
			t.Errorf("different errors, one signature: %q (%q)", a.Text, a.Detail)
		}
	}
	if s := sig("KeyError", "'date'"); s.Text != "KeyError: <q>" || s.Detail != "date" {
		t.Errorf("KeyError 'date' → %q (%q)", s.Text, s.Detail)
	}
	if s := sig("FileNotFoundError", "[Errno 2] No such file or directory: 'data/in 2.csv'"); strings.Contains(s.Text, "2.csv") || strings.Contains(s.Text, "data") {
		t.Errorf("a path stayed in the signature: %q", s.Text)
	}
}

func TestSignatureOfShellCommand(t *testing.T) {
	res := &kernel.Result{Status: kernel.StatusError,
		Stderr: "Traceback (most recent call last):\n  File \"/workspace/report.py\", line 7, in <module>\n    df = df.append(row)\nAttributeError: 'DataFrame' object has no attribute 'append'\n",
		Error:  &kernel.Exception{Name: "CommandFailed", Value: "the command exited with status 1"}}
	s, ok := SignatureOf(agent.ToolRunShell, res)
	if !ok || s.Text != "AttributeError: <q> object has no attribute <q>" || s.Detail != "DataFrame append" {
		t.Errorf("got %q (%q), %v", s.Text, s.Detail, ok)
	}
	if _, ok := SignatureOf(agent.ToolExecutePython, &kernel.Result{Status: kernel.StatusOK}); ok {
		t.Error("a success has a signature")
	}
	if s, _ := SignatureOf(agent.ToolExecutePython, &kernel.Result{Status: kernel.StatusTimeout}); s.Name != "Timeout" {
		t.Errorf("timeout → %q", s.Text)
	}
}

func TestPackages(t *testing.T) {
	got := strings.Join(Packages("import pandas as pd, numpy as np\nfrom matplotlib import pyplot as plt\nimport os.path\n  from seaborn.x import y\nx = 'import nothing'"), " ")
	if got != "pandas numpy matplotlib os seaborn" {
		t.Errorf("got %q", got)
	}
}

func TestStripSecrets(t *testing.T) {
	secrets := []string{
		"sk-proj-abcdefghijklmnop1234567890",
		"ghp_abcdefghijklmnopqrstuvwxyz0123456789",
		"AKIAIOSFODNN7EXAMPLE",
		"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
		"hunter2hunter2",
		"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"AIzaSyA1234567890abcdefghijklmnopqrstu",
	}
	for _, sec := range secrets {
		for _, in := range []string{
			"use requests.get(url, headers={'Authorization': 'Bearer " + sec + "'})",
			"API_KEY = '" + sec + "'",
			"export OPENAI_API_KEY=" + sec,
			`{"password": "` + sec + `"}`,
			"connect to postgres://admin:" + sec + "@db.invalid/x",
		} {
			if out := StripSecrets(in); strings.Contains(out, sec) {
				t.Errorf("the secret survived: %q → %q", in, out)
			}
		}
	}
	for _, keep := range []string{
		"pandas here is 1.5.3: use pd.concat, not DataFrame.append",
		"sales.csv's date column is `day`",
		"use df.groupby('customer_identifier_column_name')",
		"token_count = len(text.split())",
	} {
		if out := StripSecrets(keep); out != keep {
			t.Errorf("a harmless text was changed: %q → %q", keep, out)
		}
	}
}

func exec(step int, code string, res *kernel.Result) agent.Execution {
	return agent.Execution{Step: step, Tool: agent.ToolExecutePython, Code: code, Result: res}
}

func TestCapture(t *testing.T) {
	ok := &kernel.Result{Status: kernel.StatusOK}
	var c capture
	c.inputs = map[string]string{"sales.csv": FileKey("sales.csv", []byte("day,amount\n"))}
	see := func(x agent.Execution) {
		s, failed := SignatureOf(x.Tool, x.Result)
		c.executed(x, s, failed)
	}
	bad := "import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.groupby('date').amount.sum())"
	see(exec(1, bad, errResult("KeyError", "'date'")))
	see(exec(2, "print(df.columns)", ok)) // a look at the data is not the fix
	if len(c.learned()) != 0 {
		t.Fatalf("a look at the data was taken for the fix: %+v", c.learned())
	}
	see(exec(3, strings.Replace(bad, "'date'", "'day'", 1), ok))
	see(exec(4, "import seaborn", errResult("ModuleNotFoundError", "No module named 'seaborn'")))
	got := c.learned()
	if len(got) != 2 {
		t.Fatalf("want a fix and a fact, got %+v", got)
	}
	fix := got[0]
	if fix.Sig.Text != "KeyError: <q>" || fix.Scope != "files" || len(fix.Files) != 1 || !strings.HasPrefix(fix.Files[0], "sales.csv#") || fix.Step != 1 {
		t.Errorf("fix candidate: %+v", fix)
	}
	if !strings.Contains(fix.Fix, "-print(df.groupby('date')") || !strings.Contains(fix.Fix, "+print(df.groupby('day')") {
		t.Errorf("fix diff:\n%s", fix.Fix)
	}
	if strings.Join(fix.Packages, " ") != "pandas" {
		t.Errorf("packages %v", fix.Packages)
	}
	fact := got[1]
	if fact.Scope != "global" || !strings.Contains(fact.Fact, "seaborn is not installed") {
		t.Errorf("fact candidate: %+v", fact)
	}
	if f := fallback(fix); !strings.Contains(f, "KeyError") || !strings.Contains(f, "sales.csv") || !strings.Contains(f, "groupby('day')") {
		t.Errorf("fallback text: %q", f)
	}
}

func TestCaptureShellFix(t *testing.T) {
	files := map[string]string{"report.py": "import pandas as pd\ndf = pd.DataFrame()\ndf = df.append({'a': 1}, ignore_index=True)\n"}
	snap := func() map[string]string { return map[string]string{"report.py": files["report.py"]} }
	fail := &kernel.Result{Status: kernel.StatusError, Stderr: "AttributeError: 'DataFrame' object has no attribute 'append'\n", Error: &kernel.Exception{Name: "CommandFailed", Value: "the command exited with status 1"}}
	var c capture
	x := agent.Execution{Step: 2, Tool: agent.ToolRunShell, Code: "python3 report.py", Result: fail, Files: snap}
	s, failed := SignatureOf(x.Tool, x.Result)
	c.executed(x, s, failed)
	files["report.py"] = "import pandas as pd\ndf = pd.DataFrame()\ndf = pd.concat([df, pd.DataFrame([{'a': 1}])], ignore_index=True)\n"
	x = agent.Execution{Step: 4, Tool: agent.ToolRunShell, Code: "python3 report.py", Result: &kernel.Result{Status: kernel.StatusOK}, Files: snap}
	c.executed(x, Sig{}, false)
	got := c.learned()
	if len(got) != 1 || got[0].Scope != "global" || !strings.Contains(got[0].Fix, "report.py:") || !strings.Contains(got[0].Fix, "+df = pd.concat") {
		t.Fatalf("got %+v", got)
	}
}
