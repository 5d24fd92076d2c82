package e2b

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// Fork, as E2B's SDKs call it: sbx.fork({count, timeoutMs}) and
// Sandbox.fork(id, opts), POST /sandboxes/{id}/fork {timeout?, count?}.
//
// Each fork is a new sandbox made by session.Manager.Fork: a session of
// its own (own jail, workspace and cgroup) with the source's files and the
// variables of its default code context (serialized: what does not
// serialize is left out, and logged). Not carried, unlike E2B's VM forks:
// running commands and background processes, and the extra code contexts'
// variables. The source keeps running (E2B pauses it briefly). A fork has
// the source's template, metadata, environment and lifecycle, and its own
// time to live (timeout, or E2B's schema default of 15 s).

// forkTimeout is a fork's time to live when the request names none (E2B's
// SandboxForkRequest schema).
const forkTimeout = 15 * time.Second

// maxE2BForks is the count E2B accepts; sandloop makes them in batches of
// session.MaxForks.
const maxE2BForks = 100

type forkRequest struct {
	Timeout *float64 `json:"timeout"`
	Count   *int     `json:"count"`
}

// forkEntry is one fork's answer: the sandbox, or why it failed.
type forkEntry struct {
	Sandbox *created   `json:"sandbox,omitempty"`
	Error   *forkError `json:"error,omitempty"`
}

type forkError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request, owner string) {
	var req forkRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	if n < 1 || n > maxE2BForks {
		writeControlError(w, http.StatusBadRequest, fmt.Sprintf("count must be between 1 and %d, not %d", maxE2BForks, n))
		return
	}
	ttl := forkTimeout
	if req.Timeout != nil {
		t, err := h.ttl(req.Timeout)
		if err != nil {
			writeControlError(w, http.StatusBadRequest, err.Error())
			return
		}
		ttl = t
	}
	src := h.owned(w, owner, r.PathValue("id"))
	if src == nil {
		return
	}
	if src.isPaused() {
		writeControlError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is paused: resume it (Sandbox.connect) before forking it", src.id))
		return
	}
	entries := make([]forkEntry, 0, n)
	for done := 0; done < n; {
		batch := min(n-done, session.MaxForks)
		kids, restored, err := h.opts.Manager.Fork(r.Context(), owner, src.id, session.ForkOptions{Count: batch})
		if err != nil {
			if done == 0 {
				h.writeForkError(w, src, err)
				return
			}
			// Those made stand; the rest say why they are not.
			for range n - done {
				entries = append(entries, forkEntry{Error: forkErrorOf(err)})
			}
			break
		}
		if restored != nil && len(restored.NotRestored) > 0 {
			h.log.Warn("e2b: fork: not carried", "sandbox", src.id, "not_restored", restored.NotRestored)
		}
		for _, ms := range kids {
			sb, err := h.register(&sandbox{owner: owner, templateID: src.templateID, ms: ms,
				metadata: maps.Clone(src.metadata), envVars: maps.Clone(src.envVars), lc: src.lc, ttl: ttl, network: src.networkNow()})
			if err != nil {
				entries = append(entries, forkEntry{Error: &forkError{http.StatusServiceUnavailable, err.Error()}})
				continue
			}
			h.prepareFirstCommand(sb)
			c := sb.created(r)
			entries = append(entries, forkEntry{Sandbox: &c})
		}
		done += batch
	}
	h.log.Info("e2b: sandbox forked", "sandbox", src.id, "count", n, "ttl", ttl)
	writeJSON(w, http.StatusCreated, entries)
}

// writeForkError answers a fork none of whose sandboxes could be made.
func (h *Handler) writeForkError(w http.ResponseWriter, src *sandbox, err error) {
	fe := forkErrorOf(err)
	switch fe.Code {
	case http.StatusTooManyRequests:
		// The SDKs retry a 429 with Retry-After (sessions may end meanwhile).
		w.Header().Set("Retry-After", "1")
	case http.StatusNotFound:
		fe.Message = fmt.Sprintf("sandbox %q not found", src.id)
	case http.StatusInternalServerError:
		h.log.Error("e2b: fork", "sandbox", src.id, "err", err)
	}
	writeControlError(w, fe.Code, fe.Message)
}

func forkErrorOf(err error) *forkError {
	var le *session.LimitError
	var ae *session.ArgumentError
	switch {
	case errors.Is(err, session.ErrCapacity):
		return &forkError{http.StatusTooManyRequests, err.Error() + ": kill a sandbox or retry later"}
	case errors.Is(err, session.ErrNotFound), errors.Is(err, session.ErrClosed):
		return &forkError{http.StatusNotFound, err.Error()}
	case errors.Is(err, session.ErrBusy), errors.Is(err, session.ErrRestartRequired):
		return &forkError{http.StatusConflict, err.Error()}
	case errors.As(err, &le), errors.As(err, &ae):
		return &forkError{http.StatusBadRequest, err.Error()}
	}
	return &forkError{http.StatusInternalServerError, "could not fork the sandbox: " + err.Error()}
}
