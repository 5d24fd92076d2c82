package server

import (
	"context"
	"net/http"
	"unicode/utf8"

	"github.com/sandloop/sandloop/internal/session"
)

// A session's lifecycle over HTTP (issue 27): pause and resume, checkpoints
// and undo, fork. The session layer does the work; these handlers decode,
// check ownership (lookup: another token's session is 404) and say what
// came back.

// maxCheckpointName caps a checkpoint's name, in characters (the
// session's own bound).
const maxCheckpointName = 200

// sessionView is a session as GET /v1/sessions/{id} shows it: with its
// state, what came back at its last restore, and its workspace's usage.
func (s *Server) sessionView(ms *session.Managed) (sessionJSON, error) {
	j := toSessionJSON(ms)
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
	if err := ms.Pause(); err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, toSessionJSON(ms))
}

func (s *Server) resumeSession(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := ms.Resume(); err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, toSessionJSON(ms))
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
	cp, err := ms.Checkpoint(r.Context(), req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusCreated, cp)
}

// checkpointList is GET /v1/sessions/{id}/checkpoints.
type checkpointList struct {
	Checkpoints []session.Checkpoint `json:"checkpoints"`
	// HeldBytes is what they hold together (memory and files), charged to
	// the session.
	HeldBytes int64 `json:"held_bytes"`
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	out := checkpointList{Checkpoints: ms.Checkpoints()}
	if out.Checkpoints == nil {
		out.Checkpoints = []session.Checkpoint{}
	}
	for _, cp := range out.Checkpoints {
		out.HeldBytes += cp.MemoryBytes + cp.FileBytes
	}
	WriteJSON(w, http.StatusOK, out)
}

func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request) {
	s.restoreWith(w, r, func(ctx context.Context, ms *session.Managed) (*session.Restored, error) {
		return ms.RestoreCheckpoint(ctx, r.PathValue("cid"))
	})
}

func (s *Server) undo(w http.ResponseWriter, r *http.Request) {
	s.restoreWith(w, r, func(ctx context.Context, ms *session.Managed) (*session.Restored, error) {
		return ms.Undo(ctx)
	})
}

// restoreWith puts the session back as restore says and answers the
// session, with what came back.
func (s *Server) restoreWith(w http.ResponseWriter, r *http.Request, restore func(context.Context, *session.Managed) (*session.Restored, error)) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if _, err := restore(r.Context(), ms); err != nil {
		writeError(w, err)
		return
	}
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
	if err := ms.DeleteCheckpoint(r.Context(), r.PathValue("cid")); err != nil {
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
	Sessions []sessionJSON     `json:"sessions"`
	Restored *session.Restored `json:"restored"`
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
	parent, ok := s.lookup(w, r)
	if !ok {
		return
	}
	kids, res, err := s.opts.Manager.Fork(r.Context(), parent.Owner, parent.ID(), session.ForkOptions{Count: req.Count, Checkpoint: req.Checkpoint})
	if err != nil {
		writeError(w, err)
		return
	}
	nb := s.notebookOf(parent.ID())
	out := forkResponse{Sessions: make([]sessionJSON, 0, len(kids)), Restored: res}
	for _, k := range kids {
		s.metrics.created.Inc()
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
