// Package e2b serves E2B's wire protocol over sandloop's sessions, so that
// E2B's own SDKs (npm e2b and @e2b/code-interpreter, and the Python ones)
// run unchanged against a local sandloop: the control plane (create,
// connect, list, kill, timeouts, pause and resume: pause.go), envd (files over REST, the
// filesystem.Filesystem and process.Process Connect RPCs) and the code
// interpreter (/execute, /contexts).
//
// Every request comes to one origin. A request that carries E2b-Sandbox-Id
// is for that sandbox: E2b-Sandbox-Port 49999 is the code interpreter,
// anything else envd. Without the header it is the control plane,
// authenticated by X-API-KEY. The data plane carries no API key: each
// sandbox gets two random access tokens at creation, which the SDKs send
// back (X-Access-Token to envd and /execute, E2B-Traffic-Access-Token to
// the code interpreter), so knowing a sandbox's id is not enough to use it.
//
// A sandbox is one sandloop session (its id is the session's id, so it is
// also visible under /v1/sessions for the same token): its kernel is the
// default code context, extra contexts are kernels of their own on the
// same workspace, and each command runs inside the kernel's jail
// (session.Session.StartCommand), in a join of that jail made ahead when
// the sandbox was created (where sandboxes have run commands in the last
// few minutes: session.Manager.CommandsRecent; a join costs ~2 ms of CPU
// and ~100 KiB, ~25 ms and ~4 MiB without the join program, of no use to a
// sandbox that only runs code) or when its
// last command ended (ColdCommands: never), so that a first command costs about the exec of its program (E2B's SDK
// runs `/bin/bash -l -c CMD`; BenchmarkE2BFirstCommand of cmd/sandloop
// prints where its time goes). Any templateID is accepted and
// gives the default session. The workspace, /workspace, is the home and
// working directory of kernels and commands, and the root of the files
// API: absolute paths elsewhere are refused there.
package e2b

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
)

// EnvdVersion is the envd version announced to the SDKs: they pick
// protocol features by it (0.5.7: chunked octet-stream uploads).
const EnvdVersion = "0.5.7"

// Ports the SDKs put in E2b-Sandbox-Port.
const (
	portInterpreter = "49999"
	portEnvd        = "49983"
)

// Options configure a Handler.
type Options struct {
	// Manager holds the sessions behind the sandboxes. Required.
	Manager *session.Manager
	// Keys maps each accepted API key to the owner of the sandboxes
	// created with it (the owner sandloop's own API uses for the same
	// caller). Required: a server without keys would let anyone who can
	// reach it run code.
	Keys map[string]string
	// Zygote, if set, forks the kernels of extra code contexts.
	Zygote session.Zygote
	// HasTemplate, if set, reports a template of that name (package
	// template): create's templateID then picks it, and an unknown name
	// other than E2B's own is answered 404.
	HasTemplate func(name string) bool
	// BuildTemplate, if set, builds a template (package template) for
	// E2B's template API (Template.build; templatebuild.go): the builds
	// sandloop can express, pip packages and environment variables. If
	// nil, POST /v3/templates answers 501.
	BuildTemplate func(ctx context.Context, name string, spec template.Spec) (*template.Template, error)
	// DefaultTimeout is a sandbox's time to live when create names none.
	// If zero, 300 seconds (E2B's default).
	DefaultTimeout time.Duration
	// MaxTimeout bounds the time to live a client may ask for. If zero, 24 hours.
	MaxTimeout time.Duration
	// ReapInterval is how often expired sandboxes are looked for. If zero,
	// 250ms (a look is a walk over a map; a sandbox ends at most this late).
	ReapInterval time.Duration
	// MaxFileBytes caps one uploaded file; MaxWorkspaceBytes a workspace.
	// If zero, 100 MiB and 1 GiB.
	MaxFileBytes, MaxWorkspaceBytes int64
	// MaxContexts caps a sandbox's code contexts besides its default one,
	// and MaxProcesses its running commands: each is a jail with the
	// sandbox's limits, which the manager's session cap does not count.
	// If zero, 8 and 32.
	MaxContexts, MaxProcesses int
	// Network is what sandboxes may reach and how much (network.go). The
	// zero value: nothing until a sandbox's network says so, host names
	// only, default caps.
	Network NetworkOptions
	// Keepalive is the interval of keepalive lines in /execute. If zero, 5 seconds.
	Keepalive time.Duration
	// StateDir, if set, keeps each sandbox's record there (state.go), and
	// New adopts the recorded sandboxes whose sessions the Manager holds
	// (re-attached from the keeper after a restart: serve
	// --keep-sessions). Detach leaves them there for the next server.
	// If empty, sandboxes end with the handler.
	StateDir string
	// ColdCommands: no command's join of its sandbox's jail is made
	// ahead (session.Session.PrepareCommand; by default one is made when a
	// sandbox is created and after each command ends, so that a command
	// costs about the exec of its program). For benchmarks' baselines.
	ColdCommands bool
	// CommandTrace, if set, receives the stages of every command started
	// by process.Start, one JSON object a line (commandTrace), for
	// benchmarks (cmd/sandloop's BenchmarkE2BFirstCommand). Writes are
	// serialized.
	CommandTrace io.Writer
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Handler serves the E2B protocol. Close it to stop its reaper and kill
// its sandboxes.
type Handler struct {
	opts    Options
	log     *slog.Logger
	control *http.ServeMux
	envd    *http.ServeMux
	interp  *http.ServeMux

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	builds    map[string]*templateBuild // E2B template builds, by build id
	closed    bool

	stop     chan struct{}
	wg       sync.WaitGroup // the reaper, and its sampling
	killing  sync.WaitGroup // sandboxes being killed
	sampling atomic.Bool    // a sampleAll is under way

	traceMu sync.Mutex // Options.CommandTrace's writes
}

// prepareCommand has sb's next command's join made ahead, unless
// Options.ColdCommands.
func (h *Handler) prepareCommand(sb *sandbox) {
	if !h.opts.ColdCommands {
		sb.ms.PrepareCommand()
	}
}

// prepareFirstCommand has a new sandbox's first command's join made
// ahead, as prepareCommand, where sandboxes of this server have run
// commands lately (session.Manager.CommandsRecent): a sandbox that only
// runs code (the code interpreter's runCode) would pay its CPU and memory
// for nothing.
func (h *Handler) prepareFirstCommand(sb *sandbox) {
	if h.opts.Manager.CommandsRecent() {
		h.prepareCommand(sb)
	}
}

// New returns a Handler and starts its reaper.
func New(o *Options) (*Handler, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.Manager == nil {
		return nil, errors.New("e2b: a session manager is required")
	}
	if len(opts.Keys) == 0 {
		return nil, errors.New("e2b: at least one API key is required")
	}
	if opts.DefaultTimeout == 0 {
		opts.DefaultTimeout = 300 * time.Second
	}
	if opts.MaxTimeout == 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	if opts.ReapInterval == 0 {
		opts.ReapInterval = 250 * time.Millisecond
	}
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = 100 << 20
	}
	if opts.MaxWorkspaceBytes == 0 {
		opts.MaxWorkspaceBytes = 1 << 30
	}
	if opts.Keepalive == 0 {
		opts.Keepalive = 5 * time.Second
	}
	if opts.MaxContexts == 0 {
		opts.MaxContexts = 8
	}
	if opts.MaxProcesses == 0 {
		opts.MaxProcesses = 32
	}
	h := &Handler{opts: opts, log: opts.Logger, sandboxes: map[string]*sandbox{}, stop: make(chan struct{})}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.control = h.controlRoutes()
	h.envd = h.envdRoutes()
	h.interp = h.interpreterRoutes()
	if opts.StateDir != "" {
		n, err := h.adopt()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			h.log.Info("e2b: sandboxes adopted after a restart", "sandboxes", n)
		}
	}
	h.wg.Add(1)
	go h.reapLoop()
	return h, nil
}

// Mounts returns the patterns to mount the handler at (beside sandloop's
// own routes, which they do not overlap), each mapped to the handler.
func (h *Handler) Mounts() map[string]http.Handler {
	m := map[string]http.Handler{}
	for _, p := range []string{
		"/sandboxes", "/sandboxes/", "/v2/sandboxes", "/v2/sandboxes/", "/snapshots", "/snapshots/", "/templates/",
		"/health", "/files", "/filesystem.Filesystem/", "/process.Process/",
		"/execute", "/contexts", "/contexts/",
		"/v3/templates", "/v2/templates/",
		// Not implemented; mounted so that the SDKs hear so (control.go).
		"/volumes", "/volumes/", "/volumecontent/", "/secrets", "/secrets/",
	} {
		m[p] = h
	}
	return m
}

// ServeHTTP routes a request to the control plane, envd or the code
// interpreter, by its E2b-Sandbox-Id and E2b-Sandbox-Port headers.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" && r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		// downloadUrl()/uploadUrl(): the URL names no sandbox, its
		// signature does (only that sandbox's envd token makes it).
		sb := h.signer(r)
		if sb == nil {
			writeControlError(w, http.StatusUnauthorized, "the URL's signature is wrong or expired, or its sandbox is gone")
			return
		}
		if h.pausedGate(w, r, sb) {
			h.envd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
		}
		return
	}
	if id == "" {
		h.control.ServeHTTP(w, r)
		return
	}
	sb := h.lookup(id)
	if sb == nil {
		// The SDKs read 502 as "the sandbox is gone" (isRunning() false,
		// TimeoutError); a 404 would look like a missing file.
		http.Error(w, "sandbox "+id+" is not running", http.StatusBadGateway)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb))
	if port := r.Header.Get("E2b-Sandbox-Port"); port != "" && port != portInterpreter && port != portEnvd {
		h.servePort(w, r, sb, port)
		return
	}
	if r.Header.Get("E2b-Sandbox-Port") == portInterpreter {
		if !sb.trafficTokenOK(r) {
			writeControlError(w, http.StatusUnauthorized, "missing or wrong E2B-Traffic-Access-Token for sandbox "+id)
			return
		}
		if h.pausedGate(w, r, sb) {
			h.interp.ServeHTTP(w, r)
		}
		return
	}
	if !sb.envdTokenOK(r) && !(r.URL.Path == "/files" && sb.signed(r)) {
		writeControlError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token for sandbox "+id)
		return
	}
	if h.pausedGate(w, r, sb) {
		h.envd.ServeHTTP(w, r)
	}
}

type sandboxKey struct{}

// sandboxOf is the sandbox a data-plane request is for.
func sandboxOf(ctx context.Context) *sandbox {
	sb, _ := ctx.Value(sandboxKey{}).(*sandbox)
	return sb
}

// lookup returns the running sandbox id, or nil. A sandbox whose session
// was closed behind our back (deleted through /v1, or past the server's
// maximum lifetime) is cleaned up here.
func (h *Handler) lookup(id string) *sandbox {
	h.mu.Lock()
	sb := h.sandboxes[id]
	h.mu.Unlock()
	if sb == nil {
		return nil
	}
	if errors.Is(sb.ms.Err(), session.ErrClosed) {
		h.kill(sb, "its session was closed")
		return nil
	}
	return sb
}

// kill ends a sandbox: its commands, extra kernels and session.
func (h *Handler) kill(sb *sandbox, reason string) {
	h.mu.Lock()
	if h.sandboxes[sb.id] != sb {
		h.mu.Unlock()
		return
	}
	delete(h.sandboxes, sb.id)
	h.mu.Unlock()
	h.forget(sb.id)
	sb.shutdown()
	why := "deleted"
	switch reason {
	case "timeout":
		why = "its E2B timeout ended (the create's timeout, or Sandbox.setTimeout)"
	case "shutdown":
		why = "shutdown"
	}
	if err := h.opts.Manager.DeleteFor(sb.owner, sb.id, why); err != nil && !errors.Is(err, session.ErrNotFound) {
		h.log.Warn("e2b: close session", "sandbox", sb.id, "err", err)
	}
	h.log.Info("e2b: sandbox killed", "sandbox", sb.id, "reason", reason)
}

func (h *Handler) reapLoop() {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.reap(now)
			if h.sampling.CompareAndSwap(false, true) {
				// Off the reaper's loop: a slow measurement never delays a kill.
				h.wg.Go(func() {
					defer h.sampling.Store(false)
					h.sampleAll(now)
				})
			}
		}
	}
}

// sampleAll keeps every running sandbox's session sampler going (one
// sample a second, session/usage.go), so that getMetrics has a history
// though nobody asked yet: E2B samples every sandbox.
func (h *Handler) sampleAll(now time.Time) {
	h.mu.Lock()
	all := make([]*sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		all = append(all, sb)
	}
	h.mu.Unlock()
	for _, sb := range all {
		sb.mu.Lock()
		paused, done := sb.paused, sb.done
		sb.mu.Unlock()
		if !paused && !done {
			h.opts.Manager.Sampler(sb.ms)
		}
	}
}

// reap kills the sandboxes whose time to live has passed at now.
func (h *Handler) reap(now time.Time) int {
	var victims, toPause []*sandbox
	h.mu.Lock()
	for _, sb := range h.sandboxes {
		switch {
		case now.Before(sb.deadline()) || sb.isPaused():
			// A paused sandbox's time to live does not run.
		case sb.lc.autoPause:
			toPause = append(toPause, sb)
		default:
			victims = append(victims, sb)
		}
	}
	h.mu.Unlock()
	for _, sb := range toPause {
		h.killing.Go(func() { h.timeoutPause(sb) })
	}
	// Each in the background: the next tick comes on time whatever one
	// kill takes (each is bounded, and kill forgets the sandbox first, so
	// it is never killed twice).
	for _, sb := range victims {
		h.killing.Go(func() { h.kill(sb, "timeout") })
	}
	return len(victims)
}

// stopAll marks the handler closed and stops its reaper, and returns the
// sandboxes it had (forgotten if forget), or false if it was closed before.
func (h *Handler) stopAll(forget bool) ([]*sandbox, bool) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, false
	}
	h.closed = true
	all := make([]*sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		all = append(all, sb)
	}
	if forget {
		h.sandboxes = map[string]*sandbox{}
	}
	h.mu.Unlock()
	close(h.stop)
	h.wg.Wait()
	return all, true
}

// Close stops the reaper and kills every sandbox.
func (h *Handler) Close() error {
	all, ok := h.stopAll(false)
	if !ok {
		return nil
	}
	for _, sb := range all {
		h.killing.Go(func() { h.kill(sb, "shutdown") })
	}
	h.killing.Wait() // each kill is bounded (shutdown, the manager's CloseTimeout)
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewKey returns a fresh API key in the form the SDKs accept (e2b_ and hex).
func NewKey() string { return "e2b_" + randomHex(20) }

// KeyForToken is the API key that stands for a sandloop token: the
// token's bytes in hex after e2b_ (the 2.45 SDKs accept only that form).
func KeyForToken(token string) string { return "e2b_" + hex.EncodeToString([]byte(token)) }
