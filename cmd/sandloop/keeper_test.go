package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/testutil"
)

// keptServe is a `sandloop serve --keep-sessions` under test.
type keptServe struct {
	cmd    *exec.Cmd
	url    string
	stderr *syncBuffer
}

var servingRE = regexp.MustCompile(`sandloop serving on (http://\S+)`)

// startKept starts serve --keep-sessions on dataDir (a real process: this
// test binary as the CLI). The cleanup kills it (by its PID) if it is
// still running.
func startKept(t testing.TB, dataDir string, args ...string) *keptServe {
	t.Helper()
	return startKeptEnv(t, dataDir, nil, args...)
}

// startKeptEnv is startKept with env added to serve's environment.
func startKeptEnv(t testing.TB, dataDir string, env []string, args ...string) *keptServe {
	t.Helper()
	return startServeIn(t, dataDir, env, append([]string{"--keep-sessions", "--e2b=false"}, args...)...)
}

// startServeIn starts serve on dataDir (a real process: this test binary
// as the CLI), env added to its environment. The cleanup kills it (by its
// PID) if it is still running.
func startServeIn(t testing.TB, dataDir string, env []string, args ...string) *keptServe {
	t.Helper()
	cmd := cliCommand(t.Context(), append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir}, args...)...)
	cmd.Env = append(cmd.Env, env...)
	cmd.Cancel = func() error {
		if t.Failed() {
			// Its goroutines to stderr (a hang says what held it); then
			// it exits, or WaitDelay kills it.
			return cmd.Process.Signal(syscall.SIGQUIT)
		}
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &keptServe{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test's context is done: Cancel has stopped serve (SIGQUIT
		// if the test failed).
		if cmd.ProcessState == nil {
			cmd.Wait()
		}
		if t.Failed() {
			log, goroutines, _ := strings.Cut(s.stderr.String(), "SIGQUIT: quit")
			t.Logf("sandloop serve stderr (tail):\n%s", tail(log, 40))
			if goroutines != "" {
				t.Logf("sandloop serve's goroutines (SIGQUIT):\n%s", goroutines)
			}
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if m := servingRE.FindStringSubmatch(lines.Text()); m != nil {
			go io.Copy(io.Discard, stdout)
			s.url = m[1]
			return s
		}
	}
	cmd.Wait()
	t.Fatalf("sandloop serve did not start:\n%s", s.stderr.String())
	return nil
}

// kill9 kills serve with SIGKILL and reaps it.
func (s *keptServe) kill9() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// term stops serve with SIGTERM and waits for it (bounded).
func (s *keptServe) term(t testing.TB) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		<-done
		t.Fatal("serve did not stop within 60s of SIGTERM")
	}
}

// call makes one API request; body may be a string, an io.Reader or nil.
func (s *keptServe) call(method, path string, body any) (int, []byte, error) {
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case io.Reader:
		r = b
	}
	req, err := http.NewRequest(method, s.url+path, r)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

func (s *keptServe) mustCall(t testing.TB, method, path string, body any, want int) []byte {
	t.Helper()
	code, out, err := s.call(method, path, body)
	if err != nil || code != want {
		t.Fatalf("%s %s: %d %v: %s (want %d)", method, path, code, err, out, want)
	}
	return out
}

// execute runs code in session id and returns the result's main text/plain.
func (s *keptServe) execute(t testing.TB, id, code string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"code": code})
	out := s.mustCall(t, "POST", "/v1/sessions/"+id+"/execute", string(b), 200)
	var res struct {
		Status  string `json:"status"`
		Results []struct {
			Data map[string]string `json:"data"`
		} `json:"results"`
		Error *struct{ Name, Value string } `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != "ok" || len(res.Results) == 0 {
		t.Fatalf("execute %q in %s: %s", code, id, out)
	}
	return res.Results[0].Data["text/plain"]
}

func (s *keptServe) create(t testing.TB) string {
	t.Helper()
	var sess struct{ ID string }
	if err := json.Unmarshal(s.mustCall(t, "POST", "/v1/sessions", "{}", 201), &sess); err != nil {
		t.Fatal(err)
	}
	return sess.ID
}

// keeperPid is the PID of dataDir's keeper.
func keeperPid(t testing.TB, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "keeper", "keeper.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// keptRecord is what the keeper wrote of a session (sessions/ID.json).
type keptRecord struct {
	Workspace string `json:"workspace"`
	Jail      struct {
		Pid    int    `json:"pid"`
		Cgroup string `json:"cgroup"`
	} `json:"jail"`
}

func readKept(t testing.TB, dataDir, id string) keptRecord {
	t.Helper()
	var r keptRecord
	b, err := os.ReadFile(filepath.Join(dataDir, "keeper", "sessions", id+".json"))
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// childrenOf lists the PIDs whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			p, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
			out = append(out, p)
		}
	}
	return out
}

func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// stopKeeper ends dataDir's keeper (and so every jail it holds) by its
// PID and waits until it and its jails are gone.
func stopKeeper(t testing.TB, dataDir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "keeper", "keeper.pid"))
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || !strings.Contains(readFile(fmt.Sprintf("/proc/%d/cmdline", pid)), "sandloop-keeper") {
		return
	}
	kids := childrenOf(pid)
	// At the test's end, the workspaces its sessions left holding files
	// go (a sweep would spare them for jail.LeftoverGrace, for a server
	// to take their files).
	t.Cleanup(func() {
		left, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("sandloop-ws-%d.*-lasting-*", pid)))
		for _, p := range left {
			jail.RemoveLeftover(p, 0)
		}
	})
	syscall.Kill(pid, syscall.SIGKILL)
	testutil.WaitFor(t, 60*time.Second, func() error {
		for _, p := range append(kids, pid) {
			if processAlive(p) && !isZombie(p) {
				return fmt.Errorf("process %d is still running", p)
			}
		}
		return nil
	})
}

func readFile(p string) string { b, _ := os.ReadFile(p); return string(b) }

func isZombie(pid int) bool {
	s := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func needKeeper(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("serve --keep-sessions needs root (workspaces are host directories)")
	}
}

// TestKeepSessionsKill9 kills serve (SIGKILL) while it holds 20 live
// sessions, one in the middle of a cell and one in the middle of an
// upload, and starts it again on the same data directory: every session is
// back with its variables and files, the interrupted cell completes
// (its effects are there and its count taken), and the interrupted upload
// stored nothing.
func TestKeepSessionsKill9(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	const n = 20
	a := startKept(t, dataDir, "--pool", "2")
	ids := make([]string, n)
	for i := range ids {
		ids[i] = a.create(t)
		if got := a.execute(t, ids[i], fmt.Sprintf("v = %d * 7\nv", i)); got != strconv.Itoa(i*7) {
			t.Fatalf("session %d: v is %s", i, got)
		}
		a.mustCall(t, "PUT", "/v1/sessions/"+ids[i]+"/files/dir/f.txt", fmt.Sprintf("file %d", i), 201)
	}

	// Session 2's kernel was restarted (a new jail, kept again); session
	// 3 is paused.
	a.mustCall(t, "POST", "/v1/sessions/"+ids[2]+"/restart", "", 200)
	a.execute(t, ids[2], "v = 2 * 7\nrestarted = 'yes'\nv")
	a.mustCall(t, "POST", "/v1/sessions/"+ids[3]+"/pause", "", 200)
	// Session 4 holds a checkpoint (a dormant copy of its kernel): the
	// next server has no record of it and drops it.
	cg4 := readKept(t, dataDir, ids[4]).Jail.Cgroup
	procs4 := func() int {
		return len(strings.Fields(readFile("/sys/fs/cgroup/pids/" + cg4 + "/cgroup.procs")))
	}
	before := procs4()
	a.mustCall(t, "POST", "/v1/sessions/"+ids[4]+"/checkpoints", "{}", 201)
	if cg4 == "" || procs4() != before+1 {
		t.Logf("no v1 pids cgroup to count the checkpoint's process in (%q: %d, then %d): not checked", cg4, before, procs4())
		before = -1
	}

	// Session 0: a cell that runs for a while, streaming its output.
	cell := "import time, pathlib\nfor i in range(40):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\nfinished = 'yes'\npathlib.Path('done.txt').write_text('done')\n"
	b, _ := json.Marshal(map[string]any{"code": cell})
	req, _ := http.NewRequest("POST", a.url+"/v1/sessions/"+ids[0]+"/execute", bytes.NewReader(b))
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 64)
	if _, err := io.ReadAtLeast(resp.Body, first, 10); err != nil {
		t.Fatalf("the cell's stream: %v", err)
	}
	if !strings.Contains(string(first), "tick") {
		t.Fatalf("the cell's stream began with %q", first)
	}

	// Session 1: an upload the server has begun to store when it dies.
	ws1 := readKept(t, dataDir, ids[1]).Workspace
	pr, pw := io.Pipe()
	upload := make(chan error, 1)
	go func() {
		_, _, err := a.call("PUT", "/v1/sessions/"+ids[1]+"/files/big.bin", pr)
		upload <- err
	}()
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	go func() {
		for range 16 { // 1 MiB, then the body stays open
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		tmps, _ := filepath.Glob(filepath.Join(ws1, ".sandloop-upload-*"))
		for _, p := range tmps {
			if fi, err := os.Stat(p); err == nil && fi.Size() > 0 {
				return nil
			}
		}
		return errors.New("the upload has not begun to be stored")
	})

	var workspaces []string
	for _, id := range ids {
		workspaces = append(workspaces, readKept(t, dataDir, id).Workspace)
	}
	a.kill9()
	pw.CloseWithError(errors.New("the server is gone"))
	<-upload
	// Session 5 dies while no server holds it: the session comes back
	// from storage, with the files its workspace held (taken, then the
	// workspace removed).
	dead := readKept(t, dataDir, ids[5])
	syscall.Kill(dead.Jail.Pid, syscall.SIGKILL)
	testutil.WaitFor(t, 30*time.Second, func() error {
		if processAlive(dead.Jail.Pid) && !isZombie(dead.Jail.Pid) {
			return errors.New("session 5's jail is still running")
		}
		if _, err := os.Stat(filepath.Join(dataDir, "keeper", "sessions", ids[5]+".json")); err == nil {
			return errors.New("the keeper still holds session 5's record")
		}
		return nil
	})
	deadID := ids[5]
	ids = slices.Delete(ids, 5, 6)
	vals := make([]int, 0, n-1)
	for i := range n {
		if i != 5 {
			vals = append(vals, i)
		}
	}

	bserve := startKept(t, dataDir, "--pool", "2")
	// It comes back from storage, asleep, on its id; it was lost before
	// its first automatic snapshot (30s): its first use says its
	// variables were lost, not its files.
	var deadSess struct{ State string }
	json.Unmarshal(bserve.mustCall(t, "GET", "/v1/sessions/"+deadID, nil, 200), &deadSess)
	if deadSess.State != "hibernated" {
		t.Errorf("the dead session after the restart: state %q, want hibernated", deadSess.State)
	}
	if resp, err := http.Post(bserve.url+"/v1/sessions/"+deadID+"/execute", "application/json", strings.NewReader(`{"code":"1"}`)); err != nil {
		t.Error(err)
	} else {
		resp.Body.Close()
		if said := resp.Header.Get("Sandloop-Restored"); resp.StatusCode != 200 || !strings.Contains(said, "lost: its variables") || !strings.Contains(said, "files exact as of ") {
			t.Errorf("the dead session's first use after the restart: %d, Sandloop-Restored %q (want what was lost)", resp.StatusCode, said)
		}
	}
	if _, err := os.Stat(dead.Workspace); err == nil {
		t.Errorf("the dead session's workspace %s is left", dead.Workspace)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out, err := bserve.call("GET", "/v1/sessions/"+id, nil)
			if err != nil || code != 200 {
				errs <- fmt.Errorf("session %d after the restart: %d %v %s", i, code, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for j, id := range ids {
		i := vals[j]
		if got := bserve.execute(t, id, "v"); got != strconv.Itoa(i*7) {
			t.Errorf("session %d: v is %s after the restart, want %d", i, got, i*7)
		}
		if got := string(bserve.mustCall(t, "GET", "/v1/sessions/"+id+"/files/dir/f.txt", nil, 200)); got != fmt.Sprintf("file %d", i) {
			t.Errorf("session %d: f.txt holds %q after the restart", i, got)
		}
	}
	if before >= 0 {
		testutil.WaitFor(t, 30*time.Second, func() error {
			if n := procs4(); n != before {
				return fmt.Errorf("session 4 has %d processes, %d before its checkpoint", n, before)
			}
			return nil
		})
	}
	if got := bserve.execute(t, ids[2], "restarted"); got != "'yes'" {
		t.Errorf("the restarted session: restarted = %s", got)
	}
	// The cell that was running completed: its effects are there, and the
	// next cell waited for it.
	if got := bserve.execute(t, ids[0], "finished"); got != "'yes'" {
		t.Errorf("the interrupted cell: finished = %s", got)
	}
	if got := string(bserve.mustCall(t, "GET", "/v1/sessions/"+ids[0]+"/files/done.txt", nil, 200)); got != "done" {
		t.Errorf("the interrupted cell's file holds %q", got)
	}
	// The upload stored nothing: no file, no temporary file.
	bserve.mustCall(t, "GET", "/v1/sessions/"+ids[1]+"/files/big.bin", nil, 404)
	if tmps, _ := filepath.Glob(filepath.Join(ws1, ".sandloop-upload-*")); len(tmps) > 0 {
		t.Errorf("the cut upload left %v", tmps)
	}
	for _, id := range append(ids, deadID) {
		bserve.mustCall(t, "DELETE", "/v1/sessions/"+id, nil, 204)
	}
	bserve.term(t)
	// Closed sessions leave nothing: no record, no workspace.
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(dataDir, "keeper", "sessions", id+".json")); err == nil {
			t.Errorf("session %s: its record is still kept after DELETE", id)
		}
	}
	for _, ws := range append(workspaces, dead.Workspace) {
		if _, err := os.Stat(ws); err == nil {
			t.Errorf("workspace %s is still there after DELETE", ws)
		}
	}
}

// TestKeepSessionsSIGTERM stops serve with SIGTERM (an upgrade) while a
// client streams a cell's events: the stream ends, the session stays in
// the keeper, and the next serve has it, the cell completed.
func TestKeepSessionsSIGTERM(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKept(t, dataDir, "--pool", "0")
	id := a.create(t)
	a.execute(t, id, "before = 1\nbefore")
	// An allow-mode session: its egress proxy is served again after the
	// restart (a gate of the new server's on the same listener).
	var allow struct{ ID string }
	if err := json.Unmarshal(a.mustCall(t, "POST", "/v1/sessions", `{"network":"allow","allow":["pypi"]}`, 201), &allow); err != nil {
		t.Fatal(err)
	}
	const ask = "import socket\ns = socket.create_connection(('127.0.0.1', 3128))\ns.sendall(b'CONNECT example.invalid:443 HTTP/1.1\\r\\nHost: example.invalid:443\\r\\n\\r\\n')\ns.recv(200).decode()"
	if got := a.execute(t, allow.ID, ask); !strings.Contains(got, "403") || !strings.Contains(got, "not allowed") {
		t.Fatalf("the egress proxy answered %s", got)
	}
	cell := "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\nafter = 2\n"
	b, _ := json.Marshal(map[string]any{"code": cell})
	req, _ := http.NewRequest("POST", a.url+"/v1/sessions/"+id+"/execute", bytes.NewReader(b))
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() || !strings.Contains(lines.Text(), "tick") {
		t.Fatalf("the stream began with %q (%v)", lines.Text(), lines.Err())
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	// The stream ends (it does not wait for the cell): with an end event
	// that says why, or cut.
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if last != "" && !strings.Contains(last, `"end"`) {
		t.Errorf("the stream's last line: %s", last)
	}
	a.term(t)
	bserve := startKept(t, dataDir, "--pool", "0")
	// Its history goes on from the server before, saying how it came back.
	var evs struct {
		Events []struct {
			Seq               int64
			Type, How, Reason string
		}
	}
	if err := json.Unmarshal(bserve.mustCall(t, "GET", "/v1/sessions/"+id+"/events", nil, 200), &evs); err != nil ||
		len(evs.Events) < 2 || evs.Events[0].Type != "created" || evs.Events[0].Seq != 1 || evs.Events[len(evs.Events)-1].Type != "taken_over" {
		t.Errorf("a taken-over session's events: %+v %v", evs, err)
	}
	if got := bserve.execute(t, id, "(before, after)"); got != "(1, 2)" {
		t.Errorf("after the upgrade: (before, after) = %s", got)
	}
	if got := bserve.execute(t, allow.ID, ask); !strings.Contains(got, "403") || !strings.Contains(got, "not allowed") {
		t.Errorf("after the upgrade the egress proxy answered %s", got)
	}
	bserve.mustCall(t, "DELETE", "/v1/sessions/"+id, nil, 204)
	bserve.mustCall(t, "DELETE", "/v1/sessions/"+allow.ID, nil, 204)
	bserve.term(t)
}

// TestKeepSessionsKeeperKilled kills the keeper: its sessions end with it
// (their kernels report it; restoring them from snapshots is for later),
// new sessions go to a new keeper, and once the dead sessions are deleted
// nothing of them is left: no process, no workspace, no cgroup.
func TestKeepSessionsKeeperKilled(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKept(t, dataDir, "--pool", "1")
	var ids []string
	var recs []keptRecord
	for range 3 {
		id := a.create(t)
		a.execute(t, id, "x = 1\nx")
		ids = append(ids, id)
		recs = append(recs, readKept(t, dataDir, id))
	}
	old := keeperPid(t, dataDir)
	kids := childrenOf(old)
	if len(kids) < len(ids) {
		t.Fatalf("the keeper holds %d processes, want at least %d", len(kids), len(ids))
	}
	for _, r := range recs {
		if !processAlive(r.Jail.Pid) {
			t.Fatalf("jail %d is not running", r.Jail.Pid)
		}
	}
	stopKeeper(t, dataDir)
	for _, id := range ids {
		// Before serve has seen the death: killed (or busy); after it: the
		// session is asleep and wakes with its files but no variables (its
		// first automatic snapshot was not due yet), and says so.
		b, _ := json.Marshal(map[string]any{"code": "x"})
		code, out, err := a.call("POST", "/v1/sessions/"+id+"/execute", string(b))
		if err == nil && code == 200 && strings.Contains(string(out), "NameError") {
			_, info, _ := a.call("GET", "/v1/sessions/"+id, "")
			if !strings.Contains(string(info), `"lost":"its variables`) {
				t.Errorf("session %s woke empty without saying so: %s", id, info)
			}
			continue
		}
		if err != nil || (code == 200 && !strings.Contains(string(out), `"killed"`)) || (code != 200 && code != 409) {
			t.Errorf("session %s after its keeper died: %d %v %s", id, code, err, out)
		}
	}
	// A new session goes to a new keeper.
	fresh := a.create(t)
	if got := a.execute(t, fresh, "6*7"); got != "42" {
		t.Errorf("a new session after the keeper died: %s", got)
	}
	if pid := keeperPid(t, dataDir); pid == old {
		t.Errorf("no new keeper")
	}
	for _, id := range append(ids, fresh) {
		a.mustCall(t, "DELETE", "/v1/sessions/"+id, nil, 204)
	}
	a.term(t)
	mounts := readFile("/proc/self/mountinfo")
	for _, r := range recs {
		if processAlive(r.Jail.Pid) && !isZombie(r.Jail.Pid) {
			t.Errorf("jail %d is still running", r.Jail.Pid)
		}
		if _, err := os.Stat(r.Workspace); err == nil {
			t.Errorf("workspace %s is left", r.Workspace)
		}
		if strings.Contains(mounts, " "+r.Workspace+" ") {
			t.Errorf("workspace %s is still mounted", r.Workspace)
		}
		if r.Jail.Cgroup == "" {
			continue
		}
		groups, _ := filepath.Glob("/sys/fs/cgroup/*/" + r.Jail.Cgroup)
		if g, _ := filepath.Glob("/sys/fs/cgroup/" + r.Jail.Cgroup); len(g) > 0 {
			groups = append(groups, g...)
		}
		if len(groups) > 0 {
			t.Errorf("cgroups left: %v", groups)
		}
	}
}
