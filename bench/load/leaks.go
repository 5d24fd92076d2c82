package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const initArg0 = "sandloop-jail-init" // argv[0] of the jail's init (internal/jail)

// proc is one host process.
type proc struct {
	pid, ppid int
	cmdline   string
}

func processes() []proc {
	var out []proc
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := st[bytes.LastIndexByte(st, ')')+1:]
		f := strings.Fields(string(rest))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out = append(out, proc{pid, ppid, string(bytes.ReplaceAll(bytes.TrimRight(cl, "\x00"), []byte{0}, []byte{' '}))})
	}
	return out
}

// descendants are the processes below this one.
func descendants() []proc {
	all := processes()
	children := map[int][]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []proc
	queue := []int{os.Getpid()}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

func isJailInit(p proc) bool { return strings.HasPrefix(p.cmdline, initArg0) }
func isKernel(p proc) bool {
	return strings.Contains(p.cmdline, "python") && strings.Contains(p.cmdline, "kernel.py")
}

// snapshot is what exists before the run, to tell our leftovers from
// other programs' sandboxes on a shared machine.
type snapshot struct {
	cgroups        map[string]bool
	inits, kernels int // host-wide, for information
}

func takeSnapshot() snapshot {
	s := snapshot{cgroups: map[string]bool{}}
	for _, d := range cgroupDirs() {
		s.cgroups[d] = true
	}
	for _, p := range processes() {
		if isJailInit(p) {
			s.inits++
		}
		if isKernel(p) {
			s.kernels++
		}
	}
	return s
}

// sampler records, while the load runs, the cgroups our jails and the
// sessions forked from the zygote live in: each tick it lists the sandbox
// groups (sandloop-*) under our cgroup parent (of one hierarchy), and classifies each new
// one once, by the first process found in it: ours if that process
// descends from this one. It reads no file per process of the machine
// (an earlier sampler read every process's stat and command line each
// tick, which with hundreds of sessions in flight took a large share of
// a core from the host it measured).
type sampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	seen map[string]bool
	cpu  time.Duration // the sampler's own CPU time (not the host's)
}

func startSampler() *sampler {
	s := &sampler{done: make(chan struct{}), seen: map[string]bool{}}
	// One hierarchy is enough: a sandbox's group has the same name in
	// each, and other programs' groups (a shared machine's load tests:
	// thousands) make every listing longer.
	parents := cgroupParents()
	if len(parents) > 1 {
		parents = parents[:1]
	}
	self := os.Getpid()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// On a thread of its own, so that its CPU time can be told from
		// the host's (both run in this process).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// Often enough to see most groups of sessions that live tens
		// of milliseconds.
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		decided := map[string]bool{} // groups classified, ours or not
		for {
			t0 := threadCPU()
			for _, parent := range parents {
				f, err := os.Open(parent)
				if err != nil {
					continue
				}
				names, _ := f.Readdirnames(-1)
				f.Close()
				for _, n := range names {
					if !strings.HasPrefix(n, "sandloop-") || n == "sandloop-supervisor" || decided[n] {
						continue
					}
					ours, known := groupOwner(filepath.Join(parent, n), self)
					if !known {
						continue // empty for now, or its process just ended: next tick
					}
					decided[n] = true
					if ours {
						s.mu.Lock()
						s.seen[n] = true
						s.mu.Unlock()
					}
				}
			}
			s.mu.Lock()
			s.cpu += threadCPU() - t0
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// groupOwner says whether the first process in cgroup dir descends from
// process self; known is false when that cannot be told now (no process
// in the group, or it ended while its ancestry was read).
func groupOwner(dir string, self int) (ours, known bool) {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	pid, err := strconv.Atoi(first)
	if err != nil {
		return false, false
	}
	for hops := 0; hops < 64; hops++ {
		if pid == self {
			return true, true
		}
		if pid <= 1 {
			return false, true
		}
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false, false
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(f) < 2 {
			return false, false
		}
		pid, _ = strconv.Atoi(f[1])
	}
	return false, true
}

// CPU is the sampler's own CPU time so far.
func (s *sampler) CPU() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cpu
}

func (s *sampler) stop() { close(s.done); s.wg.Wait() }

func (s *sampler) names() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// Leaks is what the run left behind.
type Leaks struct {
	// Processes below this one after the shutdown (jail inits, kernels,
	// anything they started), each as "pid cmdline".
	Processes []string
	// Cgroups are sandbox groups our jails were seen in during the run
	// that remain; new groups no jail of ours was seen in are other
	// programs' (CgroupsOthers).
	Cgroups []string
	// Workspaces are entries left in the run's private TMPDIR.
	Workspaces []string
	// CgroupsSeen is how many distinct groups our jails were seen in;
	// CgroupsOthers how many new groups belonged to other programs.
	CgroupsSeen, CgroupsOthers int
	// Host-wide counts before and after, for information (other programs
	// on the machine move them too).
	InitsBefore, InitsAfter, KernelsBefore, KernelsAfter int
}

func (l Leaks) problems() []string {
	var out []string
	if n := len(l.Processes); n > 0 {
		out = append(out, fmt.Sprintf("%d leaked processes", n))
	}
	if n := len(l.Cgroups); n > 0 {
		out = append(out, fmt.Sprintf("%d leaked cgroups", n))
	}
	if n := len(l.Workspaces); n > 0 {
		out = append(out, fmt.Sprintf("%d leftover workspaces", n))
	}
	return out
}

func (l Leaks) print(w io.Writer) {
	fmt.Fprintf(w, "leaks: processes %d, cgroups %d (of %d seen in use; %d new ones were other programs'), workspaces %d\n",
		len(l.Processes), len(l.Cgroups), l.CgroupsSeen, l.CgroupsOthers, len(l.Workspaces))
	fmt.Fprintf(w, "host-wide (other programs included): %s processes %d before, %d after; python kernels %d before, %d after\n",
		initArg0, l.InitsBefore, l.InitsAfter, l.KernelsBefore, l.KernelsAfter)
	for _, x := range slices.Concat(l.Processes, l.Cgroups, l.Workspaces) {
		fmt.Fprintf(w, "LEFT %s\n", x)
	}
}

// findLeaks looks for what the run left. Processes and cgroups may take
// a moment to go after their killer returns (the kernel tears a
// namespace down asynchronously), so it looks again for up to settle
// before reporting.
func findLeaks(before snapshot, seen map[string]bool, tmp string, settle time.Duration) Leaks {
	var l Leaks
	for deadline := time.Now().Add(settle); ; {
		l = Leaks{CgroupsSeen: len(seen), InitsBefore: before.inits, KernelsBefore: before.kernels}
		for _, p := range descendants() {
			l.Processes = append(l.Processes, fmt.Sprintf("pid %d: %q", p.pid, p.cmdline))
		}
		mine := map[int]bool{}
		for _, p := range descendants() {
			mine[p.pid] = true
		}
		for _, d := range cgroupDirs() {
			if before.cgroups[d] {
				continue
			}
			// A group none of our jails was seen in (they are sampled every
			// 100ms, and live for seconds here) is another program's: a
			// sandbox still running, or one left by a process killed with
			// SIGKILL (a test's "host lost", swept at its next start), which
			// is empty like a leak of ours would be.
			if !seen[filepath.Base(d)] {
				l.CgroupsOthers++
				continue
			}
			l.Cgroups = append(l.Cgroups, d)
		}
		entries, _ := os.ReadDir(tmp)
		for _, e := range entries {
			l.Workspaces = append(l.Workspaces, filepath.Join(tmp, e.Name()))
		}
		after := takeSnapshot()
		l.InitsAfter, l.KernelsAfter = after.inits, after.kernels
		if len(l.problems()) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	reapZombies()
	return l
}

// othersInside reports whether cgroup d holds a live process that is not
// ours: another program's sandbox.
func othersInside(d string, mine map[int]bool) bool {
	b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && !mine[pid] {
			return true
		}
	}
	return false
}
