package kernel

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Source is kernel.py, the program that runs inside each sandbox. Run it as
// `python3 kernel.py` with the descriptors described by Files.
//
//go:embed kernel.py
var Source []byte

// Files are the kernel's ends of its pipes. A Launcher must hand them to
// kernel.py as descriptors 3, 4, 5, 6 and 7 (see List); the kernel moves
// Stdout and Stderr onto its descriptors 1 and 2 as it starts. The
// program's own descriptors 1 and 2 carry only what Python says before
// that (a broken installation, say). State is optional: a kernel without
// it streams its state through the event pipe, slower.
type Files struct {
	Requests *os.File // fd 3: requests, read end
	Events   *os.File // fd 4: events, write end
	Stdout   *os.File // fd 5: becomes fd 1
	Stderr   *os.File // fd 6: becomes fd 2
	State    *os.File // fd 7: the state channel, a unix seqpacket socket
}

// List returns the files in descriptor order, from 3, for exec.Cmd.ExtraFiles.
func (f Files) List() []*os.File {
	l := []*os.File{f.Requests, f.Events, f.Stdout, f.Stderr}
	if f.State != nil {
		l = append(l, f.State)
	}
	return l
}

// Process is a started kernel program.
type Process interface {
	// Signal delivers sig to the kernel process (SIGINT interrupts a cell).
	Signal(sig os.Signal) error
	// Kill kills the kernel and everything it started.
	Kill() error
	// Wait blocks until the kernel has exited and everything it started is
	// gone. A non-nil error says why it ended ("killed by signal SIGSEGV").
	Wait() error
}

// Launcher starts kernel.py with files as its descriptors. The process must
// outlive ctx's cancellation: the Kernel kills it when it is done.
type Launcher func(ctx context.Context, files Files) (Process, error)

// Options configure a Kernel. The zero value is ready to use.
type Options struct {
	// InterruptGrace is how long an interrupted execution may take to stop
	// before the kernel is killed. If zero, 2 seconds.
	InterruptGrace time.Duration
	// MaxOutputBytes caps stdout and stderr (each) kept in a Result; the
	// middle is dropped. Events are not capped. If zero, 1 MiB.
	MaxOutputBytes int
	// MaxEventBytes caps one event line from the kernel; the kernel replaces
	// larger outputs with a note. If zero, 32 MiB.
	MaxEventBytes int
	// ResyncTimeout bounds how long a kernel taken over (Attach) may go
	// on with the cell it was running before it is interrupted. If zero,
	// 5 minutes.
	ResyncTimeout time.Duration
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Errors callers may branch on.
var (
	// ErrDead means the kernel has died or was killed; it must be restarted.
	ErrDead = errors.New("kernel is dead")
)

// Kernel is a running kernel.py and the Go side of its protocol. Execute
// runs one cell at a time; Interrupt, Kill and Close may be called
// concurrently.
//
// One goroutine at a time (the holder of sem) does all the I/O, polling the
// event pipe and the output pipes together. Before handling each event it
// reads, it drains the output pipes: the kernel wrote that output before
// the event, so stdout and stderr written at the descriptor level (C code,
// subprocesses) come before the results and the end that follow them. No
// reader goroutines means no hand-offs on the hot path.
type Kernel struct {
	proc  Process
	opts  Options
	log   *slog.Logger
	p     *pipes
	start time.Time

	exited    chan struct{} // closed when Wait returned
	sem       chan struct{} // one user of the pipes at a time
	interrupt atomic.Bool
	closeOnce sync.Once

	mu         sync.Mutex
	exitErr    error
	killReason string

	count int   // owned by the holder of sem
	tag   int64 // of the last request between cells; owned by the holder of sem

	stateChannel bool // the kernel took fd 7 as its state channel (set at start)

	fresh atomic.Bool // see Fresh

	retired atomic.Bool // see Retire
}

// wireEvent is an Event as the kernel sends it.
type wireEvent struct {
	Event
	Seq    int64  `json:"seq"` // of the marker before it, in the middle of a cell
	Pid    int    `json:"pid"`
	Python string `json:"python"`
	// StateChannel, in the ready event: the kernel has the state channel.
	StateChannel bool `json:"state_channel"`

	// Replies about checkpoints and state (checkpoint.go).
	Tag       int64            `json:"tag"` // the request's, echoed
	ID        int              `json:"id"`
	Reason    string           `json:"reason"` // why the request failed
	Gone      bool             `json:"gone"`   // the checkpoint's process has died
	Why       string           `json:"why"`    // why a gone checkpoint's copy was never made
	Threads   []string         `json:"threads"`
	Processes []string         `json:"processes"`
	Memory    map[string]int64 `json:"memory"`
	Chunk     string           `json:"chunk"` // base64 state bytes
	chunk     []byte           // the same, read without the JSON decoder (parseStateData); valid until the next read
	Manifest  *StateManifest   `json:"manifest"`
	// Checkpoints, in the reply to a sync (handoff.go): the ids held.
	Checkpoints []int `json:"checkpoints"`
	// In the reply to a remap_export (RemapExport).
	Remapped int64  `json:"remapped"`
	Skipped  string `json:"skipped"`
}

// newKernel is a Kernel not yet started, with opts' defaults filled in;
// maxEventBytes, if > 0, is the one of the kernel it attaches to.
func newKernel(opts *Options, maxEventBytes int) *Kernel {
	k := &Kernel{
		exited: make(chan struct{}),
		sem:    make(chan struct{}, 1),
		start:  time.Now(),
	}
	if opts != nil {
		k.opts = *opts
	}
	if k.opts.InterruptGrace <= 0 {
		k.opts.InterruptGrace = 2 * time.Second
	}
	if k.opts.MaxOutputBytes <= 0 {
		k.opts.MaxOutputBytes = 1 << 20
	}
	if maxEventBytes > 0 {
		k.opts.MaxEventBytes = maxEventBytes
	}
	if k.opts.MaxEventBytes <= 0 {
		k.opts.MaxEventBytes = 32 << 20
	}
	k.log = k.opts.Logger
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	return k
}

// Start launches a kernel and waits until it is ready. ctx bounds only the
// start; the kernel lives until Close or until it dies.
func Start(ctx context.Context, launch Launcher, opts *Options) (*Kernel, error) {
	k := newKernel(opts, 0)
	var tok [12]byte
	rand.Read(tok[:])
	p, files, err := newPipes(k.opts.MaxEventBytes, hex.EncodeToString(tok[:]))
	if err != nil {
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	// The hello waits in the pipe (far below its capacity) for the kernel
	// to read as soon as it runs, while the launcher still finishes.
	hello, _ := json.Marshal(map[string]any{"max_event_bytes": k.opts.MaxEventBytes - 4096, "token": hex.EncodeToString(tok[:])})
	if err := p.writeRequest(append(hello, '\n'), time.Now().Add(10*time.Second)); err != nil {
		p.close()
		for _, f := range files.List() {
			f.Close()
		}
		return nil, fmt.Errorf("start kernel: send the hello: %w", err)
	}
	proc, err := launch(context.WithoutCancel(ctx), files)
	for _, f := range files.List() {
		f.Close() // the kernel has its copies; EOF must mean the kernel is gone
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	k.proc = proc
	k.p = p
	go func() {
		err := proc.Wait()
		k.mu.Lock()
		k.exitErr = err
		k.mu.Unlock()
		close(k.exited)
		p.wake()
	}()

	if err := k.awaitReady(ctx); err != nil {
		k.Close()
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	k.fresh.Store(true)
	return k, nil
}

// Fresh reports whether the kernel is as Start left it: no cell, state
// import, checkpoint restore or change of its environment was ever sent
// to it (a kernel attached to, rather than started, is never fresh). Its
// Python state is then that of any kernel the same launcher starts: no
// variables, nothing imported by a cell, execution count 0.
func (k *Kernel) Fresh() bool { return k.fresh.Load() }

// readySink waits for the kernel's "ready", keeping what it says on stderr.
type readySink struct {
	stderr capture
	ready  bool
	log    *slog.Logger
	state  bool // the kernel has the state channel
}

func (r *readySink) text(stream int, s string) {
	if stream == streamStderr {
		r.stderr.write(s)
	}
}

func (r *readySink) event(ev *wireEvent) bool {
	if ev.Type == "ready" {
		r.log.Debug("kernel ready", "pid", ev.Pid, "python", ev.Python)
		r.ready = true
		r.state = ev.StateChannel
		return true
	}
	return false
}

func (k *Kernel) awaitReady(ctx context.Context) error {
	stop := context.AfterFunc(ctx, k.p.wake)
	defer stop()
	r := &readySink{log: k.log}
	r.stderr.limit = 8 << 10
	for {
		stopped, err := k.p.step(-1, r)
		if err != nil {
			k.Kill("protocol error: " + err.Error())
			return err
		}
		if stopped {
			k.stateChannel = r.state
			return nil
		}
		if k.p.eof[streamEvents] || k.hasExited() {
			k.awaitExit(time.Second)
			k.drain(r, time.Second)
			return fmt.Errorf("kernel exited during start (%s): %s", k.reason(), r.stderr.String())
		}
		if ctx.Err() != nil {
			k.Kill("start canceled")
			return ctx.Err()
		}
	}
}

// drain passes on what is left in the pipes until all of them end or d passes.
func (k *Kernel) drain(s sink, d time.Duration) {
	deadline := time.Now().Add(d)
	for !k.p.allEOF() {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if _, err := k.p.step(left, s); err != nil {
			return
		}
	}
}

func (k *Kernel) hasExited() bool {
	select {
	case <-k.exited:
		return true
	default:
		return false
	}
}

// Err returns nil while the kernel can execute, and an error wrapping
// ErrDead with the reason once it has died or been killed.
func (k *Kernel) Err() error {
	select {
	case <-k.exited:
		return fmt.Errorf("%w: %s", ErrDead, k.reason())
	default:
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killReason != "" {
		return fmt.Errorf("%w: %s", ErrDead, k.killReason)
	}
	return nil
}

// reason says why the kernel is gone (or going).
func (k *Kernel) reason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killReason != "" {
		return k.killReason
	}
	select {
	case <-k.exited:
	default:
		return "the kernel is running"
	}
	if k.exitErr == nil {
		return "the kernel exited"
	}
	return "the kernel died: " + k.exitErr.Error()
}

// Kill kills the kernel, recording reason as the cause reported to the
// running execution, if any. It does not wait.
func (k *Kernel) Kill(reason string) {
	k.mu.Lock()
	select {
	case <-k.exited: // it died on its own: keep that reason
	default:
		if k.killReason == "" {
			k.killReason = reason
		}
	}
	k.mu.Unlock()
	if err := k.proc.Kill(); err != nil {
		k.log.Debug("kill kernel", "err", err)
	}
}

// Retire kills the kernel as Kill does, on purpose: its holder replaces
// or ends it (a restart, a hibernation, a close), so its end is no
// failure to report (Retired).
func (k *Kernel) Retire(reason string) {
	k.retired.Store(true)
	k.Kill(reason)
}

// Retired says whether the kernel was killed with Retire.
func (k *Kernel) Retired() bool { return k.retired.Load() }

// ExitReason says why the kernel is gone (or going): "the kernel died:
// exited with status 3", the reason given to Kill...
func (k *Kernel) ExitReason() string { return k.reason() }

// Exited is closed once the kernel's process has exited (Err then says
// why).
func (k *Kernel) Exited() <-chan struct{} { return k.exited }

// awaitExit waits up to d for the process to exit, then kills it and waits.
func (k *Kernel) awaitExit(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-k.exited:
		return
	case <-t.C:
	}
	k.Kill("the kernel closed its event channel")
	<-k.exited
}

// Interrupt interrupts the running execution, if any, as Ctrl-C would
// (status "interrupted"; the kernel's state survives). If the code does not
// stop within the grace period the kernel is killed.
func (k *Kernel) Interrupt() {
	k.interrupt.Store(true)
	k.p.wake()
}

// Close kills the kernel and releases everything. It is safe to call more
// than once and concurrently with Execute, which then ends with "killed".
func (k *Kernel) Close() error {
	k.closeOnce.Do(func() {
		k.Kill("the kernel was closed")
		<-k.exited
		// A running Execute ends now (killed) once it has collected the
		// kernel's last output; then nobody uses the pipes.
		k.sem <- struct{}{}
		k.p.close()
		<-k.sem
	})
	return nil
}

// replySink waits for the reply of type typ to a request between cells
// (if tagged, the reply with its tag).
type replySink struct {
	typ    string
	status string
	tagged bool
	tag    int64
}

func (c *replySink) text(int, string) {}
func (c *replySink) setTag(t int64) {
	if c.tagged {
		c.tag = t
	}
}
func (c *replySink) event(ev *wireEvent) bool {
	if ev.Type == c.typ && ev.Tag == c.tag {
		c.status = string(ev.Status)
		return true
	}
	return false
}

// CheckComplete says whether code typed at a prompt is a complete cell
// ("complete"), needs more lines ("incomplete") or cannot compile
// ("invalid"), with the rules of Python's own prompt.
func (k *Kernel) CheckComplete(ctx context.Context, code string) (string, error) {
	return k.ask(ctx, map[string]any{"op": "is_complete", "code": code}, "is_complete", "a completeness check")
}

// SetEnv sets variables in the kernel's environment (os.environ), between
// cells: what the code and the processes it starts see from now on.
func (k *Kernel) SetEnv(ctx context.Context, env map[string]string) error {
	k.fresh.Store(false)
	_, err := k.ask(ctx, map[string]any{"op": "setenv", "env": env}, "setenv", "a request to set its environment")
	return err
}

// ask sends a request between cells and waits for the kernel's reply of
// type typ (what names the request in an error).
func (k *Kernel) ask(ctx context.Context, req map[string]any, typ, what string) (string, error) {
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return "", err
	}
	b, _ := json.Marshal(req)
	if err := k.p.writeRequest(append(b, '\n'), time.Now().Add(10*time.Second)); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return "", k.Err()
	}
	// Bounded: the kernel answers at once; a kernel that does not is broken.
	deadline := time.Now().Add(10 * time.Second)
	stop := context.AfterFunc(ctx, k.p.wake)
	defer stop()
	c := &replySink{typ: typ}
	for {
		stopped, err := k.p.step(time.Until(deadline), c)
		switch {
		case err != nil:
			k.Kill("protocol error: " + err.Error())
			return "", k.Err()
		case stopped:
			return c.status, nil
		case k.p.eof[streamEvents] || k.hasExited():
			k.awaitExit(time.Second)
			return "", k.Err()
		case ctx.Err() != nil:
			// The reply comes later and is skipped by the next reader.
			return "", ctx.Err()
		case time.Now().After(deadline):
			k.Kill("the kernel did not answer " + what)
			return "", k.Err()
		}
	}
}

// Execute runs one cell, calling onEvent (if not nil) for each event in
// order, and returns the aggregated result. Executions are serialized; a
// second call waits its turn or until ctx is done. A cell that fails is a
// Result with status "error"; the error return is for a kernel that cannot
// run anything (ErrDead) or a ctx done before the cell started. When ctx is
// done during the cell, the cell is interrupted.
func (k *Kernel) Execute(ctx context.Context, req Request, onEvent EventFunc) (*Result, error) {
	k.fresh.Store(false)
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return nil, err
	}
	k.interrupt.Store(false) // nothing was running
	x := &execution{k: k, req: req, onEvent: onEvent, start: time.Now()}
	x.stdout.limit = k.opts.MaxOutputBytes
	x.stderr.limit = k.opts.MaxOutputBytes

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Code string            `json:"code"`
		Env  map[string]string `json:"env,omitempty"`
	}{req.Code, req.Env}); err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	if err := k.p.writeRequest(buf.Bytes(), time.Now().Add(10*time.Second)); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return x.died(), nil
	}
	return x.run(ctx), nil
}

// execution is the state of one Execute call.
type execution struct {
	k       *Kernel
	req     Request
	onEvent EventFunc
	start   time.Time

	stdout, stderr capture
	res            Result
	timedOut       bool
	dying          bool   // collecting the last words of a dead kernel
	end            *Event // the end, if it came while dying
}

func (x *execution) run(ctx context.Context) *Result {
	k := x.k
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, k.p.wake)
		defer stop()
	}
	var timeoutAt, graceAt, resendAt time.Time
	if x.req.Timeout > 0 {
		timeoutAt = x.start.Add(x.req.Timeout)
	}
	interrupted, ctxSeen := false, false
	interrupt := func(now time.Time) {
		if interrupted {
			return
		}
		interrupted = true
		k.signal(os.Interrupt)
		graceAt = now.Add(k.opts.InterruptGrace)
		// A SIGINT that lands while the kernel is not in user code is
		// dropped; repeat it, as a user presses Ctrl-C again.
		resendAt = now.Add(k.opts.InterruptGrace / 4)
	}
	for {
		wait := time.Duration(-1)
		for _, at := range [...]time.Time{timeoutAt, graceAt, resendAt} {
			if !at.IsZero() {
				if d := max(time.Until(at), 0); wait < 0 || d < wait {
					wait = d
				}
			}
		}
		stopped, err := k.p.step(wait, x)
		if err != nil {
			k.Kill("protocol error: " + err.Error())
			return x.died()
		}
		if stopped {
			return &x.res
		}
		if k.p.eof[streamEvents] {
			k.awaitExit(time.Second)
			return x.died()
		}
		if k.hasExited() {
			return x.died()
		}
		now := time.Now()
		if !ctxSeen && ctx.Err() != nil {
			ctxSeen = true
			interrupt(now)
		}
		if k.interrupt.Swap(false) {
			interrupt(now)
		}
		if !timeoutAt.IsZero() && !now.Before(timeoutAt) {
			timeoutAt = time.Time{}
			x.timedOut = true
			interrupt(now)
		}
		if !graceAt.IsZero() && !now.Before(graceAt) {
			if x.timedOut {
				k.Kill(fmt.Sprintf("the execution exceeded its %s timeout and did not stop within %s of being interrupted; the kernel was killed", x.req.Timeout, k.opts.InterruptGrace))
			} else {
				k.Kill(fmt.Sprintf("the execution did not stop within %s of being interrupted; the kernel was killed", k.opts.InterruptGrace))
			}
			return x.died()
		}
		if !resendAt.IsZero() && !now.Before(resendAt) {
			k.signal(os.Interrupt)
			resendAt = now.Add(k.opts.InterruptGrace / 4)
		}
	}
}

func (k *Kernel) signal(sig os.Signal) {
	if err := k.proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, syscall.ESRCH) {
		k.log.Debug("signal kernel", "err", err)
	}
}

func (x *execution) emit(ev Event) {
	if x.onEvent != nil {
		x.onEvent(ev)
	}
}

func (x *execution) text(stream int, s string) {
	ev := Event{Type: EventStdout, Text: s}
	if stream == streamStderr {
		ev.Type = EventStderr
		x.stderr.write(s)
	} else {
		x.stdout.write(s)
	}
	x.emit(ev)
}

// event records and passes on one kernel event; it reports whether it was the end.
func (x *execution) event(w *wireEvent) bool {
	ev := w.Event
	switch ev.Type {
	case EventStdout:
		x.text(streamStdout, ev.Text)
	case EventStderr:
		x.text(streamStderr, ev.Text)
	case EventResult:
		x.res.Results = append(x.res.Results, Output{IsMainResult: ev.IsMainResult, Data: ev.Data})
		x.emit(ev)
	case EventError:
		if x.timedOut && ev.Name == "KeyboardInterrupt" {
			ev.Name = "TimeoutError"
			ev.Value = fmt.Sprintf("the execution exceeded its %s timeout and was interrupted; the session's state is kept", x.req.Timeout)
		}
		x.res.Error = &Exception{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
		x.emit(ev)
	case EventEnd:
		if x.dying {
			x.end = &ev
			return true
		}
		x.finish(ev)
		return true
	case "ready", "sync", "is_complete", "setenv", "checkpoint", "restore", "drop_checkpoint", "checkpoint_memory", "state_data", "state_end", "import_state":
		// A late reply to an abandoned request.
	default:
		x.k.log.Debug("unknown kernel event", "type", ev.Type)
	}
	return false
}

func (x *execution) finish(end Event) {
	if x.timedOut && end.Status == StatusInterrupted {
		end.Status = StatusTimeout
	}
	switch end.Status {
	case StatusOK, StatusError, StatusTimeout, StatusInterrupted, StatusKilled:
	default:
		end.Status = StatusError
	}
	x.k.count = end.ExecutionCount
	r := &x.res
	r.Status = end.Status
	r.ExecutionCount = end.ExecutionCount
	r.DurationMS = end.DurationMS
	r.CPUMS = end.CPUMS
	r.MemoryPeakBytes = end.MemoryPeakBytes
	r.Stdout = x.stdout.String()
	r.Stderr = x.stderr.String()
	r.Truncated = x.stdout.truncated() || x.stderr.truncated()
	if r.Results == nil {
		r.Results = []Output{}
	}
	x.emit(end)
}

// died finishes an execution whose kernel is gone (or going): it passes on
// what the kernel managed to say, then a KernelDied error and an end
// "killed".
func (x *execution) died() *Result {
	k := x.k
	if k.Err() == nil {
		k.Kill("the kernel stopped answering")
	}
	<-k.exited
	// The pipes end once every process of the kernel is gone; wait a
	// little for the last words (a faulthandler traceback, say).
	x.dying = true
	k.drain(x, time.Second)
	k.p.drainOutput(x) // including output held at a marker
	k.mu.Lock()
	killed := k.killReason != ""
	k.mu.Unlock()
	if x.end != nil && !killed {
		// It finished the cell and then died by itself (a thread calling
		// os._exit, say): report the cell as it was; the next one learns
		// that the kernel is dead.
		x.finish(*x.end)
		return &x.res
	}
	k.count++
	errEv := Event{Type: EventError, Name: "KernelDied", Value: k.reason()}
	x.res.Error = &Exception{Name: errEv.Name, Value: errEv.Value}
	x.emit(errEv)
	x.finish(Event{
		Type:           EventEnd,
		Status:         StatusKilled,
		ExecutionCount: k.count,
		DurationMS:     float64(time.Since(x.start).Microseconds()) / 1000,
	})
	return &x.res
}
