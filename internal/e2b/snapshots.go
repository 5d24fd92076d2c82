package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
)

// E2B's snapshots (e2b-lifecycle-contract.md section 5) are sandloop's
// durable snapshots (package snapshot through the session manager): the
// sandbox's files exactly and its kernels' variables as far as they
// serialize. A snapshot's id is sandloop's (snap-...), which a create
// takes as its templateID (Sandbox.create(snapshotId)); a named one is
// listed under its name. The source keeps running (it waits for a
// running cell only).

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotJSON(m *snapshot.Manifest) snapshotJSON {
	j := snapshotJSON{SnapshotID: m.ID, Names: []string{}}
	if m.Name != "" {
		j.Names = append(j.Names, m.Name)
	}
	return j
}

// isSnapshotID says whether a templateID names a snapshot.
func isSnapshotID(id string) bool { return strings.HasPrefix(id, "snap-") }

// snapshotStore is the manager's store, or writes E2B's 501.
func (h *Handler) snapshotStore(w http.ResponseWriter) *snapshot.Store {
	st := h.opts.Manager.Snapshots()
	if st == nil {
		writeControlError(w, http.StatusNotImplemented, "this server keeps no snapshots (sandloop serve keeps them under --data-dir, or in --snapshot-store)")
	}
	return st
}

// writeSnapshotError maps a snapshot call's error to E2B's shape.
func writeSnapshotError(w http.ResponseWriter, err error) {
	var qe *snapshot.QuotaError
	var ce *snapshot.CorruptError
	var ae *session.ArgumentError
	switch {
	case errors.Is(err, snapshot.ErrNotFound), errors.Is(err, session.ErrNotFound):
		writeControlError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &qe):
		writeControlError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.As(err, &ce):
		writeControlError(w, http.StatusUnprocessableEntity, err.Error())
	case errors.As(err, &ae):
		writeControlError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, session.ErrNoSnapshots):
		writeControlError(w, http.StatusNotImplemented, err.Error())
	default:
		writeControlError(w, http.StatusInternalServerError, "snapshot: "+err.Error())
	}
}

// createSnapshot is sbx.createSnapshot({name?}): 201 {snapshotID, names}.
func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Name string `json:"name"`
	}
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	sb := h.owned(w, owner, r.PathValue("id"))
	if sb == nil || h.snapshotStore(w) == nil {
		return
	}
	m, err := h.opts.Manager.Snapshot(r.Context(), owner, sb.ms.ID(), req.Name)
	if err != nil {
		writeSnapshotError(w, err)
		return
	}
	h.log.Info("e2b: snapshot", "sandbox", sb.id, "snapshot", m.ID)
	writeJSON(w, http.StatusCreated, toSnapshotJSON(m))
}

// listSnapshots is Sandbox.listSnapshots({sandboxId?, name?, limit?,
// nextToken?}): GET /snapshots, newest first, X-Next-Token when there
// are more pages.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, owner string) {
	st := h.snapshotStore(w)
	if st == nil {
		return
	}
	q := r.URL.Query()
	limit, offset := 100, 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeControlError(w, http.StatusBadRequest, "limit must be a positive number")
			return
		}
		limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeControlError(w, http.StatusBadRequest, "nextToken is not one this server gave")
			return
		}
		offset = n
	}
	list, err := st.List(r.Context(), owner)
	if err != nil {
		writeSnapshotError(w, err)
		return
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	sandbox, name := q.Get("sandboxID"), q.Get("name")
	base, _, _ := strings.Cut(name, ":") // a name may carry a tag
	out := []snapshotJSON{}
	for _, m := range list {
		if m.Held || sandbox != "" && m.Session != sandbox || name != "" && m.ID != name && m.Name != name && m.Name != base {
			continue
		}
		out = append(out, toSnapshotJSON(m))
	}
	if offset > len(out) {
		offset = len(out)
	}
	out = out[offset:]
	if len(out) > limit {
		out = out[:limit]
		w.Header().Set("X-Next-Token", strconv.Itoa(offset+limit))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot is Sandbox.deleteSnapshot(id): DELETE /templates/{id}
// (E2B's snapshots are templates): 204, or 404 for an id that is not one
// of the caller's snapshots.
func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	// Not found is the SDK's false: an id that is no snapshot's, and any
	// id on a server that keeps none.
	id := r.PathValue("id")
	if !isSnapshotID(id) {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("template %q not found: this server deletes snapshots only", id))
		return
	}
	st := h.opts.Manager.Snapshots()
	if st == nil {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found: this server keeps no snapshots", id))
		return
	}
	m, err := st.Get(r.Context(), owner, id)
	if err == nil && m.Held {
		writeControlError(w, http.StatusConflict, "snapshot "+id+" holds a hibernated sandbox: it goes when the sandbox is killed or resumed")
		return
	}
	if err == nil {
		err = st.Delete(r.Context(), owner, id)
	}
	if err != nil {
		writeSnapshotError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
