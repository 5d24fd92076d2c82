package server

import (
	"archive/zip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/store"
)

type startRunRequest struct {
	Task      string            `json:"task"`
	Mode      string            `json:"mode"`
	Model     string            `json:"model"`
	Files     map[string]string `json:"files"`     // path → UTF-8 text
	FilesB64  map[string]string `json:"files_b64"` // path → base64 bytes
	Entry     string            `json:"entry"`
	Args      []string          `json:"args"`
	Checks    []string          `json:"checks"`
	MaxSteps  int               `json:"max_steps"`
	MaxTokens int64             `json:"max_tokens"`
	MaxCost   float64           `json:"max_cost_usd"`
	TimeoutS  float64           `json:"timeout_s"`
	NoLessons bool              `json:"no_lessons"`
}

func (s *Server) runsEnabled(w http.ResponseWriter) bool {
	if s.opts.Runs == nil || s.opts.Store == nil {
		writeError(w, &apiError{http.StatusNotImplemented, "runs_disabled", "this server runs no agent (no run history configured)", 0})
		return false
	}
	return true
}

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) {
	if !s.runsEnabled(w) {
		return
	}
	if s.draining.Load() {
		writeError(w, errDraining)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxRunBodyBytes)
	var req startRunRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case strings.TrimSpace(req.Task) == "" && agent.NeedsTask(agent.Mode(req.Mode)):
		writeError(w, badRequest(`task is required: say what the agent should do, e.g. {"task": "parse data.csv and plot the monthly totals"}`))
		return
	case req.MaxSteps < 0 || req.MaxTokens < 0 || req.MaxCost < 0 || req.TimeoutS < 0:
		writeError(w, badRequest("max_steps, max_tokens, max_cost_usd and timeout_s must not be negative"))
		return
	case req.MaxSteps > 200:
		writeError(w, badRequest("max_steps is at most 200"))
		return
	}
	files := map[string][]byte{}
	for p, c := range req.Files {
		files[p] = []byte(c)
	}
	for p, c := range req.FilesB64 {
		b, err := base64.StdEncoding.DecodeString(c)
		if err != nil {
			writeError(w, badRequest("files_b64[%q] is not base64: %v", p, err))
			return
		}
		files[p] = b
	}
	run, err := s.opts.Runs.Start(r.Context(), runs.Request{
		Owner: owner(r.Context()), Task: req.Task, Mode: agent.Mode(req.Mode), Model: req.Model, Files: files, Entry: req.Entry, Args: req.Args, Checks: req.Checks,
		MaxSteps: req.MaxSteps, MaxTokens: req.MaxTokens, MaxCost: req.MaxCost, Timeout: time.Duration(req.TimeoutS * float64(time.Second)),
		NoLessons: req.NoLessons,
	})
	if err != nil {
		writeError(w, runError(err))
		return
	}
	WriteJSON(w, http.StatusCreated, run)
}

// runStatuses are the values of a run's status.
var runStatuses = []agent.Status{agent.StatusRunning, agent.StatusDone, agent.StatusBudgetExceeded, agent.StatusTimeout, agent.StatusStuck, agent.StatusCancelled, agent.StatusFailed}

// queryCount reads an optional non-negative integer query parameter.
func queryCount(q url.Values, name string) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, badRequest("%s %q must be a whole number, 0 or more", name, v)
	}
	return n, nil
}

// runError maps the agent's and the model resolver's errors.
func runError(err error) error {
	var ae *agent.ArgumentError
	var nm *llm.NoModelError
	var ce *llm.ConfigError
	switch {
	case errors.As(err, &ae):
		return badRequest("%v", err)
	case errors.As(err, &nm), errors.As(err, &ce):
		return &apiError{http.StatusBadRequest, "no_model", err.Error(), 0}
	case errors.Is(err, store.ErrNotFound):
		return &apiError{http.StatusNotFound, "not_found", "no such run", 0}
	case errors.Is(err, runs.ErrNotRunning):
		return &apiError{http.StatusConflict, "not_running", "the run has already ended", 0}
	}
	return err
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	if !s.runsEnabled(w) {
		return
	}
	q := r.URL.Query()
	limit, err := queryCount(q, "limit")
	if err != nil {
		writeError(w, err)
		return
	}
	offset, err := queryCount(q, "offset")
	if err != nil {
		writeError(w, err)
		return
	}
	if st := q.Get("status"); st != "" && !slices.Contains(runStatuses, agent.Status(st)) {
		writeError(w, badRequest("status %q is not a run status (use one of %v)", st, runStatuses))
		return
	}
	if m := q.Get("mode"); m != "" {
		if _, err := agent.ParseMode(m); err != nil {
			writeError(w, badRequest("mode: %v", err))
			return
		}
	}
	o := owner(r.Context())
	list, err := s.opts.Store.ListRuns(r.Context(), store.ListOptions{Limit: limit, Offset: offset, Status: q.Get("status"), Mode: q.Get("mode"), Owner: &o})
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []store.Run{}
	}
	WriteJSON(w, http.StatusOK, map[string]any{"runs": list})
}

// ownRun returns the run named in the path if the caller started it (with
// the same token); another caller's run is "not found", as its sessions are.
func (s *Server) ownRun(w http.ResponseWriter, r *http.Request) (*store.Run, bool) {
	if !s.runsEnabled(w) {
		return nil, false
	}
	run, err := s.opts.Store.GetRun(r.Context(), r.PathValue("id"))
	if err == nil && run.Owner != owner(r.Context()) {
		err = store.ErrNotFound
	}
	if err != nil {
		writeError(w, runError(err))
		return nil, false
	}
	return run, true
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	if run, ok := s.ownRun(w, r); ok {
		run.Report = s.renamePreviews(r, run.Report, false)
		WriteJSON(w, http.StatusOK, run)
	}
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.ownRun(w, r); !ok {
		return
	}
	if err := s.opts.Runs.Cancel(r.PathValue("id")); err != nil {
		writeError(w, runError(err))
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// runEvents streams a run's events over SSE: those recorded so far, then
// live ones until the run ends. Last-Event-ID (or ?since=) resumes.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.ownRun(w, r); !ok {
		return
	}
	since, _ := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
	if v := r.URL.Query().Get("since"); v != "" {
		since, _ = strconv.ParseInt(v, 10, 64)
	}
	ch, err := s.opts.Runs.Watch(r.Context(), r.PathValue("id"), since)
	if err != nil {
		writeError(w, runError(err))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	t := time.NewTicker(s.opts.Keepalive)
	defer t.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
			fmt.Fprint(w, ": keepalive\n\n")
			flush()
		case e, ok := <-ch:
			if !ok {
				fmt.Fprint(w, "event: end\ndata: {}\n\n")
				flush()
				return
			}
			data := compactJSON(e.Data)
			if e.Type == agent.EventFinished {
				data = s.renamePreviews(r, data, true)
			}
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, data)
			flush()
		}
	}
}

func compactJSON(b json.RawMessage) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	return b
}

func (s *Server) runArtifacts(w http.ResponseWriter, r *http.Request) {
	run, ok := s.ownRun(w, r)
	if !ok {
		return
	}
	// The final files are kept when the run ends: before, the zip would be
	// empty, which reads as "the run made nothing".
	if run.Status == string(agent.StatusRunning) {
		writeError(w, &apiError{http.StatusConflict, "run_running", "the run is still running: its final files are kept when it ends (watch GET /v1/runs/{id}/events or poll GET /v1/runs/{id}), then ask again", 0})
		return
	}
	id := r.PathValue("id")
	list, err := s.opts.Store.ListArtifacts(r.Context(), id)
	if err != nil {
		writeError(w, runError(err))
		return
	}
	w.Header().Set("Content-Type", "application/zip")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": "run-" + id + ".zip"}))
	zw := zip.NewWriter(w)
	for _, a := range list {
		full, err := s.opts.Store.Artifact(r.Context(), id, a.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		h := &zip.FileHeader{Name: a.Path, Method: zip.Deflate}
		h.SetMode(a.Mode.Perm() | 0o400)
		fw, err := zw.CreateHeader(h)
		if err != nil {
			return
		}
		if _, err := fw.Write(full.Data); err != nil {
			return
		}
	}
	zw.Close()
}
