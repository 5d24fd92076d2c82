package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
)

// The process.Process messages served (envd's process.proto).

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	PTY     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

// ptyConfig is envd's PTY: the process runs on a pseudo-terminal of this
// size; its output comes as data.pty, its input goes as input.pty.
type ptyConfig struct {
	Size *struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"size"`
}

// windowSize is the size a PTY asks for.
func (c *ptyConfig) windowSize() (jail.WindowSize, error) {
	if c.Size == nil {
		return jail.WindowSize{}, connect.NewError(connect.CodeInvalidArgument, errors.New("pty.size is required: {cols, rows}"))
	}
	ws := jail.WindowSize{Cols: int(min(c.Size.Cols, 1<<20)), Rows: int(min(c.Size.Rows, 1<<20))}
	if ws.Cols < 1 || ws.Rows < 1 || ws.Cols > jail.MaxWindowSide || ws.Rows > jail.MaxWindowSide {
		return ws, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size: %d columns by %d rows: each must be 1-%d", c.Size.Cols, c.Size.Rows, jail.MaxWindowSide))
	}
	return ws, nil
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	PTY     *ptyConfig       `json:"pty"`
}

type processSelector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type selectRequest struct {
	Process *processSelector `json:"process"`
}

type sendSignalRequest struct {
	Process *processSelector `json:"process"`
	Signal  string           `json:"signal"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *struct {
		Stdin []byte `json:"stdin,omitempty"`
		PTY   []byte `json:"pty,omitempty"`
	} `json:"input"`
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32  `json:"exitCode"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

// eventResponse is StartResponse and ConnectResponse.
type eventResponse struct {
	Event processEvent `json:"event"`
}

// process is one command of a sandbox, inside the sandbox's jail (the
// kernel's: see session.StartCommand). It outlives the request that
// started it; its output goes to every stream attached to it. What it
// leaves running when it ends lives until the sandbox ends.
type process struct {
	pid   uint32
	tag   *string
	cfg   processConfig
	jp    *jail.Process
	stdin *io.PipeWriter // nil: started without stdin; with pty, the terminal's input
	pty   bool           // on a pseudo-terminal: input and output are input.pty and data.pty
	ended chan struct{}

	mu    sync.Mutex
	subs  map[chan processEvent]bool
	end   *endEvent
	trace *commandTrace // Options.CommandTrace's record; nil if none
}

// commandTrace is a command's stages, as Unix times in nanoseconds (0:
// not reached): the Start request's arrival in the handler, the join
// asked for (the working directory made), the program about to be
// executed in the jail (StartCommand returned), the start event sent,
// the first output published, the program's end (its Wait returned),
// the end event sent. Prepared: the join was made ahead.
type commandTrace struct {
	Sandbox     string `json:"sandbox"`
	Cmd         string `json:"cmd"`
	Prepared    bool   `json:"prepared"`
	Handler     int64  `json:"handler"`
	Join        int64  `json:"join"`
	Started     int64  `json:"started"`
	StartSent   int64  `json:"start_sent"`
	FirstOutput int64  `json:"first_output"`
	Exited      int64  `json:"exited"`
	EndSent     int64  `json:"end_sent"`
}

// mark sets *at to now, if tracing and not set yet.
func (p *process) mark(at func(*commandTrace) *int64) {
	if p.trace == nil {
		return
	}
	now := time.Now().UnixNano()
	p.mu.Lock()
	if f := at(p.trace); *f == 0 {
		*f = now
	}
	p.mu.Unlock()
}

// subBuffer is how many events a slow stream may lag behind before it is
// cut off (the process never waits for a reader).
const subBuffer = 1024

// subscribe attaches a stream; it receives events from now on, and the
// end event even if the process already ended.
func (p *process) subscribe() chan processEvent {
	ch := make(chan processEvent, subBuffer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		ch <- processEvent{End: p.end}
		close(ch)
		return ch
	}
	p.subs[ch] = true
	return ch
}

func (p *process) unsubscribe(ch chan processEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs[ch] {
		delete(p.subs, ch)
		close(ch)
	}
}

// publish sends ev to every stream; a stream too far behind is closed
// without an end event, which its handler reports.
func (p *process) publish(ev processEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ev.End != nil {
		p.end = ev.End
	}
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
			delete(p.subs, ch)
			close(ch)
			continue
		}
		if ev.End != nil {
			delete(p.subs, ch)
			close(ch)
		}
	}
}

type outWriter struct {
	p      *process
	stderr bool
}

func (w outWriter) Write(b []byte) (int, error) {
	d := &dataEvent{}
	switch {
	case w.p.pty:
		// Only this case reaches the SDK's onData of a PTY.
		d.PTY = append([]byte(nil), b...)
	case w.stderr:
		d.Stderr = append([]byte(nil), b...)
	default:
		d.Stdout = append([]byte(nil), b...)
	}
	w.p.mark(func(t *commandTrace) *int64 { return &t.FirstOutput })
	w.p.publish(processEvent{Data: d})
	return len(b), nil
}

func (p *process) kill() { p.jp.Kill() }

func (p *process) info() processInfo {
	return processInfo{Config: p.cfg, PID: p.pid, Tag: p.tag}
}

func (h *Handler) processHandlers() []rpcHandler {
	return []rpcHandler{
		{"/process.Process/Start", connect.NewServerStreamHandler("/process.Process/Start", h.start, connectOptions...)},
		{"/process.Process/Connect", connect.NewServerStreamHandler("/process.Process/Connect", h.connectProcess, connectOptions...)},
		unary("/process.Process/List", h.listProcesses),
		unary("/process.Process/SendSignal", h.sendSignal),
		unary("/process.Process/SendInput", h.sendInput),
		unary("/process.Process/CloseStdin", h.closeStdin),
		unary("/process.Process/Update", h.updateProcess),
	}
}

// commandEnv is the environment of a command: what kernels get, less the
// kernel's own matplotlib backend, then the sandbox's variables, then the
// command's.
func commandEnv(templateEnv []string, sandboxVars, vars map[string]string) []string {
	var env []string
	for _, kv := range session.KernelEnv() {
		if !strings.HasPrefix(kv, "MPLBACKEND=") {
			env = append(env, kv)
		}
	}
	env = append(env, templateEnv...) // the template's PATH and VIRTUAL_ENV, as its kernel has
	merged := map[string]string{}
	for k, v := range sandboxVars {
		merged[k] = v
	}
	for k, v := range vars {
		merged[k] = v
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+merged[k])
	}
	return env
}

// program resolves a command name the way the jail's PATH would: the jail's
// root shows the host's system directories read-only.
func program(cmd string) string {
	if strings.Contains(cmd, "/") {
		return cmd
	}
	for _, dir := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		if fi, err := os.Stat(path.Join(dir, cmd)); err == nil && !fi.IsDir() {
			return path.Join(dir, cmd)
		}
	}
	return cmd
}

func (h *Handler) start(ctx context.Context, req *connect.Request[startRequest], stream *connect.ServerStream[eventResponse]) error {
	arrived := time.Now().UnixNano()
	sb := sandboxOf(ctx)
	m := req.Msg
	var terminal *jail.WindowSize
	if m.PTY != nil {
		ws, err := m.PTY.windowSize()
		if err != nil {
			return err
		}
		terminal = &ws
	}
	if m.Process == nil || m.Process.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	for k := range m.Process.Envs {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("envs: %q is not a valid variable name", k))
		}
	}
	dir := homeDir
	if m.Process.Cwd != nil && *m.Process.Cwd != "" {
		dir = *m.Process.Cwd
		if !path.IsAbs(dir) {
			dir = path.Join(homeDir, dir)
		}
	}
	if rel, err := relPath(dir); err == nil {
		// A missing working directory is made, as envd does for the home.
		ws, err := h.files(sb)
		if err == nil {
			if _, serr := ws.Stat(rel); serr != nil {
				ws.Mkdir(rel)
			}
			ws.Close()
		}
	}
	sb.mu.Lock()
	running := len(sb.procs)
	sb.mu.Unlock()
	if running >= h.opts.MaxProcesses {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("a sandbox runs at most %d commands at once: kill one first", h.opts.MaxProcesses))
	}
	// Connect-Timeout-Ms bounds the process, not only this stream: envd
	// kills it at the deadline. Without the header it runs until killed.
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	p := &process{tag: m.Tag, cfg: *m.Process, ended: make(chan struct{}), subs: map[chan processEvent]bool{}}
	if h.opts.CommandTrace != nil {
		p.trace = &commandTrace{Sandbox: sb.id, Cmd: m.Process.Cmd, Handler: arrived}
	}
	if p.cfg.Args == nil {
		p.cfg.Args = []string{}
	}
	if p.cfg.Envs == nil {
		p.cfg.Envs = map[string]string{}
	}
	var stdinR *io.PipeReader
	if m.Stdin != nil && *m.Stdin || terminal != nil {
		stdinR, p.stdin = io.Pipe()
	}
	p.pty = terminal != nil
	sub := p.subscribe()
	if n := sb.userNotice(req.Header()); n != "" {
		_, _ = outWriter{p, true}.Write([]byte(n)) // before the command's own output
	}
	// The process belongs to the sandbox, not to this request: a client
	// that goes away leaves it running (background commands).
	// It runs inside the sandbox's own jail, beside the kernel: the same
	// /tmp, loopback, processes, network and limits (session.Command).
	_, tenv := sb.ms.TemplateJail()
	env := commandEnv(tenv, sb.envVars, p.cfg.Envs)
	env = append([]string{"HOME=" + homeDir}, env...)
	env = append(env, "PWD="+dir) // bash's pwd names the directory as it was asked for
	p.mark(func(t *commandTrace) *int64 { return &t.Join })
	prepared := sb.ms.PreparedCommands()
	h.opts.Manager.CommandsRun() // new sandboxes make their first command's join ahead
	jp, err := sb.ms.StartCommand(context.Background(), session.Command{
		Path:     program(p.cfg.Cmd),
		Args:     append([]string{p.cfg.Cmd}, p.cfg.Args...),
		Env:      env,
		Dir:      dir,
		Stdin:    readerOrNil(stdinR),
		Stdout:   outWriter{p, false},
		Stderr:   outWriter{p, true},
		Terminal: terminal,
		Timeout:  timeout,
	})
	if err != nil {
		var ae *jail.ArgumentError
		switch {
		case errors.As(err, &ae):
			return connect.NewError(connect.CodeInvalidArgument, err)
		case errors.Is(err, session.ErrClosed):
			return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("start %s: %w", p.cfg.Cmd, err))
	}
	p.jp = jp
	p.mark(func(t *commandTrace) *int64 { return &t.Started })
	if p.trace != nil {
		warm := sb.ms.PreparedCommands() > prepared
		p.mu.Lock()
		p.trace.Prepared = warm
		p.mu.Unlock()
	}
	sb.mu.Lock()
	if sb.done {
		sb.mu.Unlock()
		jp.Kill()
		jp.Wait()
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
	}
	sb.nextPID++
	p.pid = 1000 + sb.nextPID
	sb.procs[p.pid] = p
	sb.mu.Unlock()
	go h.waitProcess(sb, p)
	if err := stream.Send(&eventResponse{Event: processEvent{Start: &startEvent{PID: p.pid}}}); err != nil {
		p.unsubscribe(sub)
		return err
	}
	p.mark(func(t *commandTrace) *int64 { return &t.StartSent })
	err = relay(ctx, p, sub, stream)
	if p.trace != nil {
		h.writeTrace(p)
	}
	return err
}

// userNotice is what the first command of a sandbox asked to run as a
// user it does not have (the SDKs' `user: 'root'`, sent as the
// Authorization header's Basic user name) says on its stderr, before its
// own output: a sandbox has one user, and no root, so the command runs as
// that user. Said once per sandbox; "" for every other command. (Files
// need no notice: what the user may not write fails, saying so.)
func (sb *sandbox) userNotice(h http.Header) string {
	name := basicUser(h.Get("Authorization"))
	if name == "" || name == sandboxUser || name == jail.SandboxUser {
		return ""
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.userSaid {
		return ""
	}
	sb.userSaid = true
	return fmt.Sprintf("[sandloop] this sandbox has one user and no root: commands asked to run as %q run as that user (%s, uid %d)\n",
		name, jail.SandboxUser, jail.SandboxUID)
}

// basicUser is the user name of an Authorization header's Basic
// credentials ("" if there are none).
func basicUser(auth string) string {
	scheme, cred, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name
}

// writeTrace writes p's stages to Options.CommandTrace.
func (h *Handler) writeTrace(p *process) {
	p.mark(func(t *commandTrace) *int64 { return &t.EndSent })
	p.mu.Lock()
	b, _ := json.Marshal(p.trace)
	p.mu.Unlock()
	h.traceMu.Lock()
	defer h.traceMu.Unlock()
	_, _ = h.opts.CommandTrace.Write(append(b, '\n'))
}

func readerOrNil(r *io.PipeReader) io.Reader {
	if r == nil {
		return nil
	}
	return r
}

// timeoutPassed ends the stream of a command killed at its deadline
// (Connect-Timeout-Ms).
func timeoutPassed() error {
	return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout passed: it was killed"))
}

// relay streams a process's events until it ends or the client leaves.
func relay(ctx context.Context, p *process, sub chan processEvent, stream *connect.ServerStream[eventResponse]) error {
	defer p.unsubscribe(sub)
	for {
		select {
		case ev, ok := <-sub:
			if !ok {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("the stream fell too far behind the process's output"))
			}
			if ev.End != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// Killed by the jail's timer, set to the same deadline,
				// before this select saw the context's end: the client
				// hears of its deadline either way.
				return timeoutPassed()
			}
			if err := stream.Send(&eventResponse{Event: ev}); err != nil {
				return err
			}
			if ev.End != nil {
				return nil
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The jail's own timer fires at the same deadline; make
				// sure it is gone before the client hears of it.
				p.kill()
				select {
				case <-p.ended:
				case <-time.After(5 * time.Second):
				}
				return timeoutPassed()
			}
			return ctx.Err()
		}
	}
}

// waitProcess reports a process's end to its streams and forgets it.
func (h *Handler) waitProcess(sb *sandbox, p *process) {
	r, err := p.jp.Wait()
	p.mark(func(t *commandTrace) *int64 { return &t.Exited })
	end := &endEvent{Exited: true, Status: "exit status 0"}
	switch {
	case err != nil:
		end = &endEvent{ExitCode: -1, Status: "error", Error: err.Error()}
	case r.Signal != "":
		h.log.Info("e2b: a command ended by a signal", "sandbox", sb.id, "pid", p.pid, "signal", r.Signal, "timed_out", r.TimedOut, "unreported", r.Unreported)
		name := strings.ToLower(strings.TrimPrefix(r.Signal, "SIG"))
		if name == "kill" {
			name = "killed"
		}
		end = &endEvent{ExitCode: -1, Status: "signal: " + name}
		if r.TimedOut {
			end.Error = "the command's timeout passed"
		}
	case r.ExitCode != 0:
		end = &endEvent{ExitCode: int32(r.ExitCode), Exited: true, Status: fmt.Sprintf("exit status %d", r.ExitCode)}
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
	sb.mu.Lock()
	if sb.procs[p.pid] == p {
		delete(sb.procs, p.pid)
	}
	done := sb.done
	sb.mu.Unlock()
	p.publish(processEvent{End: end})
	close(p.ended)
	if !done {
		// The next command's join, off this one's path, unless the
		// sandbox is killed right after (ComputeSDK's create, command,
		// kill: a join made then would be wasted CPU).
		time.AfterFunc(prepareAfter, func() {
			sb.mu.Lock()
			done := sb.done
			sb.mu.Unlock()
			if !done {
				h.prepareCommand(sb)
			}
		})
	}
}

// prepareAfter is how long after a command ends the next one's join is
// made ahead.
const prepareAfter = 100 * time.Millisecond

// find returns the running process a selector names.
func (sb *sandbox) find(sel *processSelector) (*process, error) {
	if sel == nil || sel.PID == nil && sel.Tag == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.pid or process.tag is required"))
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, p := range sb.procs {
		if sel.PID != nil && p.pid == *sel.PID || sel.PID == nil && p.tag != nil && *p.tag == *sel.Tag {
			return p, nil
		}
	}
	what := ""
	if sel.PID != nil {
		what = fmt.Sprintf("pid %d", *sel.PID)
	} else {
		what = fmt.Sprintf("tag %q", *sel.Tag)
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no running process with %s", what))
}

func (h *Handler) connectProcess(ctx context.Context, req *connect.Request[selectRequest], stream *connect.ServerStream[eventResponse]) error {
	p, err := sandboxOf(ctx).find(req.Msg.Process)
	if err != nil {
		return err
	}
	sub := p.subscribe()
	if err := stream.Send(&eventResponse{Event: processEvent{Start: &startEvent{PID: p.pid}}}); err != nil {
		p.unsubscribe(sub)
		return err
	}
	return relay(ctx, p, sub, stream)
}

func (h *Handler) listProcesses(ctx context.Context, _ *empty) (*listResponse, error) {
	sb := sandboxOf(ctx)
	out := listResponse{Processes: []processInfo{}}
	sb.mu.Lock()
	for _, p := range sb.procs {
		out.Processes = append(out.Processes, p.info())
	}
	sb.mu.Unlock()
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].PID < out.Processes[j].PID })
	return &out, nil
}

func (h *Handler) sendSignal(ctx context.Context, req *sendSignalRequest) (*empty, error) {
	p, err := sandboxOf(ctx).find(req.Process)
	if err != nil {
		return nil, err
	}
	switch req.Signal {
	case "SIGNAL_SIGKILL", "9":
		p.kill() // its process group: a shell's children go too
	case "SIGNAL_SIGTERM", "15":
		if err := p.jp.Signal(syscall.SIGTERM); err != nil {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d: %v", p.pid, err))
		}
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %q: send SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Signal))
	}
	return &empty{}, nil
}

func (h *Handler) sendInput(ctx context.Context, req *sendInputRequest) (*empty, error) {
	p, err := sandboxOf(ctx).find(req.Process)
	if err != nil {
		return nil, err
	}
	switch {
	case req.Input == nil || req.Input.PTY == nil && req.Input.Stdin == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input.stdin or input.pty is required"))
	case p.pty && req.Input.PTY == nil:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d runs on a PTY: send input.pty", p.pid))
	case !p.pty && req.Input.PTY != nil:
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY: send input.stdin", p.pid))
	case p.pty:
		if _, err := p.stdin.Write(req.Input.PTY); err != nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: its terminal is closed", p.pid))
		}
		return &empty{}, nil
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d was started without stdin: start it with stdin: true", p.pid))
	}
	if _, err := p.stdin.Write(req.Input.Stdin); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: stdin is closed", p.pid))
	}
	return &empty{}, nil
}

// updateProcess resizes a PTY (the program gets SIGWINCH).
func (h *Handler) updateProcess(ctx context.Context, req *updateRequest) (*empty, error) {
	p, err := sandboxOf(ctx).find(req.Process)
	if err != nil {
		return nil, err
	}
	if req.PTY == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pty is required: {size: {cols, rows}}"))
	}
	if !p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY to resize", p.pid))
	}
	ws, err := req.PTY.windowSize()
	if err != nil {
		return nil, err
	}
	if err := p.jp.Resize(ws); err != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d: %v", p.pid, err))
	}
	return &empty{}, nil
}

func (h *Handler) closeStdin(ctx context.Context, req *selectRequest) (*empty, error) {
	p, err := sandboxOf(ctx).find(req.Process)
	if err != nil {
		return nil, err
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
	return &empty{}, nil
}
