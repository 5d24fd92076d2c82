// Package runs starts agent runs, records every step and event in the run
// history and fans events out to live watchers. The CLI runs one in the
// foreground; the server runs many in the background.
package runs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/lessons"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Session is a sandbox session the service may close.
type Session interface {
	agent.Session
	Close() error
}

// Options configure the service.
type Options struct {
	Store store.History
	// NewSession starts a fresh sandbox session for a run.
	NewSession func(ctx context.Context) (Session, error)
	// Provider resolves a model spec ("openai/gpt-4o-mini", or "" for the
	// configured default) to a provider.
	Provider func(ctx context.Context, model string) (llm.Provider, error)
	// Lessons, if set, keeps the lessons runs learn and recalls them in
	// later runs of the same owner (internal/lessons). If nil, runs
	// neither learn nor recall.
	Lessons lessons.Store
	// MaxArtifactBytes caps the final files kept per run. If zero, 50 MiB.
	MaxArtifactBytes int64
	// PreviewURL, if set, names the preview URL of a port of a session
	// that stays open until expires (a signed URL of the server's). With
	// it, an app run whose agent leaves a server listening keeps its
	// session PreviewFor past the run, and its report lists the previews
	// (agent.Report.Previews); the session is closed when they expire, or
	// at Cancel of the ended run, or when the server's maximum lifetime of
	// a session is reached, whichever comes first. If nil, every run's
	// session is closed as the run ends.
	PreviewURL func(sessionID string, port int, expires time.Time) string
	// PreviewFor is how long a run's previews are kept. If zero, 30 minutes.
	PreviewFor time.Duration
	// Cell, if set, is the cell's sessions table, where a cell's gateway
	// recorded which host runs each run: an app run that keeps its session
	// for its previews records the session there too, on the run's host,
	// so that the previews open through a gateway as any session's ports
	// do. If nil (serve alone), nothing is recorded.
	Cell   Placements
	Logger *slog.Logger
}

// placementWait is how long a run that keeps previews waits for the
// gateway's record of it (runs.place).
const placementWait = 5 * time.Second

// Placements is the cell's sessions table (store.Postgres).
type Placements interface {
	GetPlacement(ctx context.Context, id string) (*store.Placement, error)
	PutPlacement(ctx context.Context, pl store.Placement) error
	DeletePlacement(ctx context.Context, id string) error
}

// PlacementOwner owns, in the cell's sessions table, the sessions runs
// keep for their previews: no token's owner (server.OwnerOf is hex of 16
// digits), so a gateway routes only their ports' traffic to them (which
// the host lets pass with a preview's signature), never the session API.
const PlacementOwner = "runs"

// DefaultPreviewFor is how long an app run's previews are kept when
// Options.PreviewFor is zero.
const DefaultPreviewFor = 30 * time.Minute

// Request is one run to start.
type Request struct {
	// Owner is recorded with the run (store.Run.Owner).
	Owner string
	Task  string
	Mode  agent.Mode
	Model string
	Files map[string][]byte
	Entry string
	Args  []string
	// Checks are refactor mode's behaviour checks (commands).
	Checks []string
	// Network says the run's sandbox has the host's network (install_packages may use pip).
	Network bool
	// Allow is the allowlist of a sandbox in allow mode (install_packages
	// uses pip when it includes the package index).
	Allow []string
	// Limits of the run; zero values take the agent's defaults.
	MaxSteps  int
	MaxTokens int64
	MaxCost   float64
	Timeout   time.Duration
	// ExecTimeout bounds each execution of the run: the default and the
	// most the model may ask for. If zero, the agent's defaults.
	ExecTimeout time.Duration
	// NoLessons keeps the run from recalling or learning lessons.
	NoLessons bool
	// Confirm and OnEvent are for foreground runs (the CLI).
	Confirm func(ctx context.Context, tool, code string) bool
	OnEvent func(agent.Event)
}

// Service runs and records agent runs.
type Service struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	active map[string]*active
	wg     sync.WaitGroup
	// kept are the sessions ended runs keep for their previews, by run.
	kept map[string]*keptSession
}

// keptSession is an ended run's session, open for its previews until
// its timer closes it.
type keptSession struct {
	sess  Session
	timer *time.Timer
	// placed is the session's id in the cell's sessions table ("": not
	// recorded there).
	placed string
}

// active is a run in progress: its cancel and its live watchers.
type active struct {
	cancel   context.CancelFunc
	mu       sync.Mutex
	watchers map[chan store.Event]struct{}
	done     chan struct{}
}

// New returns a service.
func New(o *Options) *Service {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.MaxArtifactBytes == 0 {
		opts.MaxArtifactBytes = 50 << 20
	}
	if opts.PreviewFor <= 0 {
		opts.PreviewFor = DefaultPreviewFor
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{opts: opts, log: log, active: map[string]*active{}, kept: map[string]*keptSession{}}
}

// ErrNotFound: no such run.
var ErrNotFound = store.ErrNotFound

// ErrNotRunning: the run already ended.
var ErrNotRunning = errors.New("the run is not running")

// prepare validates the request, resolves the model and records the run.
func (s *Service) prepare(ctx context.Context, req *Request) (llm.Provider, *store.Run, error) {
	mode, err := agent.ParseMode(string(req.Mode))
	if err != nil {
		return nil, nil, &agent.ArgumentError{Name: "mode", Err: err}
	}
	req.Mode = mode
	if strings.TrimSpace(req.Task) == "" && mode == agent.ModeRefactor {
		req.Task = agent.RefactorTask // the run's title in lists
	}
	for p := range req.Files {
		if _, err := workspace.Clean(p); err != nil {
			return nil, nil, &agent.ArgumentError{Name: "files", Err: err}
		}
	}
	paths := make([]string, 0, len(req.Files))
	for p := range req.Files {
		paths = append(paths, p)
	}
	entry, err := agent.DebugEntry(mode, paths, req.Entry)
	if err != nil {
		return nil, nil, err // before the run is recorded: a debug run without a program is bad input, not a failed run
	}
	title := req.Task
	if strings.TrimSpace(title) == "" && entry != "" {
		title = "debug " + entry // the run's title in lists; the model is given no made-up task
	}
	p, err := s.opts.Provider(ctx, req.Model)
	if err != nil {
		return nil, nil, err
	}
	run, err := s.opts.Store.CreateRun(ctx, store.Run{Owner: req.Owner, Task: title, Mode: string(mode), Model: p.Info().String(), Status: string(agent.StatusRunning)})
	if err != nil {
		return nil, nil, err
	}
	return p, run, nil
}

// Run runs req in the foreground and returns the recorded run and report.
// Cancelling ctx ends the run cleanly (status cancelled) with its history saved.
func (s *Service) Run(ctx context.Context, req Request) (*store.Run, *agent.Report, error) {
	p, run, err := s.prepare(ctx, &req)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := s.register(run.ID, cancel)
	rep := s.execute(ctx, run.ID, p, req, a)
	final, err := s.opts.Store.GetRun(context.WithoutCancel(ctx), run.ID)
	return final, rep, err
}

// Start starts req in the background and returns the recorded run at once.
func (s *Service) Start(ctx context.Context, req Request) (*store.Run, error) {
	p, run, err := s.prepare(ctx, &req)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	a := s.register(run.ID, cancel)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		s.execute(rctx, run.ID, p, req, a)
	}()
	return run, nil
}

func (s *Service) register(id string, cancel context.CancelFunc) *active {
	a := &active{cancel: cancel, watchers: map[chan store.Event]struct{}{}, done: make(chan struct{})}
	s.mu.Lock()
	s.active[id] = a
	s.mu.Unlock()
	return a
}

// Cancel stops a running run; it ends with status cancelled. On a run
// that ended and keeps previews, it closes them (and their session).
func (s *Service) Cancel(id string) error {
	s.mu.Lock()
	a, ok := s.active[id]
	s.mu.Unlock()
	if !ok && s.release(id) {
		return nil
	}
	if !ok {
		if _, err := s.opts.Store.GetRun(context.Background(), id); err != nil {
			return err
		}
		return ErrNotRunning
	}
	a.cancel()
	return nil
}

// Close cancels every run and waits for them to be recorded, then closes
// the sessions kept for previews.
func (s *Service) Close() {
	s.mu.Lock()
	for _, a := range s.active {
		a.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	ids := make([]string, 0, len(s.kept))
	for id := range s.kept {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.release(id)
	}
}

// keep holds run id's session open for its previews until exp; placed
// is its id in the cell's sessions table, if it was recorded there.
func (s *Service) keep(id string, sess Session, exp time.Time, placed string) {
	k := &keptSession{sess: sess, placed: placed}
	s.mu.Lock()
	s.kept[id] = k
	k.timer = time.AfterFunc(time.Until(exp), func() { s.release(id) })
	s.mu.Unlock()
}

// release closes the session run id kept for its previews, if any.
func (s *Service) release(id string) bool {
	s.mu.Lock()
	k, ok := s.kept[id]
	delete(s.kept, id)
	s.mu.Unlock()
	if !ok {
		return false
	}
	k.timer.Stop()
	if err := k.sess.Close(); err != nil {
		s.log.Warn("close a run's preview session", "run", id, "err", err)
	}
	s.unplace(id, k.placed)
	return true
}

// PreviewsKept reports whether run id's session is kept for its previews.
func (s *Service) PreviewsKept(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.kept[id]
	return ok
}

// portLister is a session whose listening ports can be listed
// (session.Managed).
type portLister interface {
	ID() string
	Ports() ([]int, error)
}

// place records sess, kept for run id's previews, in the cell's sessions
// table on the run's host (as the gateway recorded the run); it returns
// the id recorded ("" without a cell, for a run not started through a
// gateway, or on failure: the previews then open on this host only).
func (s *Service) place(ctx context.Context, id string, sess Session) string {
	sl, ok := sess.(portLister)
	if s.opts.Cell == nil || !ok {
		return ""
	}
	// The gateway records the run once this host has answered its
	// POST: a run quicker than that waits a moment for the record.
	run, err := s.opts.Cell.GetPlacement(ctx, id)
	for wait := time.Now().Add(placementWait); errors.Is(err, store.ErrNotFound) && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
		run, err = s.opts.Cell.GetPlacement(ctx, id)
	}
	if errors.Is(err, store.ErrNotFound) {
		return "" // not started through a gateway
	}
	if err == nil {
		err = s.opts.Cell.PutPlacement(ctx, store.Placement{ID: sl.ID(), Kind: store.KindSession, Owner: PlacementOwner, Host: run.Host, Epoch: run.Epoch})
	}
	if err != nil {
		s.log.Warn("record a run's preview session in the cell: its previews open on this host only", "run", id, "err", err)
		return ""
	}
	return sl.ID()
}

// unplace removes the record place made, if any.
func (s *Service) unplace(id, placed string) {
	if placed == "" {
		return
	}
	if err := s.opts.Cell.DeletePlacement(context.Background(), placed); err != nil {
		s.log.Warn("forget a run's preview session in the cell", "run", id, "err", err)
	}
}

// previews lists the ports sess listens on as previews open until exp.
func (s *Service) previews(sess Session, exp time.Time) []agent.Preview {
	pl, ok := sess.(portLister)
	if s.opts.PreviewURL == nil || !ok {
		return nil
	}
	ports, err := pl.Ports()
	if err != nil {
		s.log.Warn("list a run's ports", "err", err)
		return nil
	}
	var out []agent.Preview
	for _, p := range ports {
		out = append(out, agent.Preview{Port: p, URL: s.opts.PreviewURL(pl.ID(), p, exp), ExpiresAt: exp.UTC()})
	}
	return out
}

// execute runs the agent, recording as it goes. It never returns an error:
// whatever happens ends up in the run's status.
func (s *Service) execute(ctx context.Context, id string, p llm.Provider, req Request, a *active) *agent.Report {
	bg := context.WithoutCancel(ctx) // recording outlives cancellation
	defer func() {
		s.mu.Lock()
		delete(s.active, id)
		s.mu.Unlock()
		a.mu.Lock()
		for w := range a.watchers {
			close(w)
		}
		a.watchers = nil
		a.mu.Unlock()
		close(a.done)
	}()
	rec := &recorder{s: s, id: id, a: a}
	sess, err := s.opts.NewSession(ctx)
	if err != nil {
		rep := &agent.Report{Status: agent.StatusFailed, Error: "start the sandbox: " + err.Error(), Mode: req.Mode, Model: p.Info().String()}
		rec.event(bg, agent.Event{Type: agent.EventFinished, RunID: id, Time: time.Now(), Report: rep})
		s.finish(bg, id, rep, nil)
		return rep
	}
	var keepUntil time.Time // set when the run's previews keep its session
	placed := ""            // its id in the cell's sessions table, once recorded
	defer func() {
		if keepUntil.IsZero() {
			sess.Close()
			s.unplace(id, placed)
		} else {
			s.keep(id, sess, keepUntil, placed)
		}
	}()
	var book agent.Lessons
	if s.opts.Lessons != nil && !req.NoLessons {
		book = lessons.NewRun(&lessons.Options{Store: s.opts.Lessons, Owner: req.Owner, RunID: id, Logger: s.log})
	}
	rep, err := agent.Run(ctx, &agent.Options{
		Lessons: book,
		Task:    req.Task, Mode: req.Mode, Provider: p, Session: sess, Files: req.Files, Entry: req.Entry, Args: req.Args,
		Checks: req.Checks, Network: req.Network, Allow: req.Allow,
		MaxSteps: req.MaxSteps, MaxTokens: req.MaxTokens, MaxCost: req.MaxCost, Timeout: req.Timeout,
		ExecTimeout: req.ExecTimeout, MaxExecTimeout: req.ExecTimeout,
		Confirm: req.Confirm, Logger: s.log,
		Previews: func(context.Context) []agent.Preview {
			exp := time.Now().Add(s.opts.PreviewFor).Truncate(time.Second)
			ps := s.previews(sess, exp)
			if len(ps) > 0 {
				keepUntil = exp
				if placed == "" {
					// Before the report naming the URLs is recorded.
					placed = s.place(bg, id, sess)
				}
			}
			return ps
		},
		OnEvent: func(e agent.Event) {
			e.RunID = id
			rec.event(bg, e)
			if req.OnEvent != nil {
				req.OnEvent(e)
			}
		},
	})

	if err != nil {
		rep = &agent.Report{Status: agent.StatusFailed, Error: err.Error(), Mode: req.Mode, Model: p.Info().String()}
		rec.event(bg, agent.Event{Type: agent.EventFinished, RunID: id, Time: time.Now(), Report: rep})
	}
	s.finish(bg, id, rep, sess)
	return rep
}

// finish stores the report and the final files.
func (s *Service) finish(ctx context.Context, id string, rep *agent.Report, sess Session) {
	if sess != nil {
		if files, err := s.collect(sess); err != nil {
			s.log.Warn("collect artifacts", "run", id, "err", err)
		} else if err := s.opts.Store.PutArtifacts(ctx, id, files); err != nil {
			s.log.Warn("store artifacts", "run", id, "err", err)
		}
	}
	report, _ := json.Marshal(rep)
	_, err := s.opts.Store.UpdateRun(ctx, id, func(r *store.Run) error {
		r.Status, r.Steps, r.Summary, r.Error, r.Report = string(rep.Status), rep.Steps, rep.Summary, rep.Error, report
		return nil
	})
	if err != nil {
		s.log.Error("record run end", "run", id, "err", err)
	}
}

// collect reads the workspace's final files, within the artifact cap.
func (s *Service) collect(sess Session) ([]store.Artifact, error) {
	ws, err := workspace.Open(sess.Workspace(), &workspace.Options{})
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	var out []store.Artifact
	var total int64
	skip := func(e workspace.Entry) bool { return e.Name == "__pycache__" || e.Name == ".pytest_cache" }
	err = ws.Walk(".", skip, func(e workspace.Entry) error {
		if total+e.Size > s.opts.MaxArtifactBytes {
			s.log.Warn("artifact cap reached; file left out", "path", e.Path)
			return nil
		}
		f, _, err := ws.Open(e.Path)
		if err != nil {
			return nil // replaced by something else meanwhile
		}
		b, err := io.ReadAll(io.LimitReader(f, s.opts.MaxArtifactBytes-total))
		f.Close()
		if err != nil {
			return nil
		}
		total += int64(len(b))
		mode := fs.FileMode(0o644)
		if len(e.Mode) == 10 && e.Mode[3] == 'x' {
			mode = 0o755
		}
		out = append(out, store.Artifact{Path: e.Path, Size: int64(len(b)), Data: b, Mode: mode})
		return nil
	})
	return out, err
}

// recorder writes a run's events and steps to the store and to watchers.
type recorder struct {
	s  *Service
	id string
	a  *active
	// calls are the arguments of tool calls whose result has not come yet: a
	// stored tool step holds its call and its result.
	mu    sync.Mutex
	calls map[string]string
}

func (r *recorder) event(ctx context.Context, e agent.Event) {
	data, err := json.Marshal(e)
	if err != nil {
		return
	}
	stored, err := r.s.opts.Store.AppendEvent(ctx, r.id, e.Type, data)
	if err != nil {
		r.s.log.Warn("record event", "run", r.id, "err", err)
		return
	}
	switch e.Type {
	case agent.EventToolCall:
		r.mu.Lock()
		if r.calls == nil {
			r.calls = map[string]string{}
		}
		r.calls[e.ToolCallID] = e.Arguments
		r.mu.Unlock()
	case agent.EventAssistant:
		r.step(ctx, store.Step{Kind: "model", Data: data})
	case agent.EventUsage:
		if e.Usage != nil {
			_, _ = r.s.opts.Store.UpdateRun(ctx, r.id, func(run *store.Run) error {
				run.TokensIn += e.Usage.InputTokens
				run.TokensOut += e.Usage.OutputTokens
				run.CostUSD += e.Usage.Cost
				run.CostUnknown = run.CostUnknown || e.Usage.CostUnknown
				run.Steps = e.Step
				return nil
			})
		}
	case agent.EventToolResult:
		r.mu.Lock()
		e.Arguments = r.calls[e.ToolCallID]
		delete(r.calls, e.ToolCallID)
		r.mu.Unlock()
		if withCall, err := json.Marshal(e); err == nil {
			r.step(ctx, store.Step{Kind: "tool", Name: e.Tool, Data: withCall})
		}
	case agent.EventNotice:
		r.step(ctx, store.Step{Kind: "observation", Name: e.Tool, Data: data})
	case agent.EventReproduced:
		r.step(ctx, store.Step{Kind: "reproduce", Data: data})
	}
	r.a.mu.Lock()
	for w := range r.a.watchers {
		select {
		case w <- *stored:
		default: // a watcher that cannot keep up catches up from the store
		}
	}
	r.a.mu.Unlock()
}

func (r *recorder) step(ctx context.Context, st store.Step) {
	st.RunID = r.id
	if _, err := r.s.opts.Store.AppendStep(ctx, st); err != nil {
		r.s.log.Warn("record step", "run", r.id, "err", err)
	}
}

// Watch sends the run's events with Seq above since: first those already
// recorded, then live ones, until the run ends or ctx is done. The channel
// is closed at the end.
func (s *Service) Watch(ctx context.Context, id string, since int64) (<-chan store.Event, error) {
	if _, err := s.opts.Store.GetRun(ctx, id); err != nil {
		return nil, err
	}
	out := make(chan store.Event, 64)
	live := make(chan store.Event, 1024)
	s.mu.Lock()
	a := s.active[id]
	if a != nil {
		a.mu.Lock()
		if a.watchers != nil {
			a.watchers[live] = struct{}{}
		} else {
			a = nil
		}
		a.mu.Unlock()
	}
	s.mu.Unlock()
	go func() {
		defer close(out)
		if a != nil {
			defer func() {
				a.mu.Lock()
				if a.watchers != nil {
					delete(a.watchers, live)
				}
				a.mu.Unlock()
			}()
		}
		send := func(e store.Event) bool {
			if e.Seq <= since {
				return true
			}
			since = e.Seq
			select {
			case out <- e:
				return true
			case <-ctx.Done():
				return false
			}
		}
		replay := func() bool {
			evs, err := s.opts.Store.ListEvents(ctx, id, since, 0)
			if err != nil {
				return false
			}
			for _, e := range evs {
				if !send(e) {
					return false
				}
			}
			return true
		}
		if !replay() || a == nil {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-live:
				if !ok {
					replay() // whatever was recorded after the last live event
					return
				}
				if e.Seq > since+1 && !replay() { // a gap: dropped live events
					return
				}
				if !send(e) {
					return
				}
			}
		}
	}()
	return out, nil
}

// Running reports whether run id is in progress here.
func (s *Service) Running(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.active[id]
	return ok
}

// DefaultModel resolves the model a run that names none would use.
func (s *Service) DefaultModel(ctx context.Context) (llm.ModelInfo, error) {
	p, err := s.opts.Provider(ctx, "")
	if err != nil {
		return llm.ModelInfo{}, err
	}
	return p.Info(), nil
}
