package server

import (
	"context"
	"net/http"
	"sync"
	"unicode/utf8"

	"github.com/sandloop/sandloop/internal/session"
)

// A session's lifecycle over HTTP (issue 27): pause and resume, checkpoints
// and undo, fork. The session layer does the work; these handlers decode,
// check ownership (lookup: another token's session is 404) and say what
// came back.

// checkpointer is what the checkpoint routes ask of a session
// (*session.Managed, which takes its lease and resumes a paused session).
type checkpointer interface {
	Checkpoint(ctx context.Context, name string) (*checkpoint, error)
	Checkpoints() []checkpoint
	RestoreCheckpoint(ctx context.Context, id string) (*restored, error)
	DeleteCheckpoint(ctx context.Context, id string) error
	Undo(ctx context.Context) (*restored, error)
}

// pauser is what pause and resume ask of a session.
type pauser interface {
	Pause() error
	Resume() error
	State() string
}

// maxCheckpointName caps a checkpoint's name, in characters.
const maxCheckpointName = 100

// stateOf is the session's state: running, or paused.
func stateOf(ms *session.Managed) string {
	if p, ok := any(ms).(pauser); ok {
		return p.State()
	}
	return "running"
}

func checkpointsOf(ms *session.Managed) (checkpointer, error) {
	c, ok := any(ms).(checkpointer)
	if !ok {
		return nil, errNotBuilt
	}
	return c, nil
}

func pauserOf(ms *session.Managed) (pauser, error) {
	p, ok := any(ms).(pauser)
	if !ok {
		return nil, errNotBuilt
	}
	return p, nil
}

// restoredRecords keeps, by session id, what came back at the session's
// last restore, undo or fork, for GET /v1/sessions/{id}: a client or a
// model that comes later is not misled about what survived.
type restoredRecords struct {
	mu sync.Mutex
	m  map[string]restoredRecord
}

type restoredRecord struct {
	owner string
	r     restored
}

// setRestored records r as session id's last restore, forgetting those of
// sessions that have ended.
func (s *Server) setRestored(owner, id string, r *restored) {
	if r == nil {
		return
	}
	s.restored.mu.Lock()
	defer s.restored.mu.Unlock()
	if s.restored.m == nil {
		s.restored.m = map[string]restoredRecord{}
	}
	for sid, e := range s.restored.m {
		if _, err := s.opts.Manager.Get(e.owner, sid); err != nil {
			delete(s.restored.m, sid)
		}
	}
	s.restored.m[id] = restoredRecord{owner, *r}
}

func (s *Server) restoredOf(id string) *restored {
	s.restored.mu.Lock()
	defer s.restored.mu.Unlock()
	if e, ok := s.restored.m[id]; ok {
		r := e.r
		return &r
	}
	return nil
}

// sessionView is a session as GET /v1/sessions/{id} shows it: with its
// state, what came back at its last restore, and its workspace's usage.
func (s *Server) sessionView(ms *session.Managed) (sessionJSON, error) {
	j := s.toSessionJSON(ms)
	u, err := ms.Usage()
	if err != nil {
		return j, err
	}
	j.DiskUsedBytes, j.FilesUsed = &u.Bytes, &u.Files
	return j, nil
}

func (s *Server) pauseSession(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	p, err := pauserOf(ms)
	if err == nil {
		err = p.Pause()
	}
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, s.toSessionJSON(ms))
}

func (s *Server) resumeSession(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	p, err := pauserOf(ms)
	if err == nil {
		err = p.Resume()
	}
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, s.toSessionJSON(ms))
}

type checkpointRequest struct {
	Name string `json:"name"`
}

func (s *Server) takeCheckpoint(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req checkpointRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	if n := utf8.RuneCountInString(req.Name); n > maxCheckpointName || !utf8.ValidString(req.Name) {
		writeError(w, badRequest("name: at most %d characters of UTF-8, not %d", maxCheckpointName, n))
		return
	}
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	c, err := checkpointsOf(ms)
	if err != nil {
		writeError(w, err)
		return
	}
	cp, err := c.Checkpoint(r.Context(), req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusCreated, cp)
}

// checkpointList is GET /v1/sessions/{id}/checkpoints.
type checkpointList struct {
	Checkpoints []checkpoint `json:"checkpoints"`
	// HeldBytes is what they hold together (memory and files), charged to
	// the session.
	HeldBytes int64 `json:"held_bytes"`
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	c, err := checkpointsOf(ms)
	if err != nil {
		writeError(w, err)
		return
	}
	out := checkpointList{Checkpoints: c.Checkpoints()}
	if out.Checkpoints == nil {
		out.Checkpoints = []checkpoint{}
	}
	for _, cp := range out.Checkpoints {
		out.HeldBytes += cp.MemoryBytes + cp.FileBytes
	}
	WriteJSON(w, http.StatusOK, out)
}

func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request) {
	s.restoreWith(w, r, func(ctx context.Context, c checkpointer) (*restored, error) {
		return c.RestoreCheckpoint(ctx, r.PathValue("cid"))
	})
}

func (s *Server) undo(w http.ResponseWriter, r *http.Request) {
	s.restoreWith(w, r, func(ctx context.Context, c checkpointer) (*restored, error) {
		return c.Undo(ctx)
	})
}

// restoreWith puts the session back as restore says and answers the
// session, with what came back.
func (s *Server) restoreWith(w http.ResponseWriter, r *http.Request, restore func(context.Context, checkpointer) (*restored, error)) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	c, err := checkpointsOf(ms)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := restore(r.Context(), c)
	if err != nil {
		writeError(w, err)
		return
	}
	s.setRestored(ms.Owner, ms.ID(), res)
	j, err := s.sessionView(ms)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, j)
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	c, err := checkpointsOf(ms)
	if err == nil {
		err = c.DeleteCheckpoint(r.Context(), r.PathValue("cid"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type forkRequest struct {
	// Count is how many sessions to make; if zero, 1.
	Count int `json:"count"`
	// Checkpoint, if set, forks from that checkpoint instead of the live state.
	Checkpoint string `json:"checkpoint"`
}

// forkResponse is POST /v1/sessions/{id}/fork's answer.
type forkResponse struct {
	Sessions []sessionJSON `json:"sessions"`
	Restored *restored     `json:"restored"`
}

func (s *Server) forkSession(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeError(w, errDraining)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req forkRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	if req.Count < 0 {
		writeError(w, badRequest("count must be at least 1 (or left out for 1), not %d", req.Count))
		return
	}
	parent, ok := s.lookup(w, r)
	if !ok {
		return
	}
	kids, res, err := forkSessions(r.Context(), s.opts.Manager, parent.Owner, parent.ID(), forkOptions{Count: req.Count, Checkpoint: req.Checkpoint})
	if err != nil {
		writeError(w, err)
		return
	}
	nb := s.notebookOf(parent.ID())
	out := forkResponse{Sessions: make([]sessionJSON, 0, len(kids)), Restored: res}
	for _, k := range kids {
		s.metrics.created.Inc()
		s.setRestored(k.Owner, k.ID(), res)
		// The child's notebook starts as its parent's: the cells that made
		// the state it has.
		if len(nb.Cells) > 0 {
			if _, err := s.saveNotebook(k.Owner, k.ID(), nb.Cells, nil); err != nil {
				s.log.Warn("copy the notebook to a fork", "session", k.ID(), "err", err)
			}
		}
		// The children exist now: an error reading one's usage must not
		// hide them from their owner.
		j, err := s.sessionView(k)
		if err != nil {
			s.log.Warn("usage of a fork", "session", k.ID(), "err", err)
		}
		out.Sessions = append(out.Sessions, j)
	}
	WriteJSON(w, http.StatusCreated, out)
}
