package server

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
)

// Durable snapshots over HTTP (issue 28): take one of a session, list,
// read and delete them, start a session from one (POST /v1/sessions
// {"snapshot": ID}), hibernate a session. Snapshots are their owner's:
// another token's id is 404. What came back at a restore (a new session
// from a snapshot, a hibernated session woken by a request) is said in
// the Sandloop-Restored header, in the session's "restored", and as the
// first event of an execution's stream ({"type":"restored"}).

// HeaderRestored carries Restored.Summary on the answer to the request
// that restored a session.
const HeaderRestored = "Sandloop-Restored"

// snapshotJSON is a snapshot as the API shows it.
type snapshotJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Session   string    `json:"session,omitempty"` // the source session
	CreatedAt time.Time `json:"created_at"`
	// Hibernation: the snapshot is a hibernated session's (deleted when
	// it wakes or is closed; retention leaves it alone).
	Hibernation bool  `json:"hibernation,omitempty"`
	Files       int   `json:"files"`       // regular files
	TotalBytes  int64 `json:"total_bytes"` // files and state, uncompressed
	// StoredBytes: compressed, shared blobs included; NewBytes: what this
	// one wrote (the rest was stored already).
	StoredBytes int64 `json:"stored_bytes"`
	NewBytes    int64 `json:"new_bytes"`
	// Variables are the names saved; NotRestorable those that did not
	// serialize, with the reason.
	Variables     []string           `json:"variables"`
	NotRestorable []kernel.NotSaved  `json:"not_restorable"`
	Serializer    string             `json:"serializer,omitempty"`
	FileList      []snapshotFileJSON `json:"file_list,omitempty"` // GET /v1/snapshots/{sid} only
}

type snapshotFileJSON struct {
	Path   string `json:"path"`
	Type   string `json:"type"` // file, dir, symlink
	Size   int64  `json:"size,omitempty"`
	Mode   string `json:"mode"`
	Target string `json:"target,omitempty"`
}

func toSnapshotJSON(m *snapshot.Manifest, withFiles bool) snapshotJSON {
	j := snapshotJSON{ID: m.ID, Name: m.Name, Session: m.Session, CreatedAt: m.CreatedAt, Hibernation: m.Held,
		TotalBytes: m.TotalBytes, StoredBytes: m.StoredBytes, NewBytes: m.NewBytes, Variables: []string{}, NotRestorable: []kernel.NotSaved{}}
	for _, f := range m.Files {
		if f.Type == "file" {
			j.Files++
		}
		if withFiles {
			j.FileList = append(j.FileList, snapshotFileJSON{Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode.Perm().String(), Target: f.Target})
		}
	}
	if m.State != nil && len(m.State.Manifest) > 0 {
		var sm kernel.StateManifest
		if json.Unmarshal(m.State.Manifest, &sm) == nil {
			j.Serializer = sm.Serializer
			if sm.Variables != nil {
				j.Variables = sm.Variables
			}
			if sm.NotSaved != nil {
				j.NotRestorable = sm.NotSaved
			}
		}
	}
	return j
}

type snapshotRequest struct {
	Name string `json:"name"`
}

func (s *Server) takeSnapshot(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req snapshotRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	m, err := s.opts.Manager.Snapshot(r.Context(), ms.Owner, ms.ID(), req.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusCreated, toSnapshotJSON(m, false))
}

// snapshotStore is the manager's store, or answers 501.
func (s *Server) snapshotStore(w http.ResponseWriter) (*snapshot.Store, bool) {
	st := s.opts.Manager.Snapshots()
	if st == nil {
		writeError(w, session.ErrNoSnapshots)
		return nil, false
	}
	return st, true
}

// listSnapshots is GET /v1/snapshots and GET /v1/sessions/{id}/snapshots
// (the snapshots of that session, which may be closed since: its id is
// not looked up among the live ones), newest first.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	st, ok := s.snapshotStore(w)
	if !ok {
		return
	}
	list, err := st.List(r.Context(), owner(r.Context()))
	if err != nil {
		writeError(w, err)
		return
	}
	sid := r.PathValue("id")
	if sid != "" {
		if _, err := s.opts.Manager.Get(owner(r.Context()), sid); err != nil && !hasSession(list, sid) {
			writeError(w, err) // neither live nor the source of a snapshot: 404
			return
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	out := make([]snapshotJSON, 0, len(list))
	for _, m := range list {
		if sid == "" || m.Session == sid {
			out = append(out, toSnapshotJSON(m, false))
		}
	}
	WriteJSON(w, http.StatusOK, map[string]any{"snapshots": out})
}

func hasSession(list []*snapshot.Manifest, id string) bool {
	for _, m := range list {
		if m.Session == id {
			return true
		}
	}
	return false
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	st, ok := s.snapshotStore(w)
	if !ok {
		return
	}
	m, err := st.Get(r.Context(), owner(r.Context()), r.PathValue("sid"))
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, toSnapshotJSON(m, true))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	st, ok := s.snapshotStore(w)
	if !ok {
		return
	}
	m, err := st.Get(r.Context(), owner(r.Context()), r.PathValue("sid"))
	if err == nil && m.Held {
		writeError(w, &apiError{http.StatusConflict, "snapshot_in_use", "snapshot " + m.ID + " holds hibernated session " + m.Session + ": it is deleted when the session wakes or is deleted (DELETE /v1/sessions/" + m.Session + ")", 0})
		return
	}
	if err := st.Delete(r.Context(), owner(r.Context()), r.PathValue("sid")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) hibernateSession(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookupAsleep(w, r)
	if !ok {
		return
	}
	if _, err := ms.Hibernate(r.Context()); err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, toSessionJSON(ms))
}

// sayRestored puts what came back into the answer's header.
func sayRestored(w http.ResponseWriter, res *session.Restored) {
	if res == nil {
		return
	}
	v := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f || r > unicode.MaxASCII {
			return '?' // a header carries ASCII; the JSON has the names exactly
		}
		return r
	}, res.Summary())
	if len(v) > 4000 {
		v = v[:4000] + "..."
	}
	w.Header().Set(HeaderRestored, v)
}

// restoredEvent is the first event of an execution that woke its session.
func restoredEvent(res *session.Restored) kernel.Event {
	return kernel.Event{Type: "restored", Text: res.Summary()}
}
