package e2b

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
)

// A sandbox's first command is served by the join made ahead when it was
// created (once the server has seen a command: before, a new sandbox
// makes none), the next one's is made after it, and killing the sandbox
// leaves nothing of it: no process, no cgroup. With ColdCommands none is
// made.
func TestCommandsJoinMadeAhead(t *testing.T) {
	t.Parallel()
	for _, cold := range []bool{false, true} {
		t.Run(fmt.Sprintf("cold=%v", cold), func(t *testing.T) {
			ts := newTestServer(t, Options{ColdCommands: cold})
			// No command yet on this server: a sandbox that may only run
			// code gets no join made ahead.
			first := ts.create(t, keyA, `{}`)
			time.Sleep(3 * prepareAfter)
			if pids := ts.h.lookup(first.SandboxID).ms.PreparedPids(); pids != nil {
				t.Fatalf("a join was made ahead before any command: %v", pids)
			}
			ts.stream(t, first, "process.Process/Start", bash(`true`, nil))
			c := ts.create(t, keyA, `{}`)
			sb := ts.h.lookup(c.SandboxID)
			ready := func() ([]int, error) {
				if pids := sb.ms.PreparedPids(); pids != nil {
					return pids, nil
				}
				return nil, errors.New("no join made ahead")
			}
			if !cold {
				testutil.WaitFor(t, 60*time.Second, func() error { _, err := ready(); return err })
			}
			msgs, _ := ts.stream(t, c, "process.Process/Start", bash(`echo "$PER $(pwd)"`, nil))
			if _, out, errOut, end := events(t, msgs); out != "cmd /home/user\n" || errOut != "" || end["status"] != "exit status 0" {
				t.Fatalf("command: stdout %q stderr %q end %v", out, errOut, end)
			}
			if n, want := sb.ms.PreparedCommands(), map[bool]int64{false: 1, true: 0}[cold]; n != want {
				t.Fatalf("%d commands served by a join made ahead, want %d", n, want)
			}
			if cold {
				time.Sleep(3 * prepareAfter)
				if pids := sb.ms.PreparedPids(); pids != nil {
					t.Fatalf("a join was made ahead with ColdCommands: %v", pids)
				}
				return
			}
			// The next command's, made after this one ended.
			var pids []int
			testutil.WaitFor(t, 60*time.Second, func() (err error) { pids, err = ready(); return err })
			var groups []string
			for _, pid := range pids {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
					// hierarchy-id:controllers:path; the jail's leaf in
					// the v1 pids hierarchy (this host's), or v2's.
					f := strings.SplitN(line, ":", 3)
					if len(f) == 3 && f[1] == "pids" && f[2] != "/" {
						groups = append(groups, filepath.Join("/sys/fs/cgroup/pids", f[2]))
					} else if len(f) == 3 && f[0] == "0" && !strings.Contains(string(b), ":pids:") {
						groups = append(groups, filepath.Join("/sys/fs/cgroup", f[2]))
					}
				}
			}
			if len(groups) == 0 {
				t.Fatalf("the join made ahead is in no cgroup of its own")
			}
			if resp, b := ts.control(t, "DELETE", "/sandboxes/"+c.SandboxID, "", keyA); resp.StatusCode != 204 {
				t.Fatalf("kill: %d %s", resp.StatusCode, b)
			}
			testutil.WaitFor(t, 60*time.Second, func() error {
				for _, pid := range pids {
					if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
						return fmt.Errorf("process %d of the join made ahead is left", pid)
					}
				}
				for _, g := range groups {
					if _, err := os.Stat(g); err == nil {
						return fmt.Errorf("cgroup %s is left", g)
					}
				}
				return nil
			})
		})
	}
}
