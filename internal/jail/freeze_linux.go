package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Pausing a jail: every process of it stops where it is, keeping its
// memory, and uses no CPU until it is thawed. In order of preference:
//
//   - cgroup v2: the group's cgroup.freeze, waiting for cgroup.events to
//     say "frozen 1";
//   - cgroup v1: the freezer hierarchy (a group of its own per jail, made
//     beside the memory, pids and CPU ones where the hierarchy is mounted
//     and writable), waiting for freezer.state to say FROZEN;
//   - elsewhere (no freezer, or no cgroup at all): SIGSTOP to every
//     process of the jail (those of its cgroup, or the init's descendants
//     without one), again until none is left running, and SIGCONT to thaw.
//     A process's parent can see the stop (waitpid with WUNTRACED), and a
//     process forked between two passes is caught by the next one.
//
// A task frozen by the v1 freezer does not die of SIGKILL until it is
// thawed (the signal stays pending): killing a jail therefore always
// thaws it after the SIGKILLs, and the startup sweep of groups left by a
// sandloop that died thaws the frozen ones whose processes all wait on a
// SIGKILL (the jail's init gets one when its parent dies: Pdeathsig),
// so that they end and their groups can be removed.

// freezeWait bounds how long freezing waits for every task to stop: a
// task in an uninterruptible wait (a page fault on a slow disk) delays
// it. Past it the group is thawed again and freezing fails.
const freezeWait = 5 * time.Second

// FreezeMethod says how jails are paused on this host: "cgroup v2
// freezer", "cgroup v1 freezer" or "SIGSTOP".
func FreezeMethod() string {
	h := detectCgroups()
	switch {
	case h.mode == "cgroup v2" && v2Freezer(h.v2):
		return "cgroup v2 freezer"
	case h.mode == "cgroup v1" && h.freezer != "":
		return "cgroup v1 freezer"
	}
	return "SIGSTOP"
}

// v2Freezer says whether the groups made under dir have cgroup.freeze
// (kernel 5.2 and later). The root of a cgroup namespace (a container's
// own group) has none of its own: its children tell.
func v2Freezer(dir string) bool {
	if exists(filepath.Join(dir, "cgroup.freeze")) {
		return true
	}
	kids, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.freeze"))
	return len(kids) > 0
}

// FreezeSupport reports FreezeMethod as a doctor's check: SIGSTOP is a
// fallback.
func FreezeSupport() Check {
	switch m := FreezeMethod(); m {
	case "SIGSTOP":
		return Check{Fallback: true, Detail: "no cgroup freezer: a paused session's processes are stopped with SIGSTOP (their parents can see it)",
			Fix: "mount the cgroup v1 freezer hierarchy writable, or use cgroup v2"}
	default:
		return Check{OK: true, Detail: m + ": a paused session uses no CPU and keeps its memory"}
	}
}

// Freeze stops every process of the jail until Thaw (see FreezeMethod).
func (p *Process) Freeze() error {
	select {
	case <-p.done:
		return errors.New("the jail has ended")
	default:
	}
	if p.cg != nil {
		return p.cg.freeze()
	}
	if p.joinPid != 0 {
		if p.joinGroup {
			return nil // in the jail's cgroup: frozen with the jail
		}
		return stopPids(p.joinTree)
	}
	return stopPids(p.initTree)
}

// Thaw lets a frozen jail run again (a jail not frozen is left alone).
func (p *Process) Thaw() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if p.cg != nil {
		return p.cg.thaw()
	}
	if p.joinPid != 0 {
		if !p.joinGroup {
			contPids(p.joinTree)
		}
		return nil
	}
	contPids(p.initTree)
	return nil
}

// Freeze stops every process of the group until Thaw.
func (g *Group) Freeze() error {
	g.frozen.Store(true) // first: a kill from now on thaws the group
	return g.cg.freeze()
}

// Thaw lets a frozen group run again.
func (g *Group) Thaw() error { return g.cg.thaw() }

func (cg *cgroup) freeze() error {
	switch {
	case cg.mode == "cgroup v2" && exists(filepath.Join(cg.dirs[0], "cgroup.freeze")):
		return freezeV2(cg.dirs[0])
	case cg.byC["freezer"] != "":
		return freezeV1(cg.byC["freezer"])
	}
	return stopPids(cg.pids)
}

func (cg *cgroup) thaw() error {
	switch {
	case cg.mode == "cgroup v2" && exists(filepath.Join(cg.dirs[0], "cgroup.freeze")):
		return writeCgroupFile(cg.dirs[0], "cgroup.freeze", "0")
	case cg.byC["freezer"] != "":
		return writeCgroupFile(cg.byC["freezer"], "freezer.state", "THAWED")
	}
	contPids(cg.pids)
	return nil
}

// thawForKill thaws the group after its processes were sent SIGKILL, so
// that they die (errors: the group may be gone already).
func (cg *cgroup) thawForKill() {
	switch {
	case cg.mode == "cgroup v2":
		_ = writeFileString(filepath.Join(cg.dirs[0], "cgroup.freeze"), "0")
	case cg.byC["freezer"] != "":
		_ = writeFileString(filepath.Join(cg.byC["freezer"], "freezer.state"), "THAWED")
	}
}

// pids lists the group's processes.
func (cg *cgroup) pids() []int {
	var out []int
	for _, f := range strings.Fields(readFileString(filepath.Join(cg.dirs[0], "cgroup.procs"))) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func writeCgroupFile(dir, file, val string) error {
	if err := writeFileString(filepath.Join(dir, file), val); err != nil {
		return fmt.Errorf("write %s to %s: %w", val, filepath.Join(dir, file), err)
	}
	return nil
}

// freezeV1 freezes a v1 freezer group and waits until every task is
// frozen (reading freezer.state also moves the freezing on).
func freezeV1(dir string) error {
	if err := writeCgroupFile(dir, "freezer.state", "FROZEN"); err != nil {
		return err
	}
	return awaitFrozen(dir, func() bool { return readFileString(filepath.Join(dir, "freezer.state")) == "FROZEN" },
		func() { _ = writeCgroupFile(dir, "freezer.state", "THAWED") })
}

// freezeV2 freezes a v2 group and waits for cgroup.events' "frozen 1".
func freezeV2(dir string) error {
	if err := writeCgroupFile(dir, "cgroup.freeze", "1"); err != nil {
		return err
	}
	return awaitFrozen(dir, func() bool { return keyedValue(readFileString(filepath.Join(dir, "cgroup.events")), "frozen") == 1 },
		func() { _ = writeCgroupFile(dir, "cgroup.freeze", "0") })
}

func awaitFrozen(dir string, frozen func() bool, undo func()) error {
	deadline := time.Now().Add(freezeWait)
	for pause := 20 * time.Microsecond; !frozen(); pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			undo()
			return fmt.Errorf("freeze %s: some tasks did not stop within %v (an uninterruptible wait)", dir, freezeWait)
		}
		time.Sleep(pause)
	}
	return nil
}

// stopPids sends SIGSTOP to every process list names, again until all are
// stopped and no new one appeared. Each goes through signalListed (a
// process is signalled through a pidfd, and only if it is still listed
// once pinned): a number that a process of the jail gave up, and another
// program took, is never stopped.
func stopPids(list func() []int) error {
	deadline := time.Now().Add(freezeWait)
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		running := signalListed(list, unix.SIGSTOP, func(pid int) bool { return !stopped(pid) })
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			contPids(list)
			return fmt.Errorf("stop the sandbox's processes: %d still running after %v", running, freezeWait)
		}
		time.Sleep(pause)
	}
}

// contPids sends SIGCONT to every process list names (as stopPids).
func contPids(list func() []int) {
	signalListed(list, unix.SIGCONT, nil)
}

// stopped says whether every thread of process pid is stopped (a group
// stop reaches each thread on its own way back to user mode), dead or
// gone.
func stopped(pid int) bool {
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		switch taskState(pid, tid) {
		case 'T', 't', 'Z', 'X', 0: // stopped, traced, dead or gone
		default:
			return false
		}
	}
	return true
}

func taskState(pid, tid int) byte {
	stat := readFileString("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/stat")
	if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2]
	}
	return 0
}

// procState is the state letter of /proc/pid/stat (0: gone).
func procState(pid int) byte {
	stat := readFileString("/proc/" + strconv.Itoa(pid) + "/stat")
	if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2]
	}
	return 0
}

// joinTree lists a joined program and its descendants, while the program
// has not been reaped (nothing, after: its number may be another's).
func (p *Process) joinTree() []int {
	pids := treePids(p.joinPid)
	if !p.joinChild.alive() { // checked after the reading: the number was the program's then
		return nil
	}
	return pids
}

// initTree lists the jail's init and its descendants, while the init has
// not been reaped (nothing, after: its number may be another's).
func (p *Process) initTree() []int {
	pids := treePids(p.pid)
	if p.proc.Signal(syscall.Signal(0)) != nil { // through its pidfd
		return nil
	}
	return pids
}

// treePids lists root and its descendants (a jail without a cgroup: every
// process of its PID namespace descends from its init).
func treePids(root int) []int {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := parentPid(pid); pp > 0 {
			children[pp] = append(children[pp], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// thawDyingGroups thaws the frozen sandbox groups under parents that a
// sandloop which died left (not this process's, older than minAge) and
// whose processes all have a SIGKILL pending: so they die, and the sweep
// can remove their groups. A frozen group of another live sandloop (a
// paused session) has no SIGKILL pending and is left alone. It waits (at
// most a second) for the thawed groups to empty.
func thawDyingGroups(parents []string, minAge time.Duration) (thawed int) {
	var dirs []string
	for _, parent := range parents {
		found, _ := filepath.Glob(filepath.Join(parent, "sandloop-*"))
		for _, d := range found {
			fi, err := os.Lstat(d)
			if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < minAge {
				continue
			}
			if _, live := liveGroups.Load(d); live {
				continue
			}
			v1 := readFileString(filepath.Join(d, "freezer.state"))
			v2 := keyedValue(readFileString(filepath.Join(d, "cgroup.events")), "frozen") == 1
			if v1 != "FROZEN" && v1 != "FREEZING" && !v2 {
				continue
			}
			pids := strings.Fields(readFileString(filepath.Join(d, "cgroup.procs")))
			dying := true
			for _, p := range pids {
				dying = dying && killPending(p)
			}
			if !dying {
				continue
			}
			if v2 {
				_ = os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
			} else {
				_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
			}
			dirs = append(dirs, d)
		}
	}
	deadline := time.Now().Add(time.Second)
	for _, d := range dirs {
		for readFileString(filepath.Join(d, "cgroup.procs")) != "" && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return len(dirs)
}

// killPending says whether process pid has a SIGKILL pending.
func killPending(pid string) bool {
	const sigkill = 1 << (unix.SIGKILL - 1)
	status := readFileString("/proc/" + pid + "/status")
	if status == "" {
		return true // gone already
	}
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&sigkill != 0 {
			return true
		}
	}
	return false
}
