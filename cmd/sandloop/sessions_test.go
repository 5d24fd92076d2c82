package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

// sandloop sessions against a real server (internal/host, as serve runs
// it): checkpoint, list, undo, restore, fork, pause and resume, in human
// form and --json, with the exit codes of bad input.
func TestSessionsCLI(t *testing.T) {
	const token = "cli-token-aaaaaaaaaaaa"
	url := cliServer(t, token)
	ctx := context.Background()
	c, _ := client.New(url, &client.Options{Token: token})
	s, err := c.CreateSession(ctx, &client.CreateOptions{Checkpoints: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	exec := func(id, code string) string {
		t.Helper()
		r, err := c.Execute(ctx, id, code, nil)
		if err != nil || r.Status != "ok" {
			t.Fatalf("%s: %+v %v", code, r, err)
		}
		return r.Text()
	}
	cli := func(want int, args ...string) string {
		t.Helper()
		out, errOut := sessionsCLI(t, url, "", want, args...)
		return out + errOut
	}
	t.Setenv("SANDLOOP_TOKEN", token)

	exec(s.ID, "x = 1")
	if out := cli(0, "checkpoint", s.ID, "--name", "first"); !strings.Contains(out, "taken at execution 1") {
		t.Errorf("checkpoint: %s", out)
	}
	var cps struct{ Checkpoints []client.Checkpoint }
	if err := json.Unmarshal([]byte(cli(0, "checkpoints", s.ID, "--json")), &cps); err != nil || len(cps.Checkpoints) < 2 {
		t.Fatalf("checkpoints --json: %+v %v", cps, err)
	}
	named := ""
	for _, cp := range cps.Checkpoints {
		if cp.Name == "first" {
			named = cp.ID
		}
	}
	if out := cli(0, "checkpoints", s.ID); !strings.Contains(out, "first") || !strings.Contains(out, "(auto)") || !strings.Contains(out, named) {
		t.Errorf("checkpoints: %s", out)
	}
	exec(s.ID, "x = 2")
	if out := cli(0, "undo", s.ID); !strings.Contains(out, "restored from undo") {
		t.Errorf("undo: %s", out)
	}
	if got := exec(s.ID, "x"); got != "1" {
		t.Errorf("after undo x = %s", got)
	}
	exec(s.ID, "x = 3")
	cli(0, "restore", s.ID, named)
	if got := exec(s.ID, "x"); got != "1" {
		t.Errorf("after restore x = %s", got)
	}
	out := cli(0, "fork", s.ID, "-n", "2")
	kids := strings.Fields(strings.SplitN(out, s.ID+":", 2)[0])
	if len(kids) < 2 || !strings.Contains(out, "restored from fork of "+s.ID) {
		t.Fatalf("fork: %s", out)
	}
	if got := exec(kids[0], "x"); got != "1" {
		t.Errorf("the fork's x = %s", got)
	}
	if out := cli(0, "pause", s.ID); out != s.ID+" paused\n" {
		t.Errorf("pause: %q", out)
	}
	if out := cli(0, "ls"); !strings.Contains(out, s.ID) || !strings.Contains(out, "paused") || !strings.Contains(out, kids[1]) {
		t.Errorf("ls: %s", out)
	}
	if out := cli(0, "resume", s.ID, "--json"); !strings.Contains(out, `"state": "running"`) {
		t.Errorf("resume --json: %s", out)
	}

	// Bad input exits 2 with the server's reason; another token finds nothing.
	if out := cli(2, "restore", s.ID, "cp999"); !strings.Contains(out, "cp999") {
		t.Errorf("restore of an unknown checkpoint: %s", out)
	}
	cli(2, "fork", s.ID, "-n", "0")
	if out := cli(2, "fork", s.ID, "-n", "17"); !strings.Contains(out, "at most 16") {
		t.Errorf("fork -n 17: %s", out)
	}
	cli(2, "undo")
	if out := cli(2, "pause", s.ID, "--token", "cli-token-bbbbbbbbbbbb"); !strings.Contains(out, "--token") {
		t.Errorf("a wrong token: %s", out)
	}
	if out := cli(1, "ls", "--url", "http://127.0.0.1:1"); !strings.Contains(out, "cannot reach the server at http://127.0.0.1:1") {
		t.Errorf("no server: %s", out)
	}

	// What happened to it, one line each; --follow until its close.
	out = cli(0, "events", s.ID)
	for _, want := range []string{"#1  created: a new kernel", "checkpoint: checkpoint " + named, "undone", "  restored from undo: ",
		"checkpoint_restored", "forked: into " + kids[0], "paused: asked for", "#7  resumed\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("events: no %q in\n%s", want, out)
		}
	}
	var list struct{ Events []client.SessionEvent }
	if err := json.Unmarshal([]byte(cli(0, "events", s.ID, "--json")), &list); err != nil || len(list.Events) < 7 {
		t.Fatalf("events --json: %+v %v", list, err)
	}
	last := list.Events[len(list.Events)-1].Seq
	followed := make(chan string, 1)
	go func() {
		var o bytes.Buffer
		execute([]string{"sessions", "--url", url, "events", s.ID, "--follow", "--json", "--since", fmt.Sprint(last)}, strings.NewReader(""), &o, &o)
		followed <- o.String()
	}()
	time.Sleep(500 * time.Millisecond) // (a late start replays: --since)
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-followed:
		var e client.SessionEvent
		if strings.Count(got, "\n") != 1 || json.Unmarshal([]byte(got), &e) != nil || e.Type != "closed" {
			t.Errorf("events --follow --json: %q", got)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("events --follow did not end at the session's close")
	}
	if out := cli(2, "resume", s.ID); !strings.Contains(out, "deleted by its owner") || !strings.Contains(out, "sandloop sessions events ID") {
		t.Errorf("resume of a deleted session: %s", out)
	}
}

// serve --checkpoints auto: a session that asks for none takes one before
// every execution (undo works); a bad mode is a usage error.
func TestServeCheckpointsFlag(t *testing.T) {
	env := startServe(t, "--pool", "0", "--checkpoints", "auto", "--auto-checkpoints", "2")
	c, _ := client.New(env.URL, nil)
	ctx := context.Background()
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{"x = 1", "x = 2", "x = 3"} {
		if _, err := c.Execute(ctx, s.ID, code, nil); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.Checkpoints(ctx, s.ID)
	if err != nil || len(list) != 2 || !list[0].Auto {
		t.Fatalf("checkpoints with --auto-checkpoints 2: %+v %v", list, err)
	}
	if _, err := c.Undo(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Execute(ctx, s.ID, "x", nil); err != nil || r.Text() != "2" {
		t.Errorf("after undo: %+v %v", r, err)
	}
	if code, _, errOut := sandloop(t, "", "serve", "--checkpoints", "always"); code != 2 || !strings.Contains(errOut, "--checkpoints") {
		t.Errorf("serve --checkpoints always: exit %d %s", code, errOut)
	}
}

// cliServer starts a server (internal/host, as serve runs it) that takes
// token, and returns its URL.
func cliServer(t *testing.T, token string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(context.Background(), ln, &host.Config{Tokens: []string{token}, MaxSessions: 8})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	go h.Serve(context.Background())
	t.Cleanup(func() { h.Close() })
	return h.URL()
}

// sessionsCLI runs `sandloop sessions --url URL ARGS` with stdin and
// wants exit code want; it returns stdout and stderr.
func sessionsCLI(t *testing.T, url, stdin string, want int, args ...string) (string, string) {
	t.Helper()
	code, out, errOut := sandloop(t, stdin, append([]string{"sessions", "--url", url}, args...)...)
	if code != want {
		t.Fatalf("sessions %v: exit %d, want %d\nstdout %s\nstderr %s", args, code, want, out, errOut)
	}
	return out, errOut
}

// sandloop sessions new, exec and rm: a session made, used cell after
// cell (inline and from stdin), its errors and timeouts as exit codes,
// a fork's child used the same way, and the sessions closed.
func TestSessionsCLIUse(t *testing.T) {
	const token = "cli-token-cccccccccccc"
	url := cliServer(t, token)
	t.Setenv("SANDLOOP_TOKEN", token)
	cli := func(stdin string, want int, args ...string) (string, string) {
		t.Helper()
		return sessionsCLI(t, url, stdin, want, args...)
	}
	out, _ := cli("", 0, "new", "--checkpoints", "auto", "--memory", "256M", "--env", "GREETING=hi")
	id := strings.TrimSpace(out)
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("new printed %q, want one id", out)
	}
	if out, _ := cli("", 0, "exec", id, "-c", "import os\nx = 41\nprint(os.environ['GREETING'])"); out != "hi\n" {
		t.Errorf("exec -c: stdout %q", out)
	}
	if out, _ := cli("x + 1\n", 0, "exec", id); out != "42\n" {
		t.Errorf("exec from stdin: stdout %q, want the last expression's value", out)
	}
	if out, errOut := cli("", 1, "exec", id, "-c", "import sys\nprint('before', file=sys.stderr)\n1/0"); out != "" || !strings.Contains(errOut, "before") || !strings.Contains(errOut, "ZeroDivisionError") {
		t.Errorf("a raising cell: stdout %q, stderr %q", out, errOut)
	}
	if _, errOut := cli("", 124, "exec", id, "-c", "import time\ntime.sleep(30)", "--timeout", "1s"); !strings.Contains(errOut, "timed out") {
		t.Errorf("a timed-out cell: stderr %q", errOut)
	}
	if out, _ := cli("", 0, "exec", id, "-c", "x", "--json"); !strings.Contains(out, `"status": "ok"`) || !strings.Contains(out, `"text/plain": "41"`) {
		t.Errorf("exec --json: %s", out)
	}
	if out, _ := cli("", 0, "undo", id); !strings.Contains(out, "restored from undo") {
		t.Errorf("undo: %s", out)
	}
	out, _ = cli("", 0, "fork", id)
	kid := strings.TrimSpace(out)
	if out, _ := cli("", 0, "exec", kid, "-c", "x * 2"); out != "82\n" {
		t.Errorf("exec in the fork: %q", out)
	}
	// A kernel that dies: 137, then the session says how to go on, and
	// restart gives a new kernel with the files kept.
	cli("", 137, "exec", kid, "-c", "open('kept.txt', 'w').write('k')\nimport os\nos._exit(3)")
	if _, errOut := cli("", 1, "exec", kid, "-c", "1"); !strings.Contains(errOut, "sandloop sessions restart ID") || strings.Contains(errOut, "POST /v1") {
		t.Errorf("exec after the kernel died: stderr %q, want the restart command (not the API's endpoint)", errOut)
	}
	if out, _ := cli("", 0, "restart", kid); out != kid+" restarted: a new kernel (its variables and checkpoints are gone, its files stay)\n" {
		t.Errorf("restart: %q", out)
	}
	if out, _ := cli("", 0, "exec", kid, "-c", "'x' in globals(), open('kept.txt').read()"); out != "(False, 'k')\n" {
		t.Errorf("exec after the restart: %q, want no variables and the files kept", out)
	}
	// Bad input: exit 2 with the reason.
	if _, errOut := cli("", 2, "exec", "no-such-session", "-c", "1"); !strings.Contains(errOut, "not found") {
		t.Errorf("exec in an unknown session: %s", errOut)
	}
	if _, errOut := cli("", 2, "new", "--checkpoints", "sometimes"); !strings.Contains(errOut, "auto or off") {
		t.Errorf("new --checkpoints sometimes: %s", errOut)
	}
	if _, errOut := cli("", 2, "new", "--memory", "64G"); !strings.Contains(errOut, "maximum") {
		t.Errorf("new --memory 64G: %s", errOut)
	}
	if out, _ := cli("", 0, "rm", id, kid); out != id+" deleted\n"+kid+" deleted\n" {
		t.Errorf("rm: %q", out)
	}
	if _, errOut := cli("", 2, "rm", id); !strings.Contains(errOut, "was closed at") || !strings.Contains(errOut, "deleted by its owner") {
		t.Errorf("rm of a deleted session: %s, want when and why it closed", errOut)
	}
	if out, errOut := cli("", 0, "ls"); strings.Contains(out, id) || !strings.Contains(errOut, "no sessions") {
		t.Errorf("ls after rm: %s %s", out, errOut)
	}
}

// sandloop sessions put, files, get and archive: a directory and a file
// (and stdin) in, the code's results out, by file, by directory and to
// stdout; the exact bytes both ways; a local file holding something else
// never overwritten without --force, and nothing written then; symbolic
// links left out, and counted. And exec's images, saved to files.
func TestSessionsCLIFiles(t *testing.T) {
	const token = "cli-token-ffffffffffff"
	url := cliServer(t, token)
	t.Setenv("SANDLOOP_TOKEN", token)
	cli := func(stdin string, want int, args ...string) (string, string) {
		t.Helper()
		return sessionsCLI(t, url, stdin, want, args...)
	}
	dir := t.TempDir()
	proj := filepath.Join(dir, "proj")
	os.MkdirAll(filepath.Join(proj, "sub"), 0o755)
	binary := string([]byte{0, 1, 2, 255, '\n', 'x'})
	writeFile(t, proj, "data.csv", "a,b\n1,2\n")
	writeFile(t, filepath.Join(proj, "sub"), "blob.bin", binary)
	os.Symlink("data.csv", filepath.Join(proj, "link.csv"))
	out, _ := cli("", 0, "new")
	id := strings.TrimSpace(out)

	if out, errOut := cli("", 0, "put", id, proj); !strings.Contains(out, "put 2 file(s)") || !strings.Contains(errOut, "1 symbolic link(s)") {
		t.Errorf("put a directory: %q %q", out, errOut)
	}
	cli("", 0, "put", id, filepath.Join(proj, "data.csv"), "in/renamed.csv")
	cli("piped\n", 0, "put", id, "-", "notes/p.txt")
	if _, errOut := cli("", 2, "put", id, "-"); !strings.Contains(errOut, "stdin needs the PATH") {
		t.Errorf("put - without PATH: %q", errOut)
	}
	if out, _ := cli("", 0, "exec", id, "-c", `import os
b = open("proj/sub/blob.bin", "rb").read()
print(open("proj/data.csv").read() == open("in/renamed.csv").read(), b == bytes([0, 1, 2, 255, 10, 120]), open("notes/p.txt").read() == "piped\n")
os.makedirs("out/deep", exist_ok=True)
open("out/r.txt", "w").write("result")
open("out/deep/b.bin", "wb").write(b)
os.symlink("r.txt", "out/l")`); out != "True True True\n" {
		t.Fatalf("the files in the session: %q", out)
	}
	// An image the code shows goes to a file, named instead of the
	// figure's text; one there already is kept.
	imgs := filepath.Join(dir, "imgs")
	os.MkdirAll(imgs, 0o755)
	writeFile(t, imgs, "image-1.png", "mine")
	plot := "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
	if out, _ := cli("", 0, "exec", id, "--images", imgs, "-c", plot); out != "[image: "+filepath.Join(imgs, "image-2.png")+"]\n" {
		t.Errorf("exec showing a plot: %q", out)
	}
	if b, _ := os.ReadFile(filepath.Join(imgs, "image-2.png")); !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("the saved image is no PNG: %q", b[:min(len(b), 8)])
	}
	if out, _ := cli("", 0, "files", id, "out"); !strings.Contains(out, "out/r.txt") || !strings.Contains(out, "out/deep/") {
		t.Errorf("files: %q", out)
	}
	if out, _ := cli("", 0, "get", id, "out/r.txt", "-"); out != "result" {
		t.Errorf("get to stdout: %q", out)
	}
	local := filepath.Join(dir, "got")
	if out, errOut := cli("", 0, "get", id, "out", local); !strings.Contains(out, "got 2 file(s)") || !strings.Contains(errOut, "1 symbolic link(s)") {
		t.Errorf("get a directory: %q %q", out, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "deep", "b.bin")); string(b) != binary {
		t.Errorf("got deep/b.bin %q, want %q", b, binary)
	}
	// Again: the same files are no clash.
	cli("", 0, "get", id, "out", local)
	os.WriteFile(filepath.Join(local, "r.txt"), []byte("mine"), 0o644)
	os.Remove(filepath.Join(local, "deep", "b.bin"))
	if _, errOut := cli("", 2, "get", id, "out", local); !strings.Contains(errOut, "would overwrite 1 existing file(s) (r.txt); nothing was written") {
		t.Errorf("get over a changed file: %q", errOut)
	}
	if _, err := os.Stat(filepath.Join(local, "deep", "b.bin")); err == nil {
		t.Error("a refused get wrote files")
	}
	if _, errOut := cli("", 2, "get", id, "out/r.txt", filepath.Join(local, "r.txt")); !strings.Contains(errOut, "holds something else") {
		t.Errorf("get a file over a changed one: %q", errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "r.txt")); string(b) != "mine" {
		t.Errorf("a refused get changed the file: %q", b)
	}
	cli("", 0, "get", id, "out/r.txt", local, "--force") // into the directory
	if b, _ := os.ReadFile(filepath.Join(local, "r.txt")); string(b) != "result" {
		t.Errorf("get --force: %q", b)
	}
	if _, errOut := cli("", 2, "get", id, "out", "-"); !strings.Contains(errOut, "is a directory") {
		t.Errorf("a directory to stdout: %q", errOut)
	}
	if _, errOut := cli("", 2, "get", id, "missing.txt", local); !strings.Contains(errOut, "no such file") {
		t.Errorf("get a missing file: %q", errOut)
	}
	arch := filepath.Join(dir, "w.tar.gz")
	cli("", 0, "archive", id, "-o", arch)
	if out, err := exec.Command("tar", "tzf", arch).Output(); err != nil || !strings.Contains(string(out), "proj/sub/blob.bin") {
		t.Errorf("archive: %s %v", out, err)
	}
	if _, errOut := cli("", 2, "archive", id, "-o", arch); !strings.Contains(errOut, "exists") {
		t.Errorf("archive over a file: %q", errOut)
	}
}
