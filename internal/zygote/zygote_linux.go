package zygote

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// Errors callers may branch on.
var (
	// ErrClosed means the Zygote was closed.
	ErrClosed = errors.New("zygote closed")
	// errDead: the template died while a fork waited for a spare.
	errDead = errors.New("zygote template died")
)

// startTimeout bounds the template's start (imports included) and one fork
// when the caller's context has no deadline.
const startTimeout = 2 * time.Minute

// Zygote is a running template and the sessions' kernels it forks. Its
// methods are safe for concurrent use; concurrent forks each take a spare.
type Zygote struct {
	opts   Options
	log    *slog.Logger
	config []byte // the template's first message
	// shared is, without root, the host directory the template sees at
	// jail.ZygoteWorkspacesDir (the temporary directory, where sessions'
	// workspaces are made): the only workspaces it can fork for. "" as
	// root, where the host clones each workspace's mount for it.
	shared string

	mu      sync.Mutex // the template's control socket and restarts
	cur     *instance  // nil while none runs
	retired map[*instance]bool
	closed  bool
	wg      sync.WaitGroup // background restarts, spares being armed
}

// instance is one template process in its own jail.
type instance struct {
	proc    *jail.Process
	ws      string
	ctl     *net.UnixConn
	pid     int             // host PID of the template
	huge    string          // what Options.hugePages did (the template's words)
	spares  chan spareOrErr // armed spares, ready for a session
	dead    chan struct{}   // the control socket ended
	ended   chan struct{}   // the jail (and every fork left in it) ended
	retired chan struct{}   // closed by retireLocked

	moreMu  sync.Mutex    // writes of "more" on ctl, and pending
	pending []*time.Timer // "more"s delayed by RefillDelay (Options.Fixed)
	fill    *refill       // nil with Options.Fixed
}

type spareOrErr struct {
	sp  *spare
	err error
}

// useHugePages says whether the template collapses its anonymous memory
// into huge pages (Options.noHugePages, SANDLOOP_ZYGOTE_HUGE_PAGES=0).
func useHugePages(o *Options) bool {
	return !o.noHugePages && os.Getenv("SANDLOOP_ZYGOTE_HUGE_PAGES") != "0"
}

// New starts a template and waits until it has imported its modules.
func New(ctx context.Context, opts *Options) (*Zygote, error) {
	z := &Zygote{retired: map[*instance]bool{}}
	if opts != nil {
		z.opts = *opts
	}
	if z.opts.Modules == nil {
		z.opts.Modules = DefaultModules
	}
	if z.opts.Limits.Memory == 0 {
		z.opts.Limits.Memory = 2 << 30
	}
	if z.opts.Limits.Pids == 0 {
		z.opts.Limits.Pids = 64
	}
	if z.opts.Spares <= 0 {
		z.opts.Spares = 1
	}
	if z.opts.RefillDelay == 0 {
		z.opts.RefillDelay = 200 * time.Millisecond
	}
	if z.opts.MaxSpares == 0 {
		z.opts.MaxSpares = 16
	}
	z.opts.MaxSpares = max(z.opts.MaxSpares, z.opts.Spares)
	if z.opts.Parallel <= 0 {
		z.opts.Parallel = min(max(2*runtime.NumCPU(), 2), 8)
	}
	z.log = z.opts.Logger
	if z.log == nil {
		z.log = slog.New(slog.DiscardHandler)
	}
	// Where a layer the forks need is missing, fail at once (sessions
	// then start cold) rather than with every fork.
	if err := Supported(); err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	filter, err := jail.SeccompFilter()
	if err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	masked, ro := jail.ProcMasks()
	config := map[string]any{"modules": z.opts.Modules, "filter": filter, "masked": masked, "readonly": ro, "spares": z.opts.Spares,
		"reaper_delay": cmp.Or(z.opts.reaperDelay, defaultReaperDelay).Seconds(), "reaper_spare": z.opts.earlyReaper,
		"trampoline": useTrampoline(&z.opts), "huge_pages": useHugePages(&z.opts),
		"arenas":          !z.opts.noArenas && os.Getenv("SANDLOOP_ZYGOTE_HUGE_PAGES") != "heap",
		"serve_in_c":      !z.opts.pythonLoop && os.Getenv("SANDLOOP_ZYGOTE_LOOP") != "python",
		"trim_fork_hooks": !z.opts.allForkHooks && os.Getenv("SANDLOOP_ZYGOTE_FORK_HOOKS") != "all"}
	if z.opts.refusedHugePages {
		config["huge_pages_advice"] = 999
	}
	if os.Geteuid() != 0 {
		if z.shared, err = filepath.EvalSymlinks(os.TempDir()); err != nil {
			return nil, fmt.Errorf("zygote: the temporary directory: %w", err)
		}
		config["workspaces"] = jail.ZygoteWorkspacesDir
	}
	if z.config, err = json.Marshal(config); err != nil {
		return nil, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	inst, err := z.start(ctx)
	if err != nil {
		return nil, err
	}
	z.cur = inst
	return z, nil
}

// Pid returns the host PID of the running template, or 0 if none runs.
func (z *Zygote) Pid() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.cur == nil {
		return 0
	}
	return z.cur.pid
}

// SparesReady is how many armed spares wait for a fork now: sessions
// that would start without waiting for one to be made (a cell's gateway
// weighs them, through the host's /healthz, when it places a burst).
func (z *Zygote) SparesReady() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.cur == nil {
		return 0
	}
	return len(z.cur.spares)
}

// start starts a template; z.mu is held.
func (z *Zygote) start(ctx context.Context) (*instance, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	ws, err := jail.OwnedTempDir("zygote")
	if err != nil {
		return nil, fmt.Errorf("zygote: %w", err)
	}
	ctl, theirs, err := seqpacketPair()
	if err != nil {
		os.RemoveAll(ws)
		return nil, fmt.Errorf("zygote: %w", err)
	}
	defer theirs.Close()
	env := append(append([]string(nil), z.opts.Env...),
		// No thread may exist when the template forks.
		"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "NUMEXPR_NUM_THREADS=1")
	logw := logWriter{z.log}
	files := []jail.File{
		{Path: KernelPath, Data: kernel.Source, Mode: 0o444},
		{Path: ZygotePath, Data: Source, Mode: 0o444},
	}
	// The jail's root is read-only: no session can change the program its
	// PID 1 executes. Execute-only: a program its user may not read leaves
	// the process non-dumpable across execve (the kernel's would_dump), so
	// the session, which may already run code, never reaches its reaper's
	// descriptors through /proc/1. Without it, zygote.py keeps its loop.
	if bin, _ := reaperProgram(); bin != nil && !z.opts.pythonReaper {
		files = append(files, jail.File{Path: ReaperPath, Data: bin, Mode: 0o111})
	}
	// Read-only (the template maps it); loaded only by the template.
	if so, _ := trampolineProgram(); so != nil && useTrampoline(&z.opts) {
		if z.opts.brokenTrampoline {
			so = []byte("not a shared object")
		}
		files = append(files, jail.File{Path: TrampolinePath, Data: so, Mode: 0o444})
	}
	p, err := jail.Start(context.WithoutCancel(ctx), &jail.Config{
		Path: cmp.Or(z.opts.Python, jail.DefaultPython), Args: []string{"python3", ZygotePath}, Env: env, Workspace: ws,
		Limits: z.opts.Limits, Mounts: z.opts.Mounts,
		Files: files, Stdout: logw, Stderr: logw, ExtraFiles: []*os.File{theirs}, Zygote: true, ZygoteWorkspaces: z.shared,
	})
	if err != nil {
		ctl.Close()
		os.RemoveAll(ws)
		return nil, fmt.Errorf("zygote: %w", err)
	}
	theirs.Close()
	capacity := z.opts.Spares
	if !z.opts.Fixed {
		capacity = z.opts.MaxSpares + z.opts.Parallel // an offer never waits for a take
	}
	inst := &instance{proc: p, ws: ws, ctl: ctl, spares: make(chan spareOrErr, capacity),
		dead: make(chan struct{}), ended: make(chan struct{}), retired: make(chan struct{})}
	if !z.opts.Fixed {
		inst.fill = newRefill(inst, &z.opts)
	}
	go func() {
		_, _ = p.Wait()
		os.RemoveAll(ws)
		close(inst.ended)
		z.mu.Lock()
		delete(z.retired, inst)
		z.mu.Unlock()
	}()
	fail := func(err error) (*instance, error) {
		ctl.Close()
		p.Kill()
		<-inst.ended
		return nil, fmt.Errorf("zygote: %w", err)
	}
	dl, _ := ctx.Deadline()
	ctl.SetDeadline(dl)
	if _, err := ctl.Write(z.config); err != nil {
		return fail(err)
	}
	msg, pid, err := readMsg(ctl)
	if err != nil {
		return fail(fmt.Errorf("template did not start: %w", err))
	}
	var ready struct {
		Ready      bool
		Errors     []string
		Trampoline string // why the trampoline could not be loaded
		HugePages  string `json:"huge_pages"` // what MADV_COLLAPSE did, if asked
	}
	if err := json.Unmarshal(msg, &ready); err != nil {
		return fail(err)
	}
	if !ready.Ready {
		return fail(errors.New(strings.Join(ready.Errors, "; ")))
	}
	if ready.Trampoline != "" {
		z.log.Warn("zygote: spares are made without the trampoline (two copies of the template each)", "reason", ready.Trampoline)
	}
	switch {
	case strings.HasPrefix(ready.HugePages, "none"):
		z.log.Warn("zygote: the template's memory stays in small pages (each fork copies more page tables)", "reason", ready.HugePages)
	case ready.HugePages != "":
		z.log.Info("zygote: the template's memory in huge pages", "result", ready.HugePages)
	}
	ctl.SetDeadline(time.Time{})
	inst.pid, inst.huge = pid, ready.HugePages
	go z.read(inst)
	z.wg.Add(1)
	go func() {
		defer z.wg.Done()
		select {
		case <-inst.dead:
			z.died(inst)
		case <-inst.ended:
		}
	}()
	z.log.Info("zygote ready", "pid", pid, "modules", z.opts.Modules)
	return inst, nil
}

// read takes the spares the template sends until its control socket
// ends, and arms each in the background.
func (z *Zygote) read(inst *instance) {
	defer close(inst.dead)
	for {
		msg, _, fds, err := readMsgFDs(inst.ctl)
		if err != nil {
			closeAll(fds)
			return
		}
		var m struct {
			Spare int
			Error string
		}
		_ = json.Unmarshal(msg, &m)
		switch {
		case m.Spare > 0 && len(fds) == 1:
			z.wg.Add(1)
			go func() {
				defer z.wg.Done()
				inst.offer(z.arm(fds[0]))
			}()
		default:
			closeAll(fds)
			if m.Error == "" {
				m.Error = fmt.Sprintf("unexpected message from the template: %q", msg)
			}
			z.log.Warn("zygote spare", "err", m.Error)
			inst.offer(spareOrErr{err: errors.New(m.Error)})
		}
	}
}

// offer hands an armed spare (or why none could be made) to Fork, or
// destroys it if the template was retired meanwhile.
func (inst *instance) offer(r spareOrErr) {
	select {
	case inst.spares <- r:
	case <-inst.retired:
		if r.sp != nil {
			r.sp.destroy()
		}
	}
	if inst.fill != nil {
		inst.fill.offered()
	}
}

// moreLater asks the template for one more spare after delay (at once if
// delay is negative).
func (inst *instance) moreLater(delay time.Duration) {
	inst.moreMu.Lock()
	defer inst.moreMu.Unlock()
	if delay < 0 {
		inst.moreLocked()
		return
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		inst.moreMu.Lock()
		defer inst.moreMu.Unlock()
		if i := slices.Index(inst.pending, t); i >= 0 {
			inst.pending = slices.Delete(inst.pending, i, i+1)
			inst.moreLocked()
		}
	})
	inst.pending = append(inst.pending, t)
}

// moreNow sends the delayed requests at once (a fork is waiting).
func (inst *instance) moreNow() {
	inst.moreMu.Lock()
	defer inst.moreMu.Unlock()
	for _, t := range inst.pending {
		if t.Stop() {
			inst.moreLocked()
		}
	}
	inst.pending = nil
}

// moreLocked asks for one more spare; inst.moreMu is held.
func (inst *instance) moreLocked() { _, _ = inst.ctl.Write([]byte("more")) }

// died retires a template whose control socket ended and starts another
// in the background. The sessions it forked live on.
func (z *Zygote) died(inst *instance) {
	z.mu.Lock()
	if z.cur != inst {
		z.mu.Unlock()
		return
	}
	z.log.Warn("zygote template died; starting another", "pid", inst.pid)
	z.retireLocked(inst)
	if z.closed {
		z.mu.Unlock()
		return
	}
	z.wg.Add(1)
	z.mu.Unlock()
	go func() {
		defer z.wg.Done()
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.closed || z.cur != nil {
			return
		}
		inst, err := z.start(context.Background())
		if err != nil {
			z.log.Error("zygote restart", "err", err) // the next fork tries again
			return
		}
		z.cur = inst
	}()
}

func (z *Zygote) retireLocked(inst *instance) {
	if z.cur == inst {
		z.cur = nil
	}
	select {
	case <-inst.retired:
	default:
		close(inst.retired)
		if inst.fill != nil {
			inst.fill.stop()
		}
		go inst.drain()
	}
	inst.ctl.Close()
	select {
	case <-inst.ended:
	default:
		z.retired[inst] = true
	}
}

// drain destroys the spares of a retired template (the one in arming
// destroy themselves).
func (inst *instance) drain() {
	for {
		select {
		case r := <-inst.spares:
			if r.sp != nil {
				r.sp.destroy()
			}
		default:
			return
		}
	}
}

// Close kills the template and every session it forked.
func (z *Zygote) Close() error {
	z.mu.Lock()
	if z.closed {
		z.mu.Unlock()
		return nil
	}
	z.closed = true
	var all []*instance
	if cur := z.cur; cur != nil {
		all = append(all, cur)
		z.retireLocked(cur) // (into z.retired too, unless it has ended)
		delete(z.retired, cur)
	}
	for inst := range z.retired {
		all = append(all, inst)
	}
	z.mu.Unlock()
	for _, inst := range all {
		inst.proc.Kill()
		<-inst.ended
	}
	z.wg.Wait() // restarts, and spares being armed (they end with their template)
	for _, inst := range all {
		inst.drain()
	}
	return nil
}

// logWriter logs what the template says on stdout and stderr.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("zygote output", "text", string(p))
	return len(p), nil
}
