// Package kernel runs Python cells like a notebook: kernel.py (embedded)
// and the Go side of its protocol — execute, interrupt, events.
package kernel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// Source is kernel.py, the program that runs inside each sandbox. Run it as
// `python3 kernel.py` with the descriptors described by Files.
//
//go:embed kernel.py
var Source []byte

// Files are the kernel's ends of its pipes. A Launcher must hand them to
// kernel.py as descriptors 3, 4, 5 and 6 (see List); the kernel moves Stdout
// and Stderr onto its descriptors 1 and 2 as it starts. The program's own
// descriptors 1 and 2 carry only what Python says before that (a broken
// installation, say).
type Files struct {
	Requests *os.File // fd 3: requests, read end
	Events   *os.File // fd 4: events, write end
	Stdout   *os.File // fd 5: becomes fd 1
	Stderr   *os.File // fd 6: becomes fd 2
}

// List returns the files in descriptor order, from 3, for exec.Cmd.ExtraFiles.
func (f Files) List() []*os.File { return []*os.File{f.Requests, f.Events, f.Stdout, f.Stderr} }

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
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Errors callers may branch on.
var (
	// ErrDead means the kernel has died or was killed; it must be restarted.
	ErrDead = errors.New("kernel is dead")
)

// Kernel is a running kernel.py and the Go side of its protocol. Execute
// runs one cell at a time; Interrupt and Close may be called concurrently.
type Kernel struct {
	proc   Process
	opts   Options
	log    *slog.Logger
	token  string
	req    *os.File
	closeR []*os.File // our read ends

	items     chan item
	exited    chan struct{} // closed when Wait returned
	done      chan struct{} // closed by Close: stops the readers
	sem       chan struct{} // one execution at a time
	interrupt chan struct{}
	closeOnce sync.Once
	readers   sync.WaitGroup

	mu         sync.Mutex
	exitErr    error
	killReason string

	// Owned by the goroutine holding sem.
	count    int
	marks    [3]int64 // per stream: highest marker seen
	eof      [3]bool
	pending  []wireEvent
	writeBuf bytes.Buffer
}

type itemKind uint8

const (
	itemText itemKind = iota
	itemMark
	itemEvent
	itemEOF
	itemBad // a protocol violation; err says which
)

const (
	chanEvents = 0
	chanStdout = 1
	chanStderr = 2
)

// item is what the reader goroutines hand to the executing goroutine.
type item struct {
	kind   itemKind
	stream int
	text   string
	seq    int64
	ev     wireEvent
	err    error
}

// wireEvent is an Event as the kernel sends it.
type wireEvent struct {
	Event
	Seq    int64  `json:"seq"`
	Pid    int    `json:"pid"`
	Python string `json:"python"`
}

// Start launches a kernel and waits until it is ready. ctx bounds only the
// start; the kernel lives until Close or until it dies.
func Start(ctx context.Context, launch Launcher, opts *Options) (*Kernel, error) {
	k := &Kernel{
		items:     make(chan item, 256),
		exited:    make(chan struct{}),
		done:      make(chan struct{}),
		sem:       make(chan struct{}, 1),
		interrupt: make(chan struct{}, 1),
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
	if k.opts.MaxEventBytes <= 0 {
		k.opts.MaxEventBytes = 32 << 20
	}
	k.log = k.opts.Logger
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	var tok [12]byte
	rand.Read(tok[:])
	k.token = hex.EncodeToString(tok[:])

	var child, ours []*os.File
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		return
	}
	reqR, reqW, err1 := pipe()
	evR, evW, err2 := pipe()
	outR, outW, err3 := pipe()
	errR, errW, err4 := pipe()
	for _, f := range []*os.File{reqR, evW, outW, errW} {
		if f != nil {
			child = append(child, f)
		}
	}
	for _, f := range []*os.File{reqW, evR, outR, errR} {
		if f != nil {
			ours = append(ours, f)
		}
	}
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll(child)
		closeAll(ours)
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	proc, err := launch(context.WithoutCancel(ctx), Files{Requests: reqR, Events: evW, Stdout: outW, Stderr: errW})
	closeAll(child) // the kernel has its copies; EOF must mean the kernel is gone
	if err != nil {
		closeAll(ours)
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	k.proc = proc
	k.req = reqW
	k.closeR = []*os.File{evR, outR, errR}

	go func() {
		err := proc.Wait()
		k.mu.Lock()
		k.exitErr = err
		k.mu.Unlock()
		close(k.exited)
	}()
	k.readers.Add(3)
	go k.readEvents(evR)
	go k.readStream(outR, chanStdout)
	go k.readStream(errR, chanStderr)

	hello, _ := json.Marshal(map[string]any{"token": k.token, "max_event_bytes": k.opts.MaxEventBytes - 4096})
	if err := k.write(append(hello, '\n')); err != nil {
		k.Kill("could not send the hello")
		k.Close()
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	if err := k.awaitReady(ctx); err != nil {
		k.Close()
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	return k, nil
}

func (k *Kernel) awaitReady(ctx context.Context) error {
	var stderr capture
	stderr.limit = 8 << 10
	for {
		select {
		case it := <-k.items:
			switch it.kind {
			case itemEvent:
				if it.ev.Type == "ready" {
					k.log.Debug("kernel ready", "pid", it.ev.Pid, "python", it.ev.Python)
					return nil
				}
			case itemText:
				if it.stream == chanStderr {
					stderr.write(it.text)
				}
			case itemBad:
				k.Kill("protocol error: " + it.err.Error())
				return it.err
			case itemEOF:
				if it.stream == chanEvents {
					k.awaitExit(time.Second)
					return fmt.Errorf("kernel exited during start (%s): %s", k.reason(), stderr.String())
				}
			}
		case <-k.exited:
			// Collect what it said on stderr before dying.
			k.drainText(&stderr, time.Second)
			return fmt.Errorf("kernel exited during start (%s): %s", k.reason(), stderr.String())
		case <-ctx.Done():
			k.Kill("start canceled")
			return ctx.Err()
		}
	}
}

// drainText collects stderr text until both output streams end or d passes.
func (k *Kernel) drainText(c *capture, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for !(k.eof[chanStdout] && k.eof[chanStderr]) {
		select {
		case it := <-k.items:
			switch it.kind {
			case itemText:
				if it.stream == chanStderr {
					c.write(it.text)
				}
			case itemEOF:
				k.eof[it.stream] = true
			}
		case <-t.C:
			return
		}
	}
}

// send hands an item to the executing goroutine; false once the kernel is closed.
func (k *Kernel) send(it item) bool {
	select {
	case k.items <- it:
		return true
	case <-k.done:
		return false
	}
}

func (k *Kernel) readEvents(r io.Reader) {
	defer k.readers.Done()
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long, line...)
			if len(long) > k.opts.MaxEventBytes {
				k.send(item{kind: itemBad, err: fmt.Errorf("event longer than %d bytes", k.opts.MaxEventBytes)})
				return
			}
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var ev wireEvent
			if jerr := json.Unmarshal(line, &ev); jerr != nil || ev.Type == "" {
				k.send(item{kind: itemBad, err: fmt.Errorf("not an event: %.80q", line)})
				return
			}
			if !k.send(item{kind: itemEvent, ev: ev}) {
				return
			}
		}
		if err != nil {
			k.send(item{kind: itemEOF, stream: chanEvents})
			return
		}
	}
}

func (k *Kernel) readStream(r io.Reader, stream int) {
	defer k.readers.Done()
	sp := newSplitter(k.token)
	buf := make([]byte, 32<<10)
	ok := true
	text := func(b []byte) {
		if ok {
			ok = k.send(item{kind: itemText, stream: stream, text: string(b)})
		}
	}
	mark := func(seq int64) {
		if ok {
			ok = k.send(item{kind: itemMark, stream: stream, seq: seq})
		}
	}
	for ok {
		n, err := r.Read(buf)
		if n > 0 {
			sp.feed(buf[:n], text, mark)
		}
		if err != nil {
			sp.flush(text)
			if ok {
				k.send(item{kind: itemEOF, stream: stream})
			}
			return
		}
	}
}

func (k *Kernel) write(b []byte) error {
	// The kernel reads each request whole before acting on it, so a write
	// only blocks if the kernel is stuck or hostile.
	k.req.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := k.req.Write(b)
	return err
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
	select {
	case k.interrupt <- struct{}{}:
	default:
	}
}

// Close kills the kernel and releases everything. It is safe to call more
// than once and concurrently with Execute, which then ends with "killed".
func (k *Kernel) Close() error {
	k.closeOnce.Do(func() {
		k.Kill("the kernel was closed")
		<-k.exited
		// A running Execute ends now (killed); wait for it so it can
		// collect the kernel's last output, then stop the readers.
		k.sem <- struct{}{}
		close(k.done)
		k.req.Close()
		for _, f := range k.closeR {
			f.Close()
		}
		k.readers.Wait()
		<-k.sem
	})
	return nil
}

// CheckComplete says whether code typed at a prompt is a complete cell
// ("complete"), needs more lines ("incomplete") or cannot compile
// ("invalid"), with the rules of Python's own prompt.
func (k *Kernel) CheckComplete(ctx context.Context, code string) (string, error) {
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return "", err
	}
	b, _ := json.Marshal(map[string]string{"op": "is_complete", "code": code})
	if err := k.write(append(b, '\n')); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return "", k.Err()
	}
	for {
		select {
		case it := <-k.items:
			switch it.kind {
			case itemEvent:
				if it.ev.Type == "is_complete" {
					return string(it.ev.Status), nil
				}
				k.pending = append(k.pending, it.ev)
			case itemMark:
				k.marks[it.stream] = max(k.marks[it.stream], it.seq)
			case itemBad:
				k.Kill("protocol error: " + it.err.Error())
				return "", k.Err()
			case itemEOF:
				k.eof[it.stream] = true
				if it.stream == chanEvents {
					k.awaitExit(time.Second)
					return "", k.Err()
				}
			}
		case <-k.exited:
			return "", k.Err()
		case <-ctx.Done():
			// The reply will come; a stray reply is ignored by Execute.
			return "", ctx.Err()
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
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return nil, err
	}
	select {
	case <-k.interrupt: // stale: nothing was running
	default:
	}
	x := &execution{k: k, req: req, onEvent: onEvent, start: time.Now()}
	x.stdout.limit = k.opts.MaxOutputBytes
	x.stderr.limit = k.opts.MaxOutputBytes

	k.writeBuf.Reset()
	enc := json.NewEncoder(&k.writeBuf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Code string            `json:"code"`
		Env  map[string]string `json:"env,omitempty"`
	}{req.Code, req.Env}); err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	if err := k.write(k.writeBuf.Bytes()); err != nil {
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
}

func (x *execution) run(ctx context.Context) *Result {
	k := x.k
	var timeoutC, graceC, resendC <-chan time.Time
	if x.req.Timeout > 0 {
		t := time.NewTimer(x.req.Timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	ctxDone := ctx.Done()
	interruptC := (<-chan struct{})(k.interrupt)
	interrupted := false
	var graceT *time.Timer
	var resendT *time.Ticker
	defer func() {
		if graceT != nil {
			graceT.Stop()
			resendT.Stop()
		}
	}()
	interrupt := func() {
		if interrupted {
			return
		}
		interrupted = true
		k.signal(os.Interrupt)
		graceT = time.NewTimer(k.opts.InterruptGrace)
		graceC = graceT.C
		// A SIGINT that lands while the kernel is not in user code is
		// dropped; repeat it, as a user presses Ctrl-C again.
		resendT = time.NewTicker(k.opts.InterruptGrace / 4)
		resendC = resendT.C
	}
	for {
		select {
		case it := <-k.items:
			switch it.kind {
			case itemText:
				x.text(it.stream, it.text)
			case itemMark:
				k.marks[it.stream] = max(k.marks[it.stream], it.seq)
			case itemEvent:
				if it.ev.Seq > 0 { // replies without a seq (stray is_complete) are not ours
					k.pending = append(k.pending, it.ev)
				}
			case itemBad:
				k.Kill("protocol error: " + it.err.Error())
				return x.died()
			case itemEOF:
				k.eof[it.stream] = true
				if it.stream == chanEvents {
					k.awaitExit(time.Second)
					return x.died()
				}
			}
			if x.deliver() {
				return &x.res
			}
		case <-k.exited:
			return x.died()
		case <-timeoutC:
			x.timedOut = true
			interrupt()
		case <-interruptC:
			interruptC = nil
			interrupt()
		case <-ctxDone:
			ctxDone = nil
			interrupt()
		case <-resendC:
			k.signal(os.Interrupt)
		case <-graceC:
			if x.timedOut {
				k.Kill(fmt.Sprintf("the execution exceeded its %s timeout and did not stop within %s of being interrupted; the kernel was killed", x.req.Timeout, k.opts.InterruptGrace))
			} else {
				k.Kill(fmt.Sprintf("the execution did not stop within %s of being interrupted; the kernel was killed", k.opts.InterruptGrace))
			}
			<-k.exited
			return x.died()
		}
	}
}

func (k *Kernel) signal(sig os.Signal) {
	if err := k.proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, syscall.ESRCH) {
		k.log.Debug("signal kernel", "err", err)
	}
}

// deliver passes on the pending events whose output has all arrived, and
// reports whether the end event was among them.
func (x *execution) deliver() bool {
	k := x.k
	for len(k.pending) > 0 {
		ev := k.pending[0]
		for _, s := range [...]int{chanStdout, chanStderr} {
			if k.marks[s] < ev.Seq && !k.eof[s] {
				return false
			}
		}
		k.pending = k.pending[1:]
		if x.event(ev.Event) {
			k.pending = k.pending[:0:0]
			return true
		}
	}
	return false
}

func (x *execution) emit(ev Event) {
	if x.onEvent != nil {
		x.onEvent(ev)
	}
}

func (x *execution) text(stream int, s string) {
	ev := Event{Type: EventStdout, Text: s}
	if stream == chanStderr {
		ev.Type = EventStderr
		x.stderr.write(s)
	} else {
		x.stdout.write(s)
	}
	x.emit(ev)
}

// event records and passes on one kernel event; it reports whether it was the end.
func (x *execution) event(ev Event) bool {
	switch ev.Type {
	case EventStdout, EventStderr:
		stream := chanStdout
		if ev.Type == EventStderr {
			stream = chanStderr
		}
		x.text(stream, ev.Text)
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
		if x.timedOut && ev.Status == StatusInterrupted {
			ev.Status = StatusTimeout
		}
		switch ev.Status {
		case StatusOK, StatusError, StatusTimeout, StatusInterrupted:
		default:
			ev.Status = StatusError
		}
		x.k.count = ev.ExecutionCount
		x.finish(ev)
		return true
	default:
		x.k.log.Debug("unknown kernel event", "type", ev.Type)
	}
	return false
}

func (x *execution) finish(end Event) {
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

// died finishes an execution whose kernel is gone: it passes on what the
// kernel managed to say, then a KernelDied error and an end "killed".
func (x *execution) died() *Result {
	k := x.k
	if k.Err() == nil {
		k.Kill("the kernel stopped answering")
	}
	<-k.exited
	// The output pipes end once every process of the kernel is gone; wait
	// a little for the last words (a faulthandler traceback, say).
	t := time.NewTimer(time.Second)
	defer t.Stop()
drain:
	for !(k.eof[chanStdout] && k.eof[chanStderr] && k.eof[chanEvents]) {
		select {
		case it := <-k.items:
			switch it.kind {
			case itemText:
				x.text(it.stream, it.text)
			case itemEvent:
				if it.ev.Seq > 0 {
					k.pending = append(k.pending, it.ev)
				}
			case itemEOF:
				k.eof[it.stream] = true
			case itemBad:
				k.eof[chanEvents] = true
			}
		case <-t.C:
			break drain
		}
	}
	for _, ev := range k.pending {
		if ev.Type == EventEnd {
			// It finished before dying: report the execution as it was.
			x.event(ev.Event)
			k.pending = nil
			return &x.res
		}
		x.event(ev.Event)
	}
	k.pending = nil
	k.count++
	reason := k.reason()
	errEv := Event{Type: EventError, Name: "KernelDied", Value: reason}
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
