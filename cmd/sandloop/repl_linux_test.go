package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exit(), quit() and sys.exit(n) leave the REPL, n being the exit status,
// without a traceback; multi-line cells are entered naturally.
func TestReplExits(t *testing.T) {
	for _, tt := range []struct {
		input string
		code  int
	}{
		{"x = 1\nimport sys\nsys.exit(3)\nprint('still here')\n", 3},
		{"exit()\nprint('still here')\n", 0},
		{"quit()\nprint('still here')\n", 0},
		{"n = 4\nimport sys\nsys.exit(n)\nprint('still here')\n", 4},
		{"def leave():\n    raise SystemExit('bye')\n\nleave()\nprint('still here')\n", 1},
	} {
		code, out, errOut := sandloop(t, tt.input, "repl", "--history", "")
		if code != tt.code || strings.Contains(out, "still here") || strings.Contains(errOut, "Traceback") {
			t.Errorf("%q: exit %d (want %d)\nstdout %q\nstderr %q", tt.input, code, tt.code, out, errOut)
		}
	}
	code, out, errOut := sandloop(t, "def f(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n\nf(4)\n", "repl")
	if code != 0 || !strings.Contains(out, "\n6\n") && !strings.Contains(out, " 6\n") {
		t.Errorf("multi-line def: exit %d %q %q", code, out, errOut)
	}
}

// On a terminal, lines are edited with the arrow keys, Ctrl-R searches the
// history, and the history is kept in a file across sessions.
func TestReplLineEditingAndHistory(t *testing.T) {
	history := filepath.Join(t.TempDir(), "data", "repl_history")
	session := func(t *testing.T, steps func(type_ func(string, int))) string {
		master, tty := openPty(t)
		cmd := cliCommand(t.Context(), "repl", "--history", history)
		cmd.Env = append(cmd.Env, "TERM=xterm")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		tty.Close()
		out := readPty(master)
		prompts := 1
		out.waitFor(t, ">>> ", prompts)
		steps(func(keys string, wantPrompts int) {
			master.Write([]byte(keys))
			out.waitFor(t, ">>> ", wantPrompts)
		})
		if err := cmd.Wait(); err != nil {
			t.Fatalf("repl: %v\n%s", err, out.String())
		}
		// (The prompts counted above include liner's redraws of the line
		// being typed, so they do not prove the last cell's output was read.)
		out.drained()
		return out.String()
	}
	const up, ctrlR, backspace = "\x1b[A", "\x12", "\x7f"
	out := session(t, func(type_ func(string, int)) {
		type_("x = 6*7\r", 2)
		type_(up+backspace+backspace+backspace+"100\r", 3) // x = 100
		type_("print(x+1)\r", 4)
		type_("def f():\r    return x * 2\r\r", 5)
		type_("f()\r", 6)
		master := "exit()\r"
		type_(master, 6)
	})
	if !strings.Contains(out, "101\r\n") || !strings.Contains(out, "200\r\n") {
		t.Errorf("edited line or multi-line def did not run as typed:\n%s", out)
	}
	b, err := os.ReadFile(history)
	if err != nil || !strings.Contains(string(b), "print(x+1)") {
		t.Fatalf("history file: %q %v", b, err)
	}
	// A new session searches the old one's history with Ctrl-R.
	out = session(t, func(type_ func(string, int)) {
		type_("x = 5\r", 2)
		type_(ctrlR+"print(x"+"\r", 3)
		type_("exit()\r", 3)
	})
	if !strings.Contains(out, "6\r\n") {
		t.Errorf("Ctrl-R did not find print(x+1) in the history:\n%s", out)
	}
}

// repl --with brings files in, --out keeps the workspace on exit (beside
// DIR where it would overwrite, so nothing is lost), and without --out the
// exit says what is deleted.
func TestReplWithAndOut(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	os.MkdirAll(filepath.Join(dir, "data"), 0o755)
	writeFile(t, dir, "data/sales.csv", "region,amount\nnorth,3\nsouth,4\n")
	writeFile(t, dir, "notes.txt", "hello\n")
	out := filepath.Join(dir, "kept")
	input := "import csv\nrows = list(csv.DictReader(open('data/sales.csv')))\nprint('total', sum(int(r['amount']) for r in rows))\n" +
		"open('data/sales.csv', 'a').write('east,5\\n')\nopen('report.txt', 'w').write('total 12\\n')\n"
	code, stdout, stderr := sandloop(t, input, "repl", "--history", "", "--with", "data", "--with", "notes.txt", "--out", out)
	if code != 0 || !strings.Contains(stdout, "total 7") {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "report.txt")); string(b) != "total 12\n" {
		t.Errorf("--out lacks report.txt: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "data", "sales.csv")); !strings.HasSuffix(string(b), "east,5\n") {
		t.Errorf("--out has the --with file unchanged: %q", b)
	}
	if !strings.Contains(stderr, "sandloop: copied the workspace (3 file(s)") || !strings.Contains(stderr, out) {
		t.Errorf("the exit does not say where the files went: %q", stderr)
	}

	// Again into the same --out: the files differ, so they go beside it.
	code, _, stderr = sandloop(t, "open('report.txt', 'w').write('changed\\n')\n", "repl", "--history", "", "--out", out)
	if code != 0 || !strings.Contains(stderr, "would overwrite 1 existing file(s) (report.txt)") || !strings.Contains(stderr, "copied to "+out+".repl-") {
		t.Fatalf("clash: exit %d %q", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "report.txt")); string(b) != "total 12\n" {
		t.Errorf("--out was overwritten without --force: %q", b)
	}
	beside, _ := filepath.Glob(out + ".repl-*")
	if len(beside) != 1 {
		t.Fatalf("beside --out: %v", beside)
	}
	if b, _ := os.ReadFile(filepath.Join(beside[0], "report.txt")); string(b) != "changed\n" {
		t.Errorf("the new files were lost: %q", b)
	}

	// No --out: the exit says what is deleted.
	_, _, stderr = sandloop(t, "open('a.py', 'w').write('x = 1\\n')\n", "repl", "--history", "")
	if !strings.Contains(stderr, "sandloop: deleting the workspace (1 file(s), 6 bytes: a.py); keep it next time with --out DIR") {
		t.Errorf("no word of what is deleted: %q", stderr)
	}
	if code, _, stderr := sandloop(t, "", "repl", "--history", "", "--with", "nosuch"); code != 2 || !strings.Contains(stderr, "--with nosuch") {
		t.Errorf("--with a missing path: %d %q", code, stderr)
	}
}
