package server

import (
	"cmp"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

type createRequest struct {
	TimeoutS *float64          `json:"timeout_s"`
	MemoryMB *int64            `json:"memory_mb"`
	CPUs     *float64          `json:"cpus"`
	Pids     *int              `json:"pids"`
	DiskMB   *int64            `json:"disk_mb"`
	MaxFiles *int              `json:"max_files"`
	Env      map[string]string `json:"env"`
	// Network is false/true (none/host, as before) or "none", "allow" or "host".
	Network json.RawMessage `json:"network"`
	Allow   []string        `json:"allow"`
	// Checkpoints is "auto" (one before every execution, for undo) or
	// "off"; if empty, the server's default.
	Checkpoints string `json:"checkpoints"`
	// PublicPorts lets anyone who reaches the server reach the session's
	// ports (no token or signed URL needed).
	PublicPorts bool `json:"public_ports"`
	// Template names the environment the session runs in (GET /v1/templates).
	// Absent or null: the server's default template (serve
	// --default-template), if any; "": the plain environment.
	Template *string `json:"template"`
	// Snapshot, if set, is the id of one of the caller's snapshots the
	// session starts from (its files, then its variables).
	Snapshot string `json:"snapshot"`
}

type sessionJSON struct {
	ID     string `json:"id"`
	Status string `json:"status"` // ready | restart_required
	// Checkpoints is the session's checkpoint mode: auto or off.
	Checkpoints string `json:"checkpoints"`
	// State is running, paused or hibernated (on storage only: the next
	// request restores it).
	State      string    `json:"state"`
	Message    string    `json:"message,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	TimeoutS   float64   `json:"timeout_s"`
	MemoryMB   int64     `json:"memory_mb"`
	CPUs       float64   `json:"cpus"`
	Pids       int       `json:"pids"`
	Network    bool      `json:"network"` // the host's network
	Mode       string    `json:"network_mode"`
	Allow      []string  `json:"allow,omitempty"`
	// HostNote says how the code reaches the host's loopback ports the
	// allowlist lists (at egress.HostName; localhost is the sandbox's own).
	HostNote string `json:"host_note,omitempty"`
	FromPool bool   `json:"from_pool"`
	// PublicPorts: see createRequest.
	PublicPorts bool   `json:"public_ports"`
	Template    string `json:"template,omitempty"`
	// The workspace's quota, and whether the kernel enforces it on every
	// write (where no tmpfs can be made, only uploads are checked).
	DiskMB        int64 `json:"disk_mb"`
	MaxFiles      int   `json:"max_files"`
	QuotaEnforced bool  `json:"quota_enforced"`
	// What the workspace holds (GET /v1/sessions/{id} only).
	DiskUsedBytes *int64 `json:"disk_used_bytes,omitempty"`
	FilesUsed     *int64 `json:"files_used,omitempty"`
	// Restored says what came back at the session's last restore, undo
	// or fork (a fork's child: from its parent).
	Restored *session.Restored `json:"restored,omitempty"`
}

func toSessionJSON(ms *session.Managed) sessionJSON {
	q := ms.Quota()
	j := sessionJSON{
		ID: ms.ID(), Status: "ready", State: ms.State(), Restored: ms.Restored(), Checkpoints: ms.CheckpointMode(), CreatedAt: ms.Created.UTC(), LastUsedAt: ms.LastUsed().UTC(),
		TimeoutS: ms.ExecTimeout.Seconds(), MemoryMB: ms.Limits.Memory >> 20, CPUs: ms.Limits.CPUs,
		Pids: ms.Limits.Pids, Network: ms.Network == jail.NetworkHost, FromPool: ms.FromPool,
		Mode: string(sessionMode(ms)), Allow: ms.Allowlist().Entries(), // in force: PATCH .../network changes it
		DiskMB: q.Disk >> 20, MaxFiles: q.Files, QuotaEnforced: q.Enforced, PublicPorts: ms.PortAccess.Public, Template: ms.Template,
	}
	if ms.Egress != nil {
		j.HostNote = ms.Allowlist().HostNote()
	}
	if err := ms.Err(); err != nil {
		j.Status, j.Message = "restart_required", err.Error()
	}
	return j
}

func positive(name string, v float64, max float64) error {
	if math.IsNaN(v) || v <= 0 || v > max {
		return badRequest("%s must be a number above 0 and at most %g", name, max)
	}
	return nil
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeError(w, errDraining)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req createRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	opts := session.CreateOptions{Owner: owner(r.Context()), Env: req.Env, PortAccess: session.PortAccess{Public: req.PublicPorts}, Snapshot: req.Snapshot}
	if req.Template != nil {
		opts.Template = cmp.Or(*req.Template, session.NoTemplate)
	}
	if req.TimeoutS != nil {
		if err := positive("timeout_s", *req.TimeoutS, 24*3600); err != nil {
			writeError(w, err)
			return
		}
		opts.ExecTimeout = time.Duration(*req.TimeoutS * float64(time.Second))
	}
	if req.MemoryMB != nil {
		if *req.MemoryMB < 16 {
			writeError(w, badRequest("memory_mb must be at least 16"))
			return
		}
		opts.Limits.Memory = *req.MemoryMB << 20
	}
	if req.CPUs != nil {
		if err := positive("cpus", *req.CPUs, 1024); err != nil {
			writeError(w, err)
			return
		}
		opts.Limits.CPUs = *req.CPUs
	}
	if req.Pids != nil {
		if *req.Pids < 8 {
			writeError(w, badRequest("pids must be at least 8"))
			return
		}
		opts.Limits.Pids = *req.Pids
	}
	if req.DiskMB != nil {
		if *req.DiskMB < 1 || *req.DiskMB > 1<<30 {
			writeError(w, badRequest("disk_mb must be at least 1"))
			return
		}
		opts.Limits.Disk = *req.DiskMB << 20
	}
	if req.MaxFiles != nil {
		if *req.MaxFiles < 16 {
			writeError(w, badRequest("max_files must be at least 16"))
			return
		}
		opts.Limits.Files = *req.MaxFiles
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeError(w, badRequest("env: %q is not a valid variable name", k))
			return
		}
	}
	if err := s.networkOptions(&req, &opts); err != nil {
		writeError(w, err)
		return
	}
	opts.Checkpoints = req.Checkpoints // the session says what is wrong with it
	ms, err := s.opts.Manager.Create(r.Context(), opts)
	if err != nil {
		writeError(w, err)
		return
	}
	if r.Context().Err() != nil {
		// The client gave up while the session started: nobody knows its
		// id, so it would hold a slot until --idle-timeout.
		s.opts.Manager.Delete(opts.Owner, ms.ID())
		return
	}
	s.metrics.created.Inc()
	if req.Snapshot != "" {
		sayRestored(w, ms.Restored())
	}
	WriteJSON(w, http.StatusCreated, toSessionJSON(ms))
}

func sessionMode(ms *session.Managed) egress.Mode {
	switch {
	case ms.Network == jail.NetworkHost:
		return egress.ModeHost
	case ms.Egress != nil:
		return egress.ModeAllow
	}
	return egress.ModeNone
}

// networkOptions reads a create request's network mode and allowlist into
// opts, within what the server allows.
func (s *Server) networkOptions(req *createRequest, opts *session.CreateOptions) error {
	mode := s.opts.Egress.DefaultMode
	if mode == "" {
		mode = egress.ModeNone
	}
	if len(req.Network) > 0 && string(req.Network) != "null" {
		var b bool
		var text string
		switch {
		case json.Unmarshal(req.Network, &b) == nil:
			mode = egress.ModeNone
			if b {
				mode = egress.ModeHost
			}
		case json.Unmarshal(req.Network, &text) == nil:
			m, err := egress.ParseMode(text)
			if err != nil {
				return badRequest("network: %v", err)
			}
			mode = m
		default:
			return badRequest(`network must be "none", "allow" or "host" (or false/true)`)
		}
	}
	if len(req.Allow) > 0 && mode != egress.ModeAllow {
		if len(req.Network) > 0 {
			return badRequest(`allow lists hosts for network mode "allow", not %q`, mode)
		}
		mode = egress.ModeAllow // a list alone asks for allow mode
	}
	switch mode {
	case egress.ModeNone:
		opts.Network = jail.NetworkNone // not the manager's default
	case egress.ModeHost:
		if !s.opts.AllowNetwork {
			return &apiError{http.StatusForbidden, "network_not_allowed", "this server does not give sessions the host's network (start it with --allow-network); network \"allow\" with a list of hosts may do", 0}
		}
		opts.Network = jail.NetworkHost
	case egress.ModeAllow:
		list := req.Allow
		if len(list) == 0 && (req.Allow == nil || len(req.Network) == 0) {
			list = s.opts.Egress.Default
		}
		// (An explicit empty list with network "allow" starts with nothing
		// allowed, for PATCH .../network to open later.)
		if len(list) == 0 && req.Allow == nil {
			return badRequest(`network "allow" needs "allow": a list of hosts (e.g. ["pypi", "api.example.org"]); this server has no default list`)
		}
		al, err := s.allowlist(list)
		if err != nil {
			return err
		}
		p := s.opts.Egress.Policy
		p.Allow = al
		opts.Egress = &p
	}
	return nil
}

// sessionNetwork serves a session's network mode and its egress log.
func (s *Server) sessionNetwork(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	out := struct {
		Mode egress.Mode `json:"mode"`
		*egress.Log
	}{Mode: sessionMode(ms), Log: ms.NetworkLog()}
	if out.Log == nil {
		out.Log = &egress.Log{Allow: []string{}, Entries: []egress.Entry{}}
	}
	out.Log.Sort()
	WriteJSON(w, http.StatusOK, out)
}

// lookup finds the caller's session {id} and, if it is hibernated, wakes
// it (saying what came back in the Sandloop-Restored header).
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*session.Managed, bool) {
	ms, ok := s.lookupAsleep(w, r)
	if !ok || !ms.Hibernated() {
		return ms, ok
	}
	res, err := ms.Wake(r.Context())
	if err != nil {
		writeError(w, err)
		return nil, false
	}
	sayRestored(w, res)
	return ms, true
}

// lookupAsleep finds the caller's session {id}, waking nothing.
func (s *Server) lookupAsleep(w http.ResponseWriter, r *http.Request) (*session.Managed, bool) {
	ms, err := s.opts.Manager.Get(owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return nil, false
	}
	ms.Touch()
	return ms, true
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	list := s.opts.Manager.List(owner(r.Context()))
	out := make([]sessionJSON, 0, len(list))
	for _, ms := range list {
		out = append(out, toSessionJSON(ms))
	}
	WriteJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookupAsleep(w, r) // a hibernated one says so
	if !ok {
		return
	}
	j, err := s.sessionView(ms)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, j)
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	if err := s.opts.Manager.Delete(owner(r.Context()), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type executeRequest struct {
	Code     *string           `json:"code"`
	TimeoutS *float64          `json:"timeout_s"`
	Env      map[string]string `json:"env"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req executeRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Code == nil {
		writeError(w, badRequest(`field "code" is required`))
		return
	}
	kreq := kernel.Request{Code: *req.Code, Env: req.Env}
	if req.TimeoutS != nil {
		if err := positive("timeout_s", *req.TimeoutS, 24*3600); err != nil {
			writeError(w, err)
			return
		}
		kreq.Timeout = time.Duration(*req.TimeoutS * float64(time.Second))
	}
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	start := time.Now() // (ms.Execute marks the session in use)
	kind := streamKind(r)
	var res *kernel.Result
	var err error
	if kind == "" {
		res, err = ms.Execute(r.Context(), kreq, nil)
		if err == nil {
			WriteJSON(w, http.StatusOK, res)
		}
	} else {
		woke := w.Header().Get(HeaderRestored) != ""
		res, err = s.stream(w, r, kind, ms.Done(), func(emit kernel.EventFunc) (*kernel.Result, error) {
			if woke {
				emit(restoredEvent(ms.Restored()))
			}
			return ms.Execute(r.Context(), kreq, emit)
		})
	}
	if err != nil && res == nil {
		writeError(w, err)
		return
	}
	if res != nil {
		s.metrics.observe(res, time.Since(start))
	}
}

func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := ms.Interrupt(); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restart(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := ms.Restart(r.Context()); err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, toSessionJSON(ms))
}
