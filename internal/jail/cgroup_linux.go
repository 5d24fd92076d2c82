package jail

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupHost is what this host offers for resource control, detected once.
type cgroupHost struct {
	mode string // "cgroup v1", "cgroup v2" or "" (none usable)
	// v1: controller name -> directory under which this process's
	// sandboxes get their groups.
	v1 map[string]string
	// v2: the directory under which sandbox groups are created.
	v2 string
	// freezer, with v1: the directory under which sandbox groups of the
	// v1 freezer hierarchy are made, "" where it is missing or not
	// writable (pausing then stops each process with SIGSTOP). Optional:
	// limits do not need it.
	freezer string
	// why cgroups cannot be used, when mode is "".
	reason string
}

var (
	hostOnce sync.Once
	host     cgroupHost
)

// liveGroups are the cgroup directories this process created and has not
// removed yet (for leak checks).
var liveGroups sync.Map

func detectCgroups() cgroupHost {
	hostOnce.Do(func() {
		host = probeCgroups()
		sweepStaleGroups(host, time.Minute)
	})
	return host
}

// sweepStaleGroups removes the sandbox groups that a sandloop killed
// without its cleanup (kill -9, a crash) left behind: empty, and older
// than minAge (a group another sandloop has just created, its process not
// yet in it, is younger). The kernel refuses to remove a group that still
// has a process or a child group, so a live sandbox is never touched.
func sweepStaleGroups(h cgroupHost, minAge time.Duration) (removed int) {
	var parents []string
	switch h.mode {
	case "cgroup v1":
		for _, c := range v1Controllers {
			if !contains(parents, h.v1[c]) {
				parents = append(parents, h.v1[c])
			}
		}
		if h.freezer != "" {
			parents = append(parents, h.freezer)
		}
	case "cgroup v2":
		parents = []string{h.v2}
	}
	thawDyingGroups(parents, minAge)
	for _, parent := range parents {
		dirs, _ := filepath.Glob(filepath.Join(parent, "sandloop-*"))
		for _, d := range dirs {
			fi, err := os.Lstat(d)
			if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < minAge {
				continue
			}
			if _, live := liveGroups.Load(d); live {
				continue
			}
			if readFileString(filepath.Join(d, "cgroup.procs")) == "" && unix.Rmdir(d) == nil {
				removed++
			}
		}
	}
	return removed
}

var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct"}
var v2Controllers = []string{"memory", "pids", "cpu"}

type mountEntry struct {
	root, point, fstype string
	super               []string
}

func readMountinfo() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		out = append(out, mountEntry{root: fields[3], point: fields[4], fstype: fields[sep+1], super: strings.Split(fields[sep+3], ",")})
	}
	return out
}

// selfCgroups maps a v1 controller (or "" for v2) to this process's path.
func selfCgroups() map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(readFileString("/proc/self/cgroup"), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

func probeCgroups() cgroupHost {
	mounts := readMountinfo()
	self := selfCgroups()
	var reasons []string
	// cgroup v2, where it holds the controllers we need.
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		dir, err := probeV2(m)
		if err != nil {
			reasons = append(reasons, "cgroup v2: "+err.Error())
			continue
		}
		return cgroupHost{mode: "cgroup v2", v2: dir}
	}
	// cgroup v1.
	v1 := map[string]string{}
	for _, m := range mounts {
		if m.fstype != "cgroup" {
			continue
		}
		for _, c := range m.super {
			for _, want := range v1Controllers {
				if c == want && v1[want] == "" {
					if p, ok := self[want]; ok {
						v1[want] = filepath.Join(m.point, strings.TrimPrefix(p, m.root))
					}
				}
			}
		}
	}
	var missing, readOnly []string
	for _, c := range v1Controllers {
		if v1[c] == "" {
			missing = append(missing, c)
		} else if unix.Access(v1[c], unix.W_OK) != nil {
			readOnly = append(readOnly, c)
		}
	}
	if len(missing)+len(readOnly) == 0 {
		return cgroupHost{mode: "cgroup v1", v1: v1, freezer: v1Freezer(mounts, self)}
	}
	if len(missing) > 0 && len(v1) > 0 {
		reasons = append(reasons, "cgroup v1: missing "+strings.Join(missing, ", "))
	}
	if len(readOnly) > 0 {
		reasons = append(reasons, "cgroup v1: "+strings.Join(readOnly, ", ")+" not writable (not delegated to this user)")
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "no cgroup file system mounted")
	}
	return cgroupHost{reason: strings.Join(reasons, "; ")}
}

// v1Freezer is the directory of this process's group in the v1 freezer
// hierarchy, if there is one it may write.
func v1Freezer(mounts []mountEntry, self map[string]string) string {
	p, ok := self["freezer"]
	if !ok {
		return ""
	}
	for _, m := range mounts {
		if m.fstype == "cgroup" && contains(m.super, "freezer") {
			d := filepath.Join(m.point, strings.TrimPrefix(p, m.root))
			if unix.Access(d, unix.W_OK) == nil && exists(filepath.Join(d, "cgroup.procs")) {
				return d
			}
			return ""
		}
	}
	return ""
}

// probeV2 finds the group under which sandloop creates sandbox groups in
// the cgroup v2 hierarchy m (delegatedV2), asking systemd for one where
// it may.
func probeV2(m mountEntry) (string, error) {
	own := func() string { return filepath.Join(m.point, strings.TrimPrefix(selfCgroups()[""], m.root)) }
	return delegatedV2(m.point, own(), selfCgroups()[""] == "/", func() (string, error) { return systemdScope(own) })
}

// supervisorLeaf is the group sandloop moves its own processes into, so
// that the group above may enable controllers for sandbox groups.
const supervisorLeaf = "sandloop-supervisor"

// delegateHint says how to give sandloop a cgroup of its own.
const delegateHint = "run sandloop in a delegated cgroup: systemd-run --user --scope -p Delegate=yes sandloop ..., " +
	"or as a service with Delegate=yes (deploy/systemd/sandloop.service), or in a container with its own cgroup namespace and a writable /sys/fs/cgroup"

// userDelegateFix makes systemd delegate the cpu controller to users.
const userDelegateFix = "add /etc/systemd/system/user@.service.d/delegate.conf with [Service] Delegate=cpu cpuset io memory pids"

// delegatedV2 finds the cgroup v2 directory under which this process may
// create sandbox groups (own is its own group, mount the hierarchy's
// mount point, nsRoot whether own is the root of its cgroup namespace)
// and enables the controllers for its children. In order:
//
//   - A process already in a supervisor leaf (a child of a sandloop)
//     uses the leaf's parent, which its parent prepared.
//   - Its own group, when that is writable (delegated: a systemd unit or
//     scope with Delegate=yes, a user's delegated slice, a container's own
//     cgroup namespace) and holds no process but this one and its
//     descendants, which are moved into own/sandloop-supervisor first: a
//     group with processes cannot enable controllers for its children
//     ("no internal processes"). At the root of a cgroup namespace (a
//     container's own group) every process is the container's, and all
//     are moved.
//   - A group shared with processes that are not ours (a login session's
//     scope, a CI step, go test's group), or not delegated, is never taken
//     over. Where systemd is the init, scope asks it for a transient scope
//     with Delegate=yes holding this process alone (cgroup_systemd_linux.go)
//     and returns the process's new group, which is then used as above.
//   - Otherwise, as root, sandloop uses a group of its own at the top of
//     the hierarchy, mount/sandloop, as container runtimes do. Without
//     root nothing is delegated, and the error says why (systemd's answer
//     included) and how to get a delegated group.
func delegatedV2(mount, own string, nsRoot bool, scope func() (string, error)) (string, error) {
	if filepath.Base(own) == supervisorLeaf {
		parent := filepath.Dir(own)
		if checkV2Controllers(parent) == nil && hasAll(strings.Fields(readFileString(filepath.Join(parent, "cgroup.subtree_control"))), v2Controllers) {
			return parent, nil
		}
	}
	// The real root lacks the interface files of other groups, and may
	// hold processes and children at once.
	realRoot := own == mount && !exists(filepath.Join(mount, "cgroup.type"))
	ownErr := checkV2Controllers(own)
	if realRoot && ownErr == nil {
		ownErr = errors.New("sandloop runs in the root cgroup: " + delegateHint)
	}
	if ownErr == nil {
		procs, ours := groupProcs(own)
		if nsRoot || len(procs) == len(ours) {
			if err := enableV2(own, nsRoot); err != nil {
				return "", err
			}
			return own, nil
		}
		ownErr = fmt.Errorf("%s is shared with %d other processes (a login session, a CI step or go test): %s", own, len(procs)-len(ours), delegateHint)
	}
	if scope != nil && !realRoot {
		scoped, err := scope()
		if err == nil {
			// Alone in a scope systemd delegated: its controllers are
			// ours to enable, with nothing to move but ourselves.
			if err = checkV2Controllers(scoped); err == nil {
				if err = enableV2(scoped, false); err == nil {
					return scoped, nil
				}
			}
			if avail := strings.Fields(readFileString(filepath.Join(scoped, "cgroup.controllers"))); os.Geteuid() != 0 && contains(avail, "memory") && !contains(avail, "cpu") {
				err = fmt.Errorf("%w (the user's manager delegates only memory and pids unless told to: %s)", err, userDelegateFix)
			}
			err = fmt.Errorf("systemd's scope %s: %w", scoped, err)
		}
		if !errors.Is(err, errNoSystemd) {
			ownErr = fmt.Errorf("%v; %w", ownErr, err)
		}
	}
	if os.Geteuid() != 0 || (own == mount && !realRoot) {
		return "", ownErr
	}
	// As root: a group of sandloop's own at the top, holding no process.
	top := filepath.Join(mount, "sandloop")
	err := enableV2(mount, false)
	if err == nil {
		if err = os.Mkdir(top, 0o755); errors.Is(err, os.ErrExist) {
			err = nil
		}
	}
	if err == nil {
		err = enableV2(top, false)
	}
	if err != nil {
		return "", fmt.Errorf("%v; and at the top of the hierarchy: %w", ownErr, err)
	}
	return top, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// checkV2Controllers says whether dir offers the controllers we need and
// may be written by this process.
func checkV2Controllers(dir string) error {
	avail := strings.Fields(readFileString(filepath.Join(dir, "cgroup.controllers")))
	for _, c := range v2Controllers {
		if !contains(avail, c) {
			return fmt.Errorf("controller %s not available in %s (enable it in the parent's cgroup.subtree_control)", c, dir)
		}
	}
	for _, f := range []string{"cgroup.subtree_control", "cgroup.procs"} {
		if err := unix.Access(filepath.Join(dir, f), unix.W_OK); err != nil {
			if errors.Is(err, unix.EROFS) {
				return fmt.Errorf("%s is read-only (a container without a writable cgroup): %s", dir, delegateHint)
			}
			return fmt.Errorf("%s is not delegated to this user: %s", dir, delegateHint)
		}
	}
	return nil
}

// groupProcs lists the processes in dir, and those of them that are this
// process or its descendants.
func groupProcs(dir string) (procs, ours []int) {
	self := os.Getpid()
	for _, f := range strings.Fields(readFileString(filepath.Join(dir, "cgroup.procs"))) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		procs = append(procs, pid)
		for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
			if p == self {
				ours = append(ours, pid)
				break
			}
			p = parentPid(p)
		}
	}
	return procs, ours
}

func parentPid(pid int) int {
	stat := readFileString("/proc/" + strconv.Itoa(pid) + "/stat")
	// pid (comm) state ppid ...: comm may hold spaces, so split after ")".
	if i := strings.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(stat[i+1:]); len(f) > 1 {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// enableV2 enables the controllers we need for dir's children. The
// processes in dir that are this process or its descendants (all of them
// with all) are moved into dir/sandloop-supervisor first.
func enableV2(dir string, all bool) error {
	var add []string
	for _, c := range v2Controllers {
		if !contains(strings.Fields(readFileString(filepath.Join(dir, "cgroup.subtree_control"))), c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	leaf := filepath.Join(dir, supervisorLeaf)
	var err error
	// A process may join dir while we move the others (a fork): again.
	for attempt := 0; attempt < 5; attempt++ {
		procs, ours := groupProcs(dir)
		if !all {
			procs = ours
		}
		if len(procs) > 0 {
			if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
		for _, pid := range procs {
			err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			if err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("move process %d to %s: %w", pid, leaf, err)
			}
		}
		err = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0)
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("enable %s for the groups under %s: %w", strings.Join(add, " "), dir, err)
	}
	return nil
}

func hasAll(list, want []string) bool {
	for _, w := range want {
		if !contains(list, w) {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// cgroup is one sandbox's group (one directory per v1 controller, or one
// v2 directory).
type cgroup struct {
	mode string
	dirs []string // v1: per controller; v2: one
	byC  map[string]string
}

func newCgroup(h cgroupHost, name string, l Limits) (*cgroup, error) {
	cg := &cgroup{mode: h.mode, byC: map[string]string{}}
	fail := func(err error) (*cgroup, error) {
		cg.remove()
		return nil, err
	}
	switch h.mode {
	case "cgroup v1":
		for _, c := range v1Controllers {
			d := filepath.Join(h.v1[c], name)
			if _, ok := cg.byC[c]; ok {
				continue
			}
			if err := groupMkdir(d); err != nil && !errors.Is(err, os.ErrExist) {
				return fail(fmt.Errorf("create cgroup: %w", err))
			}
			cg.byC[c] = d
			if !contains(cg.dirs, d) { // cpu and cpuacct may share a hierarchy
				cg.dirs = append(cg.dirs, d)
				liveGroups.Store(d, true)
			}
		}
		if h.freezer != "" {
			d := filepath.Join(h.freezer, name)
			if err := groupMkdir(d); err != nil && !errors.Is(err, os.ErrExist) {
				return fail(fmt.Errorf("create cgroup: %w", err))
			}
			cg.byC["freezer"] = d
			cg.dirs = append(cg.dirs, d)
			liveGroups.Store(d, true)
		}
	case "cgroup v2":
		d := filepath.Join(h.v2, name)
		if err := groupMkdir(d); err != nil {
			return fail(fmt.Errorf("create cgroup: %w", err))
		}
		cg.dirs = []string{d}
		liveGroups.Store(d, true)
	default:
		return nil, errors.New("no cgroups")
	}
	if err := cg.writeLimits(l, true); err != nil {
		return fail(err)
	}
	return cg, nil
}

// setLimits writes l's memory (swap included), pids and CPU limits.
func (cg *cgroup) setLimits(l Limits) error { return cg.writeLimits(l, false) }

// cfsPeriod is the CPU quota's period, the kernel's default for a new v1
// group (so a group just made needs no write of it).
const cfsPeriod = 100000

// writeLimits writes l's limits; fresh says the group was just made (its
// memory limits are the kernel's unlimited defaults, its CPU period is
// cfsPeriod), which spares a read and a write: a spare's group is made
// for every session (issue 26).
func (cg *cgroup) writeLimits(l Limits, fresh bool) error {
	const period = cfsPeriod
	quota := int(l.CPUs * period)
	type write struct{ dir, file, val string }
	var writes []write
	if cg.mode == "cgroup v1" {
		mem := strconv.FormatInt(l.Memory, 10)
		limit := write{cg.byC["memory"], "memory.limit_in_bytes", mem}
		memsw := write{cg.byC["memory"], "memory.memsw.limit_in_bytes", mem} // swap included
		// memory.limit_in_bytes may never exceed memsw: raise memsw
		// first, lower it last. A fresh group's are unlimited: lowered.
		first, second := limit, memsw
		if !fresh {
			if cur, err := strconv.ParseInt(groupRead(limit.dir, limit.file), 10, 64); err == nil && l.Memory > cur {
				first, second = memsw, limit
			}
		}
		writes = []write{first, second,
			{cg.byC["memory"], "memory.swappiness", "0"},
			{cg.byC["pids"], "pids.max", strconv.Itoa(l.Pids)},
		}
		if !fresh {
			writes = append(writes, write{cg.byC["cpu"], "cpu.cfs_period_us", strconv.Itoa(period)})
		}
		writes = append(writes, write{cg.byC["cpu"], "cpu.cfs_quota_us", strconv.Itoa(quota)})
	} else {
		d := cg.dirs[0]
		writes = []write{
			{d, "memory.max", strconv.FormatInt(l.Memory, 10)},
			{d, "memory.swap.max", "0"},
			{d, "pids.max", strconv.Itoa(l.Pids)},
			{d, "cpu.max", fmt.Sprintf("%d %d", quota, period)},
		}
	}
	for _, w := range writes {
		p := filepath.Join(w.dir, w.file)
		if err := groupWrite(w.dir, w.file, w.val); err != nil {
			switch {
			case w.file == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist),
				w.file == "memory.swap.max" && errors.Is(err, os.ErrNotExist):
				continue // no swap accounting: there is no swap to limit
			case w.file == "memory.swappiness":
				continue
			}
			return fmt.Errorf("set %s: %w", p, err)
		}
	}
	return nil
}

// add moves pid (and all its threads) into the group.
func (cg *cgroup) add(pid int) error {
	for _, d := range cg.dirs {
		if err := groupWrite(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("add %d to %s: %w", pid, d, err)
		}
	}
	return nil
}

// stats reads CPU time, peak memory and whether the OOM killer fired.
func (cg *cgroup) stats() (cpu time.Duration, peak int64, oom bool) {
	if cg.mode == "cgroup v1" {
		ns, _ := strconv.ParseInt(groupRead(cg.byC["cpuacct"], "cpuacct.usage"), 10, 64)
		peak, _ = strconv.ParseInt(groupRead(cg.byC["memory"], "memory.max_usage_in_bytes"), 10, 64)
		oom = keyedValue(groupRead(cg.byC["memory"], "memory.oom_control"), "oom_kill") > 0
		return time.Duration(ns), peak, oom
	}
	d := cg.dirs[0]
	us := keyedValue(groupRead(d, "cpu.stat"), "usage_usec")
	peak, _ = strconv.ParseInt(groupRead(d, "memory.peak"), 10, 64)
	oom = keyedValue(groupRead(d, "memory.events"), "oom_kill") > 0
	return time.Duration(us) * time.Microsecond, peak, oom
}

// live reads what the group uses now: CPU time so far, memory charged
// (page cache included) and the page cache's part of it.
func (cg *cgroup) live() LiveUsage {
	if cg.mode == "cgroup v1" {
		ns, _ := strconv.ParseInt(groupRead(cg.byC["cpuacct"], "cpuacct.usage"), 10, 64)
		mem, _ := strconv.ParseInt(groupRead(cg.byC["memory"], "memory.usage_in_bytes"), 10, 64)
		cache := keyedValue(groupRead(cg.byC["memory"], "memory.stat"), "total_cache")
		return LiveUsage{CPU: time.Duration(ns), Memory: mem, Cache: cache}
	}
	d := cg.dirs[0]
	us := keyedValue(groupRead(d, "cpu.stat"), "usage_usec")
	mem, _ := strconv.ParseInt(groupRead(d, "memory.current"), 10, 64)
	cache := keyedValue(groupRead(d, "memory.stat"), "file")
	return LiveUsage{CPU: time.Duration(us) * time.Microsecond, Memory: mem, Cache: cache}
}

func keyedValue(text, key string) int64 {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// kill sends SIGKILL to every process in the group, and thaws it if it
// was frozen: a task frozen by the v1 freezer does not die of SIGKILL
// until it is thawed (the signal waits, pending), so a paused sandbox
// would otherwise never end.
func (cg *cgroup) kill() {
	defer cg.thawForKill()
	if cg.mode == "cgroup v2" {
		if writeFileString(filepath.Join(cg.dirs[0], "cgroup.kill"), "1") == nil {
			return
		}
	}
	for _, d := range cg.dirs {
		procs := filepath.Join(d, "cgroup.procs")
		killListed(func() string { return readFileString(procs) })
	}
}

// killListed sends SIGKILL to the processes a cgroup.procs file lists
// (procs reads it), never to a stranger. A listed process may end (killed
// through another hierarchy's list, or by itself) before its signal, and
// its PID may then be another program's within milliseconds: PIDs wrap
// here (pid_max 32768) and a just-freed number is the next one handed out
// when the allocator is right behind it. So it goes through signalListed:
// each listed process is pinned by a pidfd, the list is read again, and
// only a process still listed is signalled, through its pidfd.
func killListed(procs func() string) {
	signalListed(func() []int {
		var pids []int
		for _, f := range strings.Fields(procs()) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return pids
	}, unix.SIGKILL, nil)
}

// remove kills what is left and deletes the group, waiting (bounded) for
// the kernel to finish tearing dead processes down.
//
// It tries rmdir first: the kernel refuses (EBUSY) to remove a group
// that still holds a process, so a group whose processes are gone (the
// usual case: the caller killed them and waited for them) is removed
// without reading its process lists, which on cgroup v1 costs a sorted
// pid list built per hierarchy (and a worker to free it). Only after a
// refusal are the process lists read, their processes killed (the group
// thawed if frozen) and the directories still there tried again.
func (cg *cgroup) remove() error {
	var err error
	left := cg.dirs
	for attempt := 0; attempt < 200; attempt++ {
		if attempt > 0 {
			cg.kill() // and thaw: a frozen task dies of SIGKILL only once thawed
		}
		err = nil
		var busy []string
		for _, d := range left {
			if e := groupRmdir(d); e != nil && !errors.Is(e, unix.ENOENT) {
				err = fmt.Errorf("remove cgroup %s: %w", d, e)
				busy = append(busy, d)
			} else {
				liveGroups.Delete(d)
			}
		}
		if err == nil {
			return nil
		}
		left = busy
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 500 * time.Microsecond)
		}
	}
	return err
}

// oomKilled says whether the out-of-memory killer fired in the group
// (stats' third answer, one file read instead of three).
func (cg *cgroup) oomKilled() bool {
	if cg.mode == "cgroup v1" {
		return keyedValue(groupRead(cg.byC["memory"], "memory.oom_control"), "oom_kill") > 0
	}
	return keyedValue(groupRead(cg.dirs[0], "memory.events"), "oom_kill") > 0
}

// Each sandbox group is a directory in every hierarchy (four or five on
// cgroup v1), made, written and removed for every session (a zygote's
// spare is armed in a group of its own). By absolute path each of those
// calls walks the whole path again (/sys/fs/cgroup/memory/.../sandloop-X/
// cgroup.procs: seven components here); relative to a descriptor of the
// hierarchy's parent directory, opened once per process, it walks two.
// groupMkdir, groupWrite, groupRead and groupRmdir take a group's
// directory (its absolute path, as cgroup keeps it) and use that
// descriptor where the parent has one, the path otherwise.
var (
	// groupParents maps a parent directory to its O_PATH descriptor
	// (int), or to -1 where it could not be opened.
	groupParents sync.Map
	// groupsByPath makes the group* functions use absolute paths, as
	// before (the benchmarks' baseline).
	groupsByPath bool
)

// groupParent returns the descriptor of dir's parent and dir's name in
// it, or -1.
func groupParent(dir string) (fd int, name string) {
	parent, name := filepath.Split(dir)
	if groupsByPath || parent == "" || name == "" {
		return -1, name
	}
	if v, ok := groupParents.Load(parent); ok {
		return v.(int), name
	}
	fd, err := openRaw(parent, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		fd = -1
	}
	if v, loaded := groupParents.LoadOrStore(parent, fd); loaded {
		if fd >= 0 {
			unix.Close(fd)
		}
		return v.(int), name
	}
	return fd, name
}

// forgetParent drops a parent's descriptor that no longer names a
// directory in the hierarchy (it was removed: tests make and remove
// their own), so the next call opens the path again.
func forgetParent(dir string) {
	parent, _ := filepath.Split(dir)
	if v, ok := groupParents.LoadAndDelete(parent); ok && v.(int) >= 0 {
		unix.Close(v.(int))
	}
}

// parentGone says whether err, from a call relative to dir's parent's
// descriptor, means that directory was removed since it was opened.
func parentGone(fd int, dir string, err error) bool {
	if fd < 0 || !errors.Is(err, unix.ENOENT) {
		return false
	}
	var held, now unix.Stat_t
	if unix.Fstat(fd, &held) != nil || unix.Stat(filepath.Dir(dir), &now) != nil {
		return true
	}
	return held.Dev != now.Dev || held.Ino != now.Ino
}

func groupMkdir(dir string) error {
	fd, name := groupParent(dir)
	if fd >= 0 {
		err := ignoringEINTR(func() error { return unix.Mkdirat(fd, name, 0o755) })
		if !parentGone(fd, dir, err) {
			if err != nil {
				return &os.PathError{Op: "mkdir", Path: dir, Err: err}
			}
			return nil
		}
		forgetParent(dir)
	}
	return os.Mkdir(dir, 0o755)
}

func groupRmdir(dir string) error {
	fd, name := groupParent(dir)
	if fd >= 0 {
		err := ignoringEINTR(func() error { return unix.Unlinkat(fd, name, unix.AT_REMOVEDIR) })
		if !parentGone(fd, dir, err) {
			return err
		}
		forgetParent(dir)
	}
	return unix.Rmdir(dir)
}

// groupOpen opens a group's interface file.
func groupOpen(dir, file string, flags int) (int, error) {
	fd, name := groupParent(dir)
	if fd >= 0 {
		for {
			f, err := unix.Openat(fd, name+"/"+file, flags|unix.O_CLOEXEC, 0)
			if err == unix.EINTR {
				continue
			}
			if !parentGone(fd, dir, err) {
				return f, err
			}
			break
		}
		forgetParent(dir)
	}
	return openRaw(filepath.Join(dir, file), flags)
}

// groupWrite writes val to a group's interface file in one write, as
// writeFileString does.
func groupWrite(dir, file, val string) error {
	path := filepath.Join(dir, file)
	fd, err := groupOpen(dir, file, unix.O_WRONLY)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	return writeFDString(fd, path, val)
}

// groupRead reads a group's interface file, trimmed, as readFileString
// does ("" if it cannot).
func groupRead(dir, file string) string {
	fd, err := groupOpen(dir, file, unix.O_RDONLY)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	return readFDString(fd)
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}
