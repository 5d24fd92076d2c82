package main

import (
	"bufio"
	"context"
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

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

// IdleConfig sizes an idle-memory run (issue 26): Sessions sessions are
// created through the HTTP API of a host with sandloop serve's defaults
// (zygote, pool of 2) but MaxSessions, each runs `import pandas` and
// stays idle; the host's memory is read before and after, then all are
// deleted and the leak checks run.
type IdleConfig struct {
	// Sessions held at once. If zero, 2000.
	Sessions int
	// MaxSessions is the server's cap. If zero, Sessions.
	MaxSessions int
	// PoolSize is the warm pool. If zero, 2.
	PoolSize int
	// Creators create the sessions at once. If zero, 16.
	Creators int
	// Log receives progress lines. If nil, none.
	Log io.Writer
}

// hostMemory is what the measure reads of the host and of this process.
type hostMemory struct {
	meminfo map[string]int64            // /proc/meminfo, bytes
	slabs   map[string]int64            // /proc/slabinfo: bytes per cache (num_objs * objsize)
	procs   map[string]*procClassMemory // this process's descendants by kind
	cgroups int                         // sandbox memory cgroups
	cgKmem  int64                       // their memory.kmem.usage_in_bytes, summed (v1)
	cgUsage int64                       // their memory.usage_in_bytes, summed
	goHeap  uint64                      // HeapInuse after a GC
	goSys   uint64                      // memory the Go runtime holds from the OS
	gorout  int
	fds     int
	fdKinds map[string]int // this process's open files by kind (pipe, socket, anon_inode:[pidfd], a path's first parts)
}

type procClassMemory struct {
	n             int
	uss, pss, pte int64
}

func readHostMemory() hostMemory {
	m := hostMemory{meminfo: map[string]int64{}, slabs: map[string]int64{}, procs: map[string]*procClassMemory{}}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			f := strings.Fields(v)
			if len(f) == 0 {
				continue
			}
			n, _ := strconv.ParseInt(f[0], 10, 64)
			if len(f) > 1 && f[1] == "kB" {
				n <<= 10
			}
			m.meminfo[k] = n
		}
	}
	if f, err := os.Open("/proc/slabinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 4 || strings.HasPrefix(f[0], "#") || f[0] == "slabinfo" {
				continue
			}
			num, _ := strconv.ParseInt(f[2], 10, 64)
			size, _ := strconv.ParseInt(f[3], 10, 64)
			m.slabs[f[0]] += num * size
		}
		f.Close()
	}
	ds := descendants()
	parents := map[int]bool{}
	for _, p := range ds {
		parents[p.ppid] = true
	}
	for _, p := range ds {
		k := procKind(p)
		if parents[p.pid] {
			k += " (has children)" // a session's reaper, the template
		}
		c := m.procs[k]
		if c == nil {
			c = &procClassMemory{}
			m.procs[k] = c
		}
		c.n++
		u, ps := smapsRollup(p.pid)
		c.uss += u
		c.pss += ps
		c.pte += statusBytes(p.pid, "VmPTE:")
	}
	for _, d := range cgroupDirs() {
		if !strings.Contains(d, "/memory") && !strings.Contains(d, "unified") {
			continue
		}
		m.cgroups++
		m.cgKmem += fileInt(filepath.Join(d, "memory.kmem.usage_in_bytes"))
		m.cgUsage += fileInt(filepath.Join(d, "memory.usage_in_bytes"))
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.goHeap, m.goSys, m.gorout = ms.HeapInuse, ms.Sys, runtime.NumGoroutine()
	m.fdKinds = map[string]int{}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		m.fds = len(fds)
		for _, fd := range fds {
			l, err := os.Readlink("/proc/self/fd/" + fd.Name())
			if err != nil {
				continue
			}
			k, _, _ := strings.Cut(l, "[")
			if strings.HasPrefix(l, "anon_inode:") {
				k = l
			} else if strings.HasPrefix(l, "/") {
				parts := strings.SplitN(l, "/", 4)
				k = strings.Join(parts[:min(len(parts), 3)], "/")
			}
			m.fdKinds[k]++
		}
	}
	return m
}

// procKind names a process by what it runs: the jail's init, the zygote
// template, a session's kernel or reaper (told apart by their titles).
func procKind(p proc) string {
	cl := p.cmdline
	switch {
	case isJailInit(p):
		return "jail init"
	case cl == "":
		return "(no cmdline)"
	}
	if len(cl) > 48 {
		cl = cl[:48]
	}
	return cl
}

func fileInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func statusBytes(pid int, field string) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// smapsRollup is a process's USS (private clean + dirty) and PSS, bytes.
func smapsRollup(pid int) (uss, pss int64) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Private_Clean:", "Private_Dirty:":
			uss += kb << 10
		case "Pss:":
			pss += kb << 10
		}
	}
	return uss, pss
}

// idleTimeout bounds one create + import: on a shared machine under load
// a create behind a thousand others can take long; a failure is a create
// that fails, not a slow one.
const idleTimeout = 3 * time.Minute

// Idle holds cfg.Sessions idle pandas sessions, prints the host memory
// each costs and its parts, deletes them and checks nothing is left.
func Idle(ctx context.Context, cfg IdleConfig, w io.Writer) ([]string, error) {
	if cfg.Sessions == 0 {
		cfg.Sessions = 2000
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = cfg.Sessions
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 2
	}
	if cfg.Creators == 0 {
		cfg.Creators = 16
	}
	x, err := startHarness(ctx, &host.Config{PoolSize: cfg.PoolSize, MaxSessions: cfg.MaxSessions, Zygote: "on"}, cfg.Creators+8, cfg.Log)
	if err != nil {
		return nil, err
	}
	if err := x.waitPool(ctx, cfg.PoolSize); err != nil {
		x.finish(ctx)
		return nil, err
	}
	time.Sleep(2 * time.Second) // the zygote's spares too
	before := readHostMemory()
	var (
		mu       sync.Mutex
		ids      []string
		lat      []time.Duration
		failures []string
		next     = make(chan int)
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	start := time.Now()
	for range cfg.Creators {
		wg.Go(func() {
			for i := range next {
				rctx, cancel := context.WithTimeout(ctx, idleTimeout)
				t0 := time.Now()
				s, err := x.c.CreateSession(rctx, nil)
				if err != nil {
					cancel()
					fail("session %d: create: %v", i, err)
					continue
				}
				mu.Lock()
				ids = append(ids, s.ID)
				mu.Unlock()
				r, err := x.c.Execute(rctx, s.ID, "import pandas\npandas.__name__", nil)
				d := time.Since(t0)
				cancel()
				if err == nil {
					err = want(r.Status == client.StatusOK && r.Text() == "'pandas'", r)
				}
				if err != nil {
					fail("session %d: import pandas: %v", i, err)
					continue
				}
				mu.Lock()
				lat = append(lat, d)
				if len(lat)%250 == 0 {
					x.logf("idle: %d sessions up after %v", len(lat), time.Since(start).Round(time.Second))
				}
				mu.Unlock()
			}
		})
	}
	for i := range cfg.Sessions {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	created := time.Since(start)
	// The pool and spares refill, freed pages settle, and each reaper executes
	// the small one (5 s after its take: internal/zygote).
	time.Sleep(10 * time.Second)
	after := readHostMemory()
	held := len(lat)

	fmt.Fprintf(w, "idle pandas sessions: %d of %d up (create + import pandas over HTTP from %d clients, zygote on, pool %d, --max-sessions %d) in %v: %.1f/s, p50 %.0f ms, p99 %.0f ms\n",
		held, cfg.Sessions, cfg.Creators, cfg.PoolSize, cfg.MaxSessions, created.Round(time.Millisecond),
		float64(held)/created.Seconds(), ms(pct(lat, 50)), ms(pct(lat, 99)))
	printMemory(w, before, after, held)

	// Delete them all, from the same clients.
	dstart := time.Now()
	del := make(chan string)
	for range cfg.Creators {
		wg.Go(func() {
			for id := range del {
				rctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
				if err := x.c.DeleteSession(rctx, id); err != nil {
					fail("delete %s: %v", id, err)
				}
				cancel()
			}
		})
	}
	for _, id := range ids {
		del <- id
	}
	close(del)
	wg.Wait()
	fmt.Fprintf(w, "deleted %d sessions in %v\n", len(ids), time.Since(dstart).Round(time.Millisecond))
	leaks, problems := x.finish(ctx)
	leaks.print(w)
	for i, f := range failures {
		if i == 20 {
			fmt.Fprintf(w, "... and %d more failures\n", len(failures)-20)
			break
		}
		fmt.Fprintf(w, "FAIL %s\n", f)
	}
	if n := len(failures); n > 0 {
		problems = append(problems, fmt.Sprintf("%d failures", n))
	}
	if held < cfg.Sessions {
		problems = append(problems, fmt.Sprintf("%d of %d sessions held", held, cfg.Sessions))
	}
	return append(problems, leaks.problems()...), nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return percentile(d, p)
}

// printMemory prints what n sessions cost the host, per session: the
// fall of MemAvailable, and its parts from /proc/meminfo, the processes'
// PSS, USS and page tables, the cgroups' kernel memory, the slab caches
// that grew most, and this Go process's heap.
func printMemory(w io.Writer, b, a hostMemory, n int) {
	if n == 0 {
		return
	}
	per := func(v int64) float64 { return float64(v) / float64(n) / (1 << 20) }
	mi := func(k string) int64 { return a.meminfo[k] - b.meminfo[k] }
	fmt.Fprintf(w, "host memory per session: MemAvailable fell %.2f MiB (the whole host: other programs' work counts too)\n", per(-mi("MemAvailable")))
	fmt.Fprintf(w, "  /proc/meminfo per session: AnonPages %.2f, Shmem (tmpfs) %.3f, PageTables %.3f, KernelStack %.3f, Slab %.3f (SUnreclaim %.3f, SReclaimable %.3f), Percpu %.3f, Cached %.2f MiB\n",
		per(mi("AnonPages")), per(mi("Shmem")), per(mi("PageTables")), per(mi("KernelStack")), per(mi("Slab")),
		per(mi("SUnreclaim")), per(mi("SReclaimable")), per(mi("Percpu")), per(mi("Cached")))
	kinds := make([]string, 0, len(a.procs))
	for k := range a.procs {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var tu, tp, tt int64
	for _, k := range kinds {
		pa, pb := a.procs[k], b.procs[k]
		if pb == nil {
			pb = &procClassMemory{}
		}
		du, dp, dt := pa.uss-pb.uss, pa.pss-pb.pss, pa.pte-pb.pte
		tu, tp, tt = tu+du, tp+dp, tt+dt
		fmt.Fprintf(w, "  processes %-50q %5d -> %5d: per session USS %.2f, PSS %.2f, page tables %.3f MiB\n", k, pb.n, pa.n, per(du), per(dp), per(dt))
	}
	fmt.Fprintf(w, "  processes in all, per session: USS %.2f, PSS %.2f, page tables (VmPTE) %.3f MiB\n", per(tu), per(tp), per(tt))
	fmt.Fprintf(w, "  sandbox memory cgroups %d -> %d: kernel memory (memory.kmem.usage_in_bytes) %.3f MiB, usage %.2f MiB per session\n",
		b.cgroups, a.cgroups, per(a.cgKmem-b.cgKmem), per(a.cgUsage-b.cgUsage))
	type slab struct {
		name string
		d    int64
	}
	var slabs []slab
	for k, v := range a.slabs {
		if d := v - b.slabs[k]; d > 0 {
			slabs = append(slabs, slab{k, d})
		}
	}
	slices.SortFunc(slabs, func(x, y slab) int { return int(y.d - x.d) })
	var parts []string
	for _, s := range slabs[:min(len(slabs), 10)] {
		parts = append(parts, fmt.Sprintf("%s %.0f KiB", s.name, float64(s.d)/float64(n)/1024))
	}
	fmt.Fprintf(w, "  slab caches that grew most, per session: %s\n", strings.Join(parts, ", "))
	fmt.Fprintf(w, "  the Go host (this process): heap in use %.1f KiB, runtime from the OS %.1f KiB, goroutines %.1f, fds %.1f per session\n",
		float64(int64(a.goHeap)-int64(b.goHeap))/float64(n)/1024, float64(int64(a.goSys)-int64(b.goSys))/float64(n)/1024,
		float64(a.gorout-b.gorout)/float64(n), float64(a.fds-b.fds)/float64(n))
	var fdParts []string
	for k, v := range a.fdKinds {
		if d := v - b.fdKinds[k]; d > n/10 {
			fdParts = append(fdParts, fmt.Sprintf("%s %.2f", k, float64(d)/float64(n)))
		}
	}
	slices.Sort(fdParts)
	fmt.Fprintf(w, "  the host's open files per session, by kind: %s\n", strings.Join(fdParts, ", "))
}
