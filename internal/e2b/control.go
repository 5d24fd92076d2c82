package e2b

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// sandbox is one E2B sandbox: a session and what E2B adds to it.
type sandbox struct {
	id, owner, templateID string
	ms                    *session.Managed
	envdToken             string
	trafficToken          string
	metadata              map[string]string
	envVars               map[string]string
	started               time.Time
	lc                    lifecycle
	ttl                   time.Duration // as created: an auto-resume's time to live

	// transition: one pause or resume at a time (pause.go).
	transition sync.Mutex
	pausing    atomic.Bool  // a timeout's pause is under way
	network    networkState // under mu (network.go)
	networkSet bool         // under mu: changed since create (state.go)
	// persist writes the sandbox's record (state.go); nil: none kept.
	persist func()

	mu       sync.Mutex
	endAt    time.Time
	procs    map[uint32]*process
	nextPID  uint32
	contexts map[string]*codeContext
	watches  map[string]*watch // watch.go
	done     bool
	paused   bool
	// coldResume: paused with memory: false; the next resume restarts
	// the kernels and ends the commands.
	coldResume bool
	// lossSaid: the restore of a lost sandbox that runCode told of
	// (lossNotice), so that it is told once.
	lossSaid string
	// userSaid: a command was told it runs as the sandbox's user, not
	// the one it asked for (userNotice).
	userSaid bool
}

func (sb *sandbox) deadline() time.Time {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.endAt
}

func tokenOK(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (sb *sandbox) envdTokenOK(r *http.Request) bool {
	return tokenOK(r.Header.Get("X-Access-Token"), sb.envdToken)
}

// trafficTokenOK: /execute carries both tokens, /contexts only the traffic one.
func (sb *sandbox) trafficTokenOK(r *http.Request) bool {
	return tokenOK(r.Header.Get("E2B-Traffic-Access-Token"), sb.trafficToken) || sb.envdTokenOK(r)
}

// shutdownWait bounds how long killing a sandbox waits for its commands and
// extra kernels to be gone: what takes longer (a client's stream that will
// not drain) is left to end in the background, never holding up a delete,
// the reaper or the server's shutdown.
const shutdownWait = 2 * time.Second

// shutdown kills the sandbox's commands and extra kernels, waiting for them
// at most shutdownWait.
func (sb *sandbox) shutdown() {
	sb.mu.Lock()
	sb.done = true
	procs, ctxs := sb.procs, sb.contexts
	sb.procs, sb.contexts = map[uint32]*process{}, map[string]*codeContext{}
	sb.mu.Unlock()
	sb.closeWatches()
	var wg sync.WaitGroup
	for _, p := range procs {
		p.kill()
		wg.Go(func() { <-p.ended })
	}
	for _, c := range ctxs {
		if c.own {
			wg.Go(func() { c.s.Close() })
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownWait):
	}
}

func (h *Handler) controlRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, rt := range []struct {
		pattern string
		fn      func(http.ResponseWriter, *http.Request, string)
	}{
		{"POST /sandboxes", h.create},
		{"POST /v2/sandboxes", h.create},
		{"GET /sandboxes", h.list},
		{"GET /v2/sandboxes", h.list},
		{"GET /sandboxes/{id}", h.info},
		{"DELETE /sandboxes/{id}", h.delete},
		{"POST /sandboxes/{id}/connect", h.connect},
		{"POST /v2/sandboxes/{id}/connect", h.connect},
		// Deprecated by E2B (no SDK of 2.45 or later calls it): as connect.
		{"POST /sandboxes/{id}/resume", h.connect},
		{"POST /sandboxes/{id}/pause", h.pauseHandler},
		{"POST /sandboxes/{id}/timeout", h.setTimeout},
		{"GET /sandboxes/{id}/metrics", h.metrics},
		{"PUT /sandboxes/{id}/network", h.updateNetwork},
		{"POST /sandboxes/{id}/fork", h.fork},
		{"POST /sandboxes/{id}/snapshots", h.createSnapshot},
		{"GET /snapshots", h.listSnapshots},
		{"DELETE /templates/{id}", h.deleteSnapshot}, // Sandbox.deleteSnapshot
	} {
		mux.HandleFunc(rt.pattern, h.requireKey(rt.fn))
	}
	h.templateRoutes(mux)
	// Calls of E2B's API that sandloop does not do (yet) say so, rather
	// than a 404 the SDKs would read as "sandbox not found".
	for _, u := range []struct{ pattern, why string }{
		{"GET /sandboxes/metrics", "metrics of many sandboxes at once are not implemented (each sandbox's: GET /sandboxes/{id}/metrics)"},
		{"/snapshots/", "snapshots are listed at GET /snapshots"},
		{"/volumes", noVolumes},
		{"/volumes/", noVolumes},
		{"/volumecontent/", noVolumes},
		{"/secrets", noSecrets},
		{"/secrets/", noSecrets},
	} {
		mux.HandleFunc(u.pattern, h.requireKey(func(w http.ResponseWriter, r *http.Request, _ string) {
			writeControlError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not supported by sandloop: %s", r.Method, r.URL.Path, u.why))
		}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s: this server implements E2B's sandbox create, connect, get, list, kill, timeout, pause, fork, snapshots, metrics and network", r.Method, r.URL.Path))
	})
	return mux
}

// requireKey checks X-API-KEY and passes on the key's owner.
func (h *Handler) requireKey(fn func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-KEY")
		for k, owner := range h.opts.Keys {
			if tokenOK(key, k) {
				fn(w, r, owner)
				return
			}
		}
		writeControlError(w, http.StatusUnauthorized, "missing or invalid API key: set E2B_API_KEY to the key `sandloop serve` printed")
	}
}

// writeControlError writes the control plane's error shape; the SDKs look
// at code 404 to raise SandboxNotFoundError.
func writeControlError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// What E2B has and sandloop does not: the SDKs' calls for them are
// refused, saying so.
const (
	noVolumes = "volumes are not implemented: a sandbox's files stay in its /home/user (kept by pause, forks and snapshots); upload what it needs with files.write"
	noSecrets = "secrets are not implemented: give a sandbox its values with envs, at create or per command"
)

// unsupported says which part of a create this server does not have
// ("" if none is asked for): refused, never ignored (a sandbox without
// the volume it was asked to mount would lose what is written there).
func (req *createRequest) unsupported() string {
	given := func(raw json.RawMessage) bool {
		v := strings.TrimSpace(string(raw))
		return v != "" && v != "null" && v != "[]" && v != "{}"
	}
	switch {
	case given(req.VolumeMounts):
		return "volumeMounts: " + noVolumes
	case given(req.MCP):
		return "mcp: E2B's MCP gateway does not run in sandloop's sandboxes; sandloop serves its own MCP tools (execute_python, run_shell, files) at /mcp"
	case given(req.IAM):
		return "iam: sandloop issues no workload identity tokens to sandboxes"
	}
	return ""
}

type createRequest struct {
	TemplateID string            `json:"templateID"`
	Timeout    *float64          `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	// lifecycle: {onTimeout, autoResume} as the SDK sends it.
	AutoPause       bool  `json:"autoPause"`
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	networkRequest // network, allow_internet_access (network.go)
	// Not implemented: refused (unsupported).
	VolumeMounts json.RawMessage `json:"volumeMounts"`
	MCP          json.RawMessage `json:"mcp"`
	IAM          json.RawMessage `json:"iam"`
}

// created is the answer to create and connect.
type created struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

const clientID = "sandloop"

// created answers create and connect for a request r. Its domain is the
// server's own address, so the SDK's getHost(port) is
// PORT-ID.localhost:N, which this server routes to the sandbox's port.
func (sb *sandbox) created(r *http.Request) created {
	c := created{TemplateID: sb.templateID, SandboxID: sb.id, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: sb.envdToken, TrafficAccessToken: sb.trafficToken}
	if d := domainOf(r); d != "" {
		c.Domain = &d
	}
	return c
}

// readJSON decodes an optional JSON body (the SDKs send it chunked, so
// Content-Length says nothing).
func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	return nil
}

// ttl reads a timeout in seconds.
func (h *Handler) ttl(t *float64) (time.Duration, error) {
	if t == nil {
		return h.opts.DefaultTimeout, nil
	}
	if math.IsNaN(*t) || *t < 0 || *t > h.opts.MaxTimeout.Seconds() {
		return 0, fmt.Errorf("timeout must be between 0 and %d seconds", int(h.opts.MaxTimeout.Seconds()))
	}
	return time.Duration(*t * float64(time.Second)), nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, owner string) {
	var req createRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	ttl, err := h.ttl(req.Timeout)
	if err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeControlError(w, http.StatusBadRequest, fmt.Sprintf("envVars: %q is not a valid variable name", k))
			return
		}
	}
	if msg := req.unsupported(); msg != "" {
		writeControlError(w, http.StatusBadRequest, msg)
		return
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	lc := lifecycle{autoPause: req.AutoPause, pauseMemory: req.AutoPauseMemory == nil || *req.AutoPauseMemory,
		autoResume: req.AutoResume != nil && req.AutoResume.Enabled}
	if lc.autoResume && !lc.autoPause {
		writeControlError(w, http.StatusBadRequest, "autoResume needs onTimeout 'pause' (autoPause): a sandbox killed at its timeout cannot be resumed")
		return
	}
	egressPolicy, network, err := h.createEgress(req.networkRequest)
	if err != nil {
		writeNetworkError(w, err)
		return
	}
	var tmpl, snap string
	if isSnapshotID(req.TemplateID) {
		// Sandbox.create(snapshotId): a sandbox from one of the caller's snapshots.
		snap = req.TemplateID
	} else if tmpl, err = h.sessionTemplate(req.TemplateID); err != nil {
		writeControlError(w, http.StatusNotFound, err.Error())
		return
	}
	// E2B's sandboxes take traffic to their ports from anyone unless
	// created with allowPublicTraffic: false; then the traffic token is
	// needed (e2b-traffic-access-token), as E2B's own proxy does.
	trafficToken := randomHex(16)
	access := session.PortAccess{Public: true, Token: trafficToken}
	if n := req.Network; n != nil {
		access.Public = n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
		access.HostMask, access.TLSPorts = n.MaskRequestHost, n.HTTPSPorts
	}
	ms, err := h.opts.Manager.Create(r.Context(), session.CreateOptions{Owner: owner, Env: req.EnvVars, Egress: egressPolicy,
		PortAccess: access, Template: tmpl, Snapshot: snap, Commands: !h.opts.ColdCommands})
	if err != nil {
		if snap != "" && !errors.Is(err, session.ErrCapacity) {
			writeSnapshotError(w, err)
			return
		}
		h.writeCreateError(w, err)
		return
	}
	sb, err := h.register(&sandbox{owner: owner, templateID: req.TemplateID, ms: ms, trafficToken: trafficToken,
		metadata: req.Metadata, envVars: req.EnvVars, lc: lc, ttl: ttl, network: network})
	if err != nil {
		writeControlError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	h.prepareFirstCommand(sb) // in the background: the first command comes next
	h.log.Info("e2b: sandbox created", "sandbox", sb.id, "template", sb.templateID, "ttl", ttl)
	writeJSON(w, http.StatusCreated, sb.created(r))
}

// errShuttingDown refuses new sandboxes once the handler is closed.
var errShuttingDown = errors.New("the server is shutting down")

// register makes sb (its owner, template, session, metadata, variables,
// lifecycle and time to live set) a sandbox of the handler, with new
// tokens, its time to live from now. A closed handler deletes the session.
func (h *Handler) register(sb *sandbox) (*sandbox, error) {
	// The sandbox's time to live governs it, not the manager's idle timer.
	sb.ms.Pin()
	now := time.Now()
	sb.id = sb.ms.ID()
	sb.envdToken = randomHex(16)
	if sb.trafficToken == "" {
		sb.trafficToken = randomHex(16)
	}
	if sb.ms.PortAccess.Token == "" {
		// A fork's child: its ports take the traffic token made here (no
		// one knows the new session's id yet).
		sb.ms.PortAccess.Token = sb.trafficToken
	}
	sb.started, sb.endAt = now, now.Add(sb.ttl)
	sb.procs, sb.contexts = map[uint32]*process{}, map[string]*codeContext{}
	sb.contexts[defaultContextID] = &codeContext{id: defaultContextID, cwd: homeDir, s: sb.ms.Session}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		h.opts.Manager.Delete(sb.owner, sb.ms.ID())
		return nil, errShuttingDown
	}
	h.sandboxes[sb.id] = sb
	sb.persist = h.persistFunc(sb)
	sb.saved()
	return sb, nil
}

func (h *Handler) writeCreateError(w http.ResponseWriter, err error) {
	var le *session.LimitError
	switch {
	case errors.Is(err, session.ErrCapacity):
		// 429 with Retry-After is retried by the SDKs' control-plane client.
		w.Header().Set("Retry-After", "1")
		writeControlError(w, http.StatusTooManyRequests, "the server holds as many sandboxes as it may: kill one or retry later")
	case errors.As(err, &le):
		writeControlError(w, http.StatusBadRequest, err.Error())
	default:
		h.log.Error("e2b: create sandbox", "err", err)
		writeControlError(w, http.StatusInternalServerError, "could not start the sandbox: "+err.Error())
	}
}

// owned returns owner's running sandbox id, or writes a 404.
func (h *Handler) owned(w http.ResponseWriter, owner, id string) *sandbox {
	sb := h.lookup(id)
	if sb == nil || sb.owner != owner {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		return nil
	}
	return sb
}

type infoJSON struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	Lifecycle   lifecycleJSON     `json:"lifecycle"`
	// What the sandbox may reach (network.go).
	Network             *networkJSON `json:"network"`
	AllowInternetAccess bool         `json:"allowInternetAccess"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"` // "pause" or "kill"
	AutoResume bool   `json:"autoResume"`
}

func (h *Handler) infoOf(sb *sandbox) infoJSON {
	md := sb.metadata
	if md == nil {
		md = map[string]string{}
	}
	state, onTimeout := "running", "kill"
	if sb.isPaused() {
		state = "paused"
	}
	if sb.lc.autoPause {
		onTimeout = "pause"
	}
	network, access := sb.networkInfo()
	return infoJSON{
		Network: network, AllowInternetAccess: access,
		TemplateID: sb.templateID, SandboxID: sb.id, ClientID: clientID,
		StartedAt: sb.started.UTC(), EndAt: sb.deadline().UTC(),
		CPUCount: max(1, int(math.Ceil(sb.ms.Limits.CPUs))), MemoryMB: sb.ms.Limits.Memory >> 20,
		DiskSizeMB: h.opts.MaxWorkspaceBytes >> 20, State: state, EnvdVersion: EnvdVersion, Metadata: md,
		Lifecycle: lifecycleJSON{OnTimeout: onTimeout, AutoResume: sb.lc.autoResume},
	}
}

func (h *Handler) info(w http.ResponseWriter, r *http.Request, owner string) {
	if sb := h.owned(w, owner, r.PathValue("id")); sb != nil {
		writeJSON(w, http.StatusOK, h.infoOf(sb))
	}
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request, owner string) {
	if sb := h.owned(w, owner, r.PathValue("id")); sb != nil {
		h.kill(sb, "deleted")
		w.WriteHeader(http.StatusNoContent)
	}
}

type timeoutRequest struct {
	Timeout *float64 `json:"timeout"`
	// Memory false (connect's onResume: 'reboot') resumes a paused
	// sandbox with its files and fresh kernels.
	Memory *bool `json:"memory"`
}

// setDeadline sets a sandbox's time to live from now (shorter or longer).
func (sb *sandbox) setDeadline(t time.Time) {
	sb.mu.Lock()
	sb.endAt = t
	sb.mu.Unlock()
	sb.saved()
}

func (h *Handler) connect(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	sb := h.owned(w, owner, r.PathValue("id"))
	if sb == nil {
		return
	}
	ttl, err := h.ttl(req.Timeout)
	if err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	// A paused sandbox is resumed, with its time to live from now (201).
	if req.Memory != nil && !*req.Memory {
		sb.rebootOnResume()
	}
	resumed, err := sb.resume(r.Context(), ttl)
	if err != nil {
		h.log.Error("e2b: resume", "sandbox", sb.id, "err", err)
		writeControlError(w, http.StatusInternalServerError, "could not resume the sandbox: "+err.Error())
		return
	}
	if resumed {
		h.log.Info("e2b: sandbox resumed", "sandbox", sb.id)
		writeJSON(w, http.StatusCreated, sb.created(r))
		return
	}
	// Connecting to a running one never shortens its life.
	if req.Timeout != nil {
		if t := time.Now().Add(ttl); t.After(sb.deadline()) {
			sb.setDeadline(t)
		}
	}
	writeJSON(w, http.StatusOK, sb.created(r))
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Timeout == nil {
		writeControlError(w, http.StatusBadRequest, `field "timeout" (seconds) is required`)
		return
	}
	ttl, err := h.ttl(req.Timeout)
	if err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if sb := h.owned(w, owner, r.PathValue("id")); sb != nil {
		sb.setDeadline(time.Now().Add(ttl))
		w.WriteHeader(http.StatusNoContent)
	}
}

// parseMetadata reads list's metadata filter: k=v&k2=v2 with each key and
// value percent-encoded by the SDK before the whole was query-encoded.
func parseMetadata(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	q, err := url.ParseQuery(s)
	if err != nil {
		return nil, fmt.Errorf("metadata filter %q: %v (send k=v&k2=v2)", s, err)
	}
	out := map[string]string{}
	for k, vs := range q {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("metadata filter %q: %v", s, err)
		}
		out[key] = val
	}
	return out, nil
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	filter, err := parseMetadata(q.Get("metadata"))
	if err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Without a state, both (the SDK's list promises paused ones too).
	wanted := map[string]bool{"running": true, "paused": true}
	if states := q["state"]; len(states) > 0 {
		wanted = map[string]bool{}
		for _, s := range states {
			for _, st := range strings.Split(s, ",") {
				wanted[st] = true
			}
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			writeControlError(w, http.StatusBadRequest, "limit must be a positive integer")
			return
		}
		limit = n
	}
	var mine []*sandbox
	h.mu.Lock()
	for _, sb := range h.sandboxes {
		state := "running"
		if sb.isPaused() {
			state = "paused"
		}
		if sb.owner == owner && wanted[state] && matches(sb.metadata, filter) {
			mine = append(mine, sb)
		}
	}
	h.mu.Unlock()
	sort.Slice(mine, func(i, j int) bool {
		if !mine[i].started.Equal(mine[j].started) {
			return mine[i].started.Before(mine[j].started)
		}
		return mine[i].id < mine[j].id
	})
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		start = -1
		for i, sb := range mine {
			if sb.id == tok {
				start = i
			}
		}
		if start < 0 {
			writeControlError(w, http.StatusBadRequest, "nextToken is unknown or its sandbox is gone: list again from the start")
			return
		}
	}
	page := mine[start:]
	if len(page) > limit {
		w.Header().Set("X-Next-Token", page[limit].id)
		page = page[:limit]
	}
	out := make([]infoJSON, 0, len(page))
	for _, sb := range page {
		out = append(out, h.infoOf(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

func matches(md, filter map[string]string) bool {
	for k, v := range filter {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}
