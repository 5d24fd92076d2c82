package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// restoreFixture is what a test puts in a session before its processes
// are lost, and checks after.
type restoreFixture struct {
	id     string
	x      int
	hashes map[string]string // path -> sha256, as the files API serves them
}

// sessionRecord is what the server keeps of a session for the next one
// (DATA/session-records/ID.json).
type sessionRecord struct {
	Snapshot string    `json:"snapshot"`
	UsedAt   time.Time `json:"used_at"`
}

func readSessionRecord(dataDir, id string) (sessionRecord, error) {
	var r sessionRecord
	b, err := os.ReadFile(filepath.Join(dataDir, "session-records", id+".json"))
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	return r, err
}

// fillSession makes a session with files (one uploaded through the files
// API, others written by a cell) and variables, and waits until its
// automatic snapshot holds them all.
func fillSession(t *testing.T, s *keptServe, dataDir string, x int) restoreFixture {
	t.Helper()
	f := restoreFixture{id: s.create(t), x: x, hashes: map[string]string{}}
	blob := make([]byte, 1<<20)
	rand.Read(blob)
	s.mustCall(t, "PUT", "/v1/sessions/"+f.id+"/files/data/upload.bin", string(blob), 201)
	got := s.execute(t, f.id, fmt.Sprintf(`import os
x = %d
d = {"k": [1, 2, 3], "s": "é"}
os.makedirs("deep/er", exist_ok=True)
open("deep/er/notes.txt", "w").write("notes %d\n" * 1000)
open("made.bin", "wb").write(os.urandom(300000))
x`, x, x))
	if got != fmt.Sprint(x) {
		t.Fatalf("x = %s", got)
	}
	for _, p := range []string{"data/upload.bin", "deep/er/notes.txt", "made.bin"} {
		f.hashes[p] = fileHash(t, s, f.id, p)
	}
	testutil.WaitFor(t, 120*time.Second, func() error {
		r, err := readSessionRecord(dataDir, f.id)
		if err != nil {
			return err
		}
		if r.Snapshot == "" || !r.UsedAt.IsZero() {
			return fmt.Errorf("session %s: no automatic snapshot since its last use yet (%+v)", f.id, r)
		}
		return nil
	})
	return f
}

// fileHash downloads path from session id and hashes it.
func fileHash(t *testing.T, s *keptServe, id, path string) string {
	t.Helper()
	out := s.mustCall(t, "GET", "/v1/sessions/"+id+"/files/"+path, nil, 200)
	h := sha256.Sum256(out)
	return hex.EncodeToString(h[:])
}

// checkRestored checks that session f came back: the first request says
// what came back (header), its variables and files are the same.
func checkRestored(t *testing.T, s *keptServe, f restoreFixture, wantLost bool) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"code": "x, d['s'], sorted(d)"})
	req, _ := http.NewRequest("POST", s.url+"/v1/sessions/"+f.id+"/execute", strings.NewReader(string(b)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("session %s after the restart: %d %s", f.id, resp.StatusCode, out)
	}
	said := resp.Header.Get("Sandloop-Restored")
	for _, want := range []string{"files exact ", "variables restored: ", "x"} {
		if !strings.Contains(said, want) {
			t.Errorf("session %s: Sandloop-Restored %q does not say %q", f.id, said, want)
		}
	}
	if wantLost && !strings.Contains(said, "as of ") {
		t.Errorf("session %s: Sandloop-Restored %q does not say as of when", f.id, said)
	}
	if !wantLost && strings.Contains(said, "lost: ") {
		t.Errorf("session %s: Sandloop-Restored %q says something was lost", f.id, said)
	}
	if want := fmt.Sprintf(`(%d, 'é', ['k', 's'])`, f.x); !strings.Contains(string(out), want) {
		t.Errorf("session %s: variables after the restore: %s (want %s)", f.id, out, want)
	}
	for p, h := range f.hashes {
		if got := fileHash(t, s, f.id, p); got != h {
			t.Errorf("session %s: %s has sha256 %s after the restore, %s before", f.id, p, got, h)
		}
	}
	var sess struct {
		Restored *struct {
			From string    `json:"from"`
			AsOf time.Time `json:"as_of"`
			Lost string    `json:"lost"`
		} `json:"restored"`
	}
	json.Unmarshal(s.mustCall(t, "GET", "/v1/sessions/"+f.id, nil, 200), &sess)
	if sess.Restored == nil || sess.Restored.From == "" {
		t.Errorf("session %s: GET says nothing of the restore", f.id)
	} else if wantLost && sess.Restored.AsOf.IsZero() {
		t.Errorf("session %s: restored %+v: no as_of", f.id, sess.Restored)
	}
}

// TestKeeperKilledSessionsRestored kills the keeper (SIGKILL, by its PID)
// holding sessions with files and variables, then restarts serve on the
// same data directory: every session is back on its id from its
// automatic snapshot, files exact (sha256 of each, through the files
// API) and variables restored, and the first response says what came
// back. Once with serve stopped by SIGTERM after the keeper's death, once
// with serve and keeper both killed (-9), once with a serve that keeps no
// sessions (--keep-sessions=false: its sessions are its own) killed (-9).
// A session used after its last snapshot says what was lost: its
// variables set since, not the file it wrote since, which its workspace
// (outliving the processes, the host up) still held.
func TestKeeperKilledSessionsRestored(t *testing.T) {
	needKeeper(t)
	for _, tc := range []struct {
		name  string
		first []string // the first serve's own flags
		stop  func(t *testing.T, s *keptServe, dataDir string)
	}{
		{"keeper-killed-then-sigterm", nil, func(t *testing.T, s *keptServe, dataDir string) {
			stopKeeper(t, dataDir)
			s.term(t)
		}},
		{"serve-and-keeper-killed", nil, func(t *testing.T, s *keptServe, dataDir string) {
			s.kill9()
			stopKeeper(t, dataDir)
		}},
		{"serve-without-keeper-killed", []string{"--keep-sessions=false"}, func(t *testing.T, s *keptServe, dataDir string) {
			s.kill9()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			t.Cleanup(func() { stopKeeper(t, dataDir) })
			a := startKept(t, dataDir, append(tc.first, "--pool", "0", "--snapshot-every", "200ms")...)
			var fs []restoreFixture
			for i := range 3 {
				fs = append(fs, fillSession(t, a, dataDir, 40+i))
			}
			// Used after its snapshot, in a cell still running (no
			// snapshot is written while a cell runs) when the processes
			// are lost: the restore must say that what came after is
			// lost, its variables, not the file it wrote.
			go func() {
				b, _ := json.Marshal(map[string]any{"code": "import time\nz = 3\nopen('late.txt', 'w').write('late')\ntime.sleep(600)"})
				a.call("POST", "/v1/sessions/"+fs[0].id+"/execute", string(b)) // (ends with the processes)
			}()
			testutil.WaitFor(t, 60*time.Second, func() error {
				if code, _, err := a.call("GET", "/v1/sessions/"+fs[0].id+"/files/late.txt", nil); err != nil || code != 200 {
					return fmt.Errorf("the long cell has not written its file: %d %v", code, err)
				}
				return nil
			})
			tc.stop(t, a, dataDir)

			b := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "200ms")
			var list struct{ Sessions []struct{ ID string } }
			json.Unmarshal(b.mustCall(t, "GET", "/v1/sessions", nil, 200), &list)
			if len(list.Sessions) != len(fs) {
				t.Errorf("%d sessions after the restart, want %d: %+v", len(list.Sessions), len(fs), list)
			}
			for _, f := range fs {
				checkRestored(t, b, f, true)
			}
			if got := b.mustCall(t, "GET", "/v1/sessions/"+fs[0].id+"/files/late.txt", nil, 200); string(got) != "late" {
				t.Errorf("the file written after the last snapshot: %q", got)
			}
			// Restored sessions are kept and snapshotted again: a new
			// variable survives one more loss.
			b.execute(t, fs[1].id, "y = 7\ny")
			testutil.WaitFor(t, 120*time.Second, func() error {
				if r, err := readSessionRecord(dataDir, fs[1].id); err != nil || !r.UsedAt.IsZero() {
					return fmt.Errorf("no new snapshot of %s yet: %+v %v", fs[1].id, r, err)
				}
				return nil
			})
			b.kill9()
			stopKeeper(t, dataDir)
			c := startKept(t, dataDir, "--pool", "0")
			if got := c.execute(t, fs[1].id, "x + y"); got != fmt.Sprint(fs[1].x+7) {
				t.Errorf("after a second loss: x + y = %s", got)
			}
			// A deleted session is gone for good: its record and its
			// snapshot too.
			for _, f := range fs {
				c.mustCall(t, "DELETE", "/v1/sessions/"+f.id, nil, 204)
				if _, err := readSessionRecord(dataDir, f.id); !os.IsNotExist(err) {
					t.Errorf("session %s deleted: its record is left (%v)", f.id, err)
				}
			}
			c.term(t)
			d := startKept(t, dataDir, "--pool", "0")
			json.Unmarshal(d.mustCall(t, "GET", "/v1/sessions", nil, 200), &list)
			if len(list.Sessions) != 0 {
				t.Errorf("deleted sessions came back: %+v", list)
			}
			d.term(t)
		})
	}
}

// TestHibernatedSessionAdoptedAfterRestart hibernates a session, then
// kills serve (-9) and, another time, stops it with SIGTERM: the next
// serve still holds the session, hibernated, and it wakes on its id with
// its files and variables, saying so; nothing was lost.
func TestHibernatedSessionAdoptedAfterRestart(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "-1s")
	f := restoreFixture{id: a.create(t), x: 5, hashes: map[string]string{}}
	a.mustCall(t, "PUT", "/v1/sessions/"+f.id+"/files/a.txt", "hello", 201)
	a.execute(t, f.id, "x = 5\nd = {'k': 1, 's': 'é'}\nx")
	f.hashes["a.txt"] = fileHash(t, a, f.id, "a.txt")
	a.mustCall(t, "POST", "/v1/sessions/"+f.id+"/hibernate", nil, 200)
	a.kill9()
	b := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "-1s")
	var sess struct{ State string }
	json.Unmarshal(b.mustCall(t, "GET", "/v1/sessions/"+f.id, nil, 200), &sess)
	if sess.State != "hibernated" {
		t.Errorf("after kill -9: state %q, want hibernated", sess.State)
	}
	checkRestored(t, b, f, false)
	b.mustCall(t, "POST", "/v1/sessions/"+f.id+"/hibernate", nil, 200)
	b.term(t)
	c := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "-1s")
	checkRestored(t, c, f, false)
	c.mustCall(t, "DELETE", "/v1/sessions/"+f.id, nil, 204)
	c.term(t)
}

// TestKeeperInitNoexec puts serve's cached small init on a noexec mount
// (a tmpfs of the test's own, through SANDLOOP_INIT_CACHE: the machine's
// /run/sandloop is not touched): the keeper cannot execute it, and falls
// back to its own binary; sessions start and run.
func TestKeeperInitNoexec(t *testing.T) {
	needKeeper(t)
	dir := filepath.Join(t.TempDir(), "noexec")
	os.Mkdir(dir, 0o755)
	for d := filepath.Dir(dir); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // the sandbox user reaches it: only noexec stops it
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "noexec,size=64m,mode=755", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKeptEnv(t, dataDir, []string{"SANDLOOP_INIT_CACHE=" + dir}, "--pool", "0")
	id := a.create(t)
	if got := a.execute(t, id, "6*7"); got != "42" {
		t.Errorf("6*7 = %s", got)
	}
	inits, _ := filepath.Glob(filepath.Join(dir, "sandloop-init-*"))
	if len(inits) == 0 {
		t.Errorf("no init was cached in %s: the noexec mount was not tried", dir)
	}
	a.mustCall(t, "DELETE", "/v1/sessions/"+id, nil, 204)
	a.term(t)
}

// TestKeeperKilledUnderRunningServe kills the keeper (SIGKILL, by its
// PID) while serve keeps running, with sessions holding files and
// variables, one with a cell running and one never snapshotted: without
// a restart of serve, each session goes to sleep on its files as they
// were (its workspace outlived the keeper), written to a new automatic
// snapshot with the variables of its latest one, and answers on its id,
// files exact (sha256; one written after the latest snapshot too) and
// variables back, the first response saying what came back, as of when
// and what was lost; the cell in flight ends "killed"; the session never
// snapshotted comes back empty, saying its variables were lost. A new keeper
// holds the sessions woken and new ones: a woken session survives a kill
// of serve (-9) alive, taken over rather than restored.
func TestKeeperKilledUnderRunningServe(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "200ms")
	var fs []restoreFixture
	for i := range 2 {
		fs = append(fs, fillSession(t, a, dataDir, 60+i))
	}
	empty := a.create(t) // never used: never snapshotted
	if r, err := readSessionRecord(dataDir, empty); err != nil || r.Snapshot != "" {
		t.Fatalf("the unused session's record: %+v %v", r, err)
	}
	// A cell runs in fs[0] when the keeper dies.
	type reply struct {
		code int
		out  []byte
		err  error
	}
	inflight := make(chan reply, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": "import time\nopen('started', 'w').write('1')\ntime.sleep(600)"})
		code, out, err := a.call("POST", "/v1/sessions/"+fs[0].id+"/execute", string(b))
		inflight <- reply{code, out, err}
	}()
	testutil.WaitFor(t, 60*time.Second, func() error {
		code, _, err := a.call("GET", "/v1/sessions/"+fs[0].id+"/files/started", nil)
		if err != nil || code != 200 {
			return fmt.Errorf("the long cell has not started: %d %v", code, err)
		}
		return nil
	})
	old := keeperPid(t, dataDir)
	stopKeeper(t, dataDir)

	var r reply
	select {
	case r = <-inflight:
	case <-time.After(120 * time.Second):
		t.Fatal("the cell running when the keeper died did not end")
	}
	if r.err != nil || r.code != 200 || !strings.Contains(string(r.out), `"killed"`) {
		t.Errorf("the cell running when the keeper died: %d %s %v (want status killed)", r.code, r.out, r.err)
	}
	for _, id := range []string{fs[0].id, fs[1].id, empty} {
		testutil.WaitFor(t, 120*time.Second, func() error {
			var sess struct{ State string }
			json.Unmarshal(a.mustCall(t, "GET", "/v1/sessions/"+id, nil, 200), &sess)
			if sess.State != "hibernated" {
				return fmt.Errorf("session %s: state %q, want hibernated (asleep on its snapshot)", id, sess.State)
			}
			return nil
		})
	}
	for _, f := range fs {
		checkRestored(t, a, f, true)
	}
	// Written by the long cell after fs[0]'s latest snapshot: kept.
	if out := a.mustCall(t, "GET", "/v1/sessions/"+fs[0].id+"/files/started", nil, 200); string(out) != "1" {
		t.Errorf("the file written after the latest snapshot came back as %q, want \"1\"", out)
	}
	if pid := keeperPid(t, dataDir); pid == old || !processAlive(pid) {
		t.Errorf("no new keeper after the wakes: pid %d (the dead one %d)", pid, old)
	}
	// fs[0] was used after its snapshot (the long cell): the wake says so.
	var sess struct {
		Restored *struct{ Lost string } `json:"restored"`
	}
	json.Unmarshal(a.mustCall(t, "GET", "/v1/sessions/"+fs[0].id, nil, 200), &sess)
	if sess.Restored == nil || !strings.Contains(sess.Restored.Lost, "after ") {
		t.Errorf("session %s, used after its snapshot: restored %+v does not say what was lost", fs[0].id, sess.Restored)
	}

	// Never snapshotted: it comes back empty, saying so.
	b, _ := json.Marshal(map[string]any{"code": "import os\nsorted(os.listdir('.')), 'x' in globals()"})
	req, _ := http.NewRequest("POST", a.url+"/v1/sessions/"+empty+"/execute", strings.NewReader(string(b)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if said := resp.Header.Get("Sandloop-Restored"); resp.StatusCode != 200 || !strings.Contains(said, "lost: its variables") {
		t.Errorf("the session never snapshotted: %d, Sandloop-Restored %q (want lost: its variables): %s", resp.StatusCode, said, out)
	}
	if !strings.Contains(string(out), "([], False)") {
		t.Errorf("the session never snapshotted is not empty: %s", out)
	}

	// The new keeper holds the woken sessions and new ones: they
	// survive serve's death alive (taken over, nothing restored).
	a.execute(t, fs[1].id, "z = 99\nz")
	fresh := a.create(t)
	a.execute(t, fresh, "w = 5\nw")
	a.kill9()
	c := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "200ms")
	for id, want := range map[string]string{fs[1].id: fmt.Sprint(fs[1].x + 99), fresh: "5"} {
		code := map[bool]string{true: "x + z", false: "w"}[id == fs[1].id]
		b, _ := json.Marshal(map[string]any{"code": code})
		req, _ := http.NewRequest("POST", c.url+"/v1/sessions/"+id+"/execute", strings.NewReader(string(b)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(out), `"text/plain":"`+want+`"`) {
			t.Errorf("session %s after serve's death: %d %s (want %s)", id, resp.StatusCode, out, want)
		}
		if said := resp.Header.Get("Sandloop-Restored"); said != "" {
			t.Errorf("session %s after serve's death was restored (%q), not taken over alive from the new keeper", id, said)
		}
	}
	// (Deleted: a workspace left holding files when the cleanup stops
	// the keeper would wait out its grace for a server to take it.)
	for _, id := range []string{fs[0].id, fs[1].id, empty, fresh} {
		c.mustCall(t, "DELETE", "/v1/sessions/"+id, nil, 204)
	}
	c.term(t)
}

// TestKeptKernelDiedWhileServeDown: serve is killed (-9), its keeper runs
// on, and a session's jail ends before the next serve (here killed by its
// PID, as the memory limit or a crash would end it): the keeper forgets
// it, and the next serve restores it from its latest snapshot, with the
// files its workspace held when it ended (written after that snapshot,
// by a cell still running when serve died), not only those of the
// snapshot, saying so; the other session is taken over alive.
func TestKeptKernelDiedWhileServeDown(t *testing.T) {
	needKeeper(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { stopKeeper(t, dataDir) })
	a := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "200ms")
	lost, alive := fillSession(t, a, dataDir, 70), fillSession(t, a, dataDir, 71)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": "import time\nz = 3\nopen('late.txt', 'w').write('late')\ntime.sleep(600)"})
		a.call("POST", "/v1/sessions/"+lost.id+"/execute", string(b)) // (ends with serve)
	}()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if code, _, err := a.call("GET", "/v1/sessions/"+lost.id+"/files/late.txt", nil); err != nil || code != 200 {
			return fmt.Errorf("the long cell has not written its file: %d %v", code, err)
		}
		return nil
	})
	a.kill9()
	jailPid := readKept(t, dataDir, lost.id).Jail.Pid
	if err := syscall.Kill(jailPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(dataDir, "keeper", "sessions", lost.id+".json")); err == nil {
			return fmt.Errorf("the keeper still holds session %s (jail %d)", lost.id, jailPid)
		}
		return nil
	})

	b := startKept(t, dataDir, "--pool", "0", "--snapshot-every", "200ms")
	checkRestored(t, b, lost, true)
	if got := b.mustCall(t, "GET", "/v1/sessions/"+lost.id+"/files/late.txt", nil, 200); string(got) != "late" {
		t.Errorf("the file written after the last snapshot: %q", got)
	}
	var sess struct {
		Restored *struct {
			FilesAsOf time.Time `json:"files_as_of"`
			Lost      string    `json:"lost"`
		} `json:"restored"`
	}
	json.Unmarshal(b.mustCall(t, "GET", "/v1/sessions/"+lost.id, nil, 200), &sess)
	if sess.Restored == nil || sess.Restored.FilesAsOf.IsZero() || !strings.Contains(sess.Restored.Lost, "variables set after") {
		t.Errorf("restored %+v: want its files as of its end, its variables set after the snapshot lost", sess.Restored)
	}
	if got := b.execute(t, alive.id, "x"); got != fmt.Sprint(alive.x) {
		t.Errorf("the session alive in the keeper: x = %s", got)
	}
	// (Deleted: a workspace left holding files when the cleanup stops
	// the keeper would wait out its grace for a server to take it.)
	for _, f := range []restoreFixture{lost, alive} {
		b.mustCall(t, "DELETE", "/v1/sessions/"+f.id, nil, 204)
	}
	b.term(t)
}
