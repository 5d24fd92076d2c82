package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// Pause and resume, as E2B's SDKs call them (sbx.pause(), betaPause(),
// Sandbox.pause(id); Sandbox.connect(id) and sbx.connect() resume), and
// the lifecycle asked at creation (onTimeout: 'pause', autoResume).
//
// Pausing a sandbox pauses every kernel of it (its session and the extra
// code contexts: session.Pause, the cgroup freezer) and freezes its
// running commands: nothing of it uses CPU, its memory is kept, and
// resuming gives back every variable and every process where it was. A
// paused sandbox's time to live does not run (as E2B's). While paused its
// data plane answers 409 "paused" (never 404, never a hang), unless it was
// created with autoResume: then any request resumes it first, with its
// time to live from then. With onTimeout 'pause' a sandbox whose time to
// live ends is paused instead of killed; one running an execution then is
// paused once the execution ends (each execution has its own timeout).
// A pause asking memory: false (E2B's filesystem-only snapshot), or a
// connect asking memory: false (onResume: 'reboot'), resumes as E2B boots
// such a snapshot: the files are kept, the kernels restart empty and the
// commands are gone.

// lifecycle is what create asked for the sandbox's end.
type lifecycle struct {
	autoPause   bool // at the end of its time to live: pause, not kill
	autoResume  bool // a data-plane request resumes a paused sandbox
	pauseMemory bool // with autoPause: keep memory (E2B's default)
}

// errAlreadyPaused: pause of a paused sandbox (409, the SDK's false).
var errAlreadyPaused = errors.New("already paused")

func (sb *sandbox) isPaused() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.paused
}

// pause pauses the sandbox's kernels and commands; keepMemory false makes
// the next resume start the kernels afresh (E2B's memory: false).
func (sb *sandbox) pause(keepMemory bool) error {
	sb.transition.Lock()
	defer sb.transition.Unlock()
	sb.mu.Lock()
	if sb.paused {
		sb.mu.Unlock()
		return errAlreadyPaused
	}
	ctxs := make([]*codeContext, 0, len(sb.contexts))
	for _, c := range sb.contexts {
		if c.own {
			ctxs = append(ctxs, c)
		}
	}
	procs := make([]*process, 0, len(sb.procs))
	for _, p := range sb.procs {
		procs = append(procs, p)
	}
	sb.mu.Unlock()
	// The kernels first: one running an execution refuses (ErrBusy), and
	// what was paused before it is resumed.
	var paused []*session.Session
	undo := func() {
		for _, s := range paused {
			s.Resume()
		}
	}
	if err := sb.ms.Pause(); err != nil {
		return err
	}
	paused = append(paused, sb.ms.Session)
	for _, c := range ctxs {
		if err := c.s.Pause(); err != nil && !errors.Is(err, session.ErrClosed) {
			undo()
			return err
		}
		paused = append(paused, c.s)
	}
	for _, p := range procs {
		_ = p.jp.Freeze() // an ended command has nothing to freeze
	}
	sb.mu.Lock()
	sb.paused, sb.coldResume = true, !keepMemory
	sb.mu.Unlock()
	sb.saved()
	return nil
}

// resume lets a paused sandbox run again, its time to live ttl from now
// (a sandbox that is not paused is left alone). It reports whether it
// was paused.
func (sb *sandbox) resume(ctx context.Context, ttl time.Duration) (bool, error) {
	sb.transition.Lock()
	defer sb.transition.Unlock()
	sb.mu.Lock()
	if !sb.paused {
		sb.mu.Unlock()
		return false, nil
	}
	cold := sb.coldResume
	ctxs := make([]*codeContext, 0, len(sb.contexts))
	for _, c := range sb.contexts {
		if c.own {
			ctxs = append(ctxs, c)
		}
	}
	procs := make([]*process, 0, len(sb.procs))
	for _, p := range sb.procs {
		procs = append(procs, p)
	}
	sb.mu.Unlock()
	for _, p := range procs {
		if cold {
			p.kill() // the kill thaws it so that it dies
			continue
		}
		_ = p.jp.Thaw()
	}
	var errs []error
	for _, s := range append([]*session.Session{sb.ms.Session}, sessionsOf(ctxs)...) {
		var err error
		if cold {
			err = s.Restart(ctx) // resumes, then starts a fresh kernel
		} else {
			err = s.Resume()
		}
		if err != nil && !errors.Is(err, session.ErrClosed) {
			errs = append(errs, err)
		}
	}
	sb.ms.Touch()
	sb.mu.Lock()
	sb.paused, sb.coldResume = false, false
	sb.endAt = time.Now().Add(ttl)
	sb.mu.Unlock()
	sb.saved()
	return true, errors.Join(errs...)
}

// rebootOnResume makes the next resume of a paused sandbox start its
// kernels afresh (connect's memory: false).
func (sb *sandbox) rebootOnResume() {
	sb.mu.Lock()
	if sb.paused {
		sb.coldResume = true
	}
	sb.mu.Unlock()
}

func sessionsOf(ctxs []*codeContext) []*session.Session {
	out := make([]*session.Session, len(ctxs))
	for i, c := range ctxs {
		out[i] = c.s
	}
	return out
}

type pauseRequest struct {
	Memory *bool `json:"memory"`
}

// pauseHandler serves POST /sandboxes/{id}/pause: 204, or 409 when it is
// paused already (the SDK's false) or cannot be paused now.
func (h *Handler) pauseHandler(w http.ResponseWriter, r *http.Request, owner string) {
	var req pauseRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	sb := h.owned(w, owner, r.PathValue("id"))
	if sb == nil {
		return
	}
	err := sb.pause(req.Memory == nil || *req.Memory)
	switch {
	case err == nil:
		h.log.Info("e2b: sandbox paused", "sandbox", sb.id)
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, errAlreadyPaused):
		writeControlError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", sb.id))
	case errors.Is(err, session.ErrBusy):
		writeControlError(w, http.StatusConflict, fmt.Sprintf("sandbox %q cannot be paused while code runs in it: pause it when the execution has ended", sb.id))
	case errors.Is(err, session.ErrCapacity):
		writeControlError(w, http.StatusTooManyRequests, "this server holds as many paused sandboxes as it may: kill or resume one")
	default:
		h.log.Error("e2b: pause", "sandbox", sb.id, "err", err)
		writeControlError(w, http.StatusInternalServerError, "could not pause the sandbox: "+err.Error())
	}
}

// pausedGate answers a data-plane request to a paused sandbox: with
// autoResume it resumes the sandbox and lets the request through (true);
// otherwise it answers 409, as E2B's proxy does.
func (h *Handler) pausedGate(w http.ResponseWriter, r *http.Request, sb *sandbox) bool {
	if !sb.isPaused() {
		return true
	}
	if !sb.lc.autoResume {
		writeControlError(w, http.StatusConflict, fmt.Sprintf("the sandbox %s is paused: connect to it (Sandbox.connect) to resume it", sb.id))
		return false
	}
	if _, err := sb.resume(r.Context(), sb.ttl); err != nil {
		h.log.Error("e2b: auto-resume", "sandbox", sb.id, "err", err)
		http.Error(w, "the sandbox could not be resumed: "+err.Error(), http.StatusBadGateway)
		return false
	}
	h.log.Info("e2b: sandbox resumed", "sandbox", sb.id, "by", "a request (autoResume)")
	return true
}

// timeoutPause pauses a sandbox whose time to live ended (onTimeout
// 'pause'); one running an execution is tried again at the next look.
func (h *Handler) timeoutPause(sb *sandbox) {
	if !sb.pausing.CompareAndSwap(false, true) {
		return
	}
	defer sb.pausing.Store(false)
	err := sb.pause(sb.lc.pauseMemory)
	switch {
	case err == nil:
		h.log.Info("e2b: sandbox paused", "sandbox", sb.id, "reason", "timeout")
	case errors.Is(err, errAlreadyPaused), errors.Is(err, session.ErrBusy):
	default:
		h.log.Warn("e2b: pausing at timeout failed: killing it", "sandbox", sb.id, "err", err)
		h.kill(sb, "timeout")
	}
}
