package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/workspace"
)

// apiError is an error with its HTTP status and a stable code.
type apiError struct {
	Status     int
	Code       string
	Message    string
	RetryAfter int // seconds, for 429
}

func (e *apiError) Error() string { return e.Message }

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...), 0}
}

// errUnauthorized is returned when a token is missing or wrong.
var errUnauthorized = &apiError{http.StatusUnauthorized, "unauthorized", "missing or invalid token: send Authorization: Bearer <token>", 0}

// errQueryToken refuses ?token= where a header can be sent: a token in a
// URL ends up in logs, browser history and Referer headers.
var errQueryToken = &apiError{http.StatusUnauthorized, "unauthorized", "?token= is accepted only by downloads, event streams and the terminal (see /openapi.yaml): send Authorization: Bearer <token>", 0}

// toAPIError maps every error the handlers can meet to a status, in this
// one place.
func toAPIError(err error) *apiError {
	var ae *apiError
	var pe *workspace.PathError
	var le *workspace.LimitError
	var sl *session.LimitError
	var sa *session.ArgumentError
	var ja *jail.ArgumentError
	var wa *workspace.ArgumentError
	var dm *jail.DiskOverMemoryError
	var mbe *http.MaxBytesError
	var tu *template.InUseError
	var ta *template.ArgumentError
	var sq *snapshot.QuotaError
	var sc *snapshot.CorruptError
	var sna *snapshot.ArgumentError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &sq):
		return &apiError{http.StatusRequestEntityTooLarge, "snapshot_quota", err.Error(), 0}
	case errors.As(err, &sc):
		return &apiError{http.StatusUnprocessableEntity, "snapshot_corrupted", err.Error(), 0}
	case errors.Is(err, snapshot.ErrNotFound):
		return &apiError{http.StatusNotFound, "snapshot_not_found", err.Error() + " (GET /v1/snapshots lists yours)", 0}
	case errors.As(err, &sna):
		return &apiError{http.StatusBadRequest, "bad_request", err.Error(), 0}
	case errors.Is(err, session.ErrNoSnapshots):
		return &apiError{http.StatusNotImplemented, "no_snapshots", err.Error() + " (serve keeps them under --data-dir, or in --snapshot-store)", 0}
	case errors.As(err, &mbe):
		return &apiError{http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body larger than %d bytes", mbe.Limit), 0}
	case errors.As(err, &le) && le.What == "quota":
		return &apiError{http.StatusInsufficientStorage, "workspace_full", err.Error(), 0}
	case errors.As(err, &le):
		return &apiError{http.StatusRequestEntityTooLarge, "too_large", err.Error(), 0}
	case errors.Is(err, template.ErrNotFound), errors.Is(err, session.ErrNoTemplates):
		return &apiError{http.StatusNotFound, "template_not_found", err.Error() + " (GET /v1/templates lists them; `sandloop template build` makes one)", 0}
	case errors.As(err, &tu):
		return &apiError{http.StatusConflict, "template_in_use", err.Error(), 0}
	case errors.As(err, &ta):
		return &apiError{http.StatusBadRequest, "bad_request", err.Error(), 0}
	case errors.Is(err, workspace.ErrNotFound), errors.Is(err, session.ErrNotFound):
		return &apiError{http.StatusNotFound, "not_found", err.Error(), 0}
	case errors.Is(err, workspace.ErrNotRegular):
		return &apiError{http.StatusBadRequest, "not_a_file", err.Error(), 0}
	case errors.As(err, &pe):
		return &apiError{http.StatusBadRequest, "bad_path", err.Error(), 0}
	// A session's checkpoints at their bounds: waiting does not help,
	// deleting one does.
	case errors.As(err, &sl) && sl.Name == "checkpoints":
		return &apiError{http.StatusConflict, "too_many_checkpoints", err.Error(), 0}
	case errors.As(err, &sl) && sl.Name == "checkpoint memory":
		return &apiError{http.StatusConflict, "checkpoint_memory", err.Error(), 0}
	case errors.As(err, &sl):
		return &apiError{http.StatusBadRequest, "limit_too_high", err.Error(), 0}
	case errors.As(err, &sa):
		return &apiError{http.StatusBadRequest, "bad_request", err.Error(), 0}
	case errors.As(err, &dm):
		return &apiError{http.StatusBadRequest, "disk_over_memory", fmt.Sprintf("disk_mb %d is more than memory_mb %d: %s; ask for less disk_mb or more memory_mb", dm.Disk>>20, dm.Memory>>20, jail.DiskOverMemoryWhy), 0}
	case errors.As(err, &ja), errors.As(err, &wa):
		return &apiError{http.StatusBadRequest, "bad_request", err.Error(), 0}
	case errors.Is(err, session.ErrCapacity) && err != session.ErrCapacity:
		// Said how (a fork needing more room, the cap of paused sessions).
		return &apiError{http.StatusTooManyRequests, "too_many_sessions", err.Error() + "; or retry later", 1}
	case errors.Is(err, session.ErrCapacity):
		return &apiError{http.StatusTooManyRequests, "too_many_sessions", "the server holds as many sessions as it may: delete one or retry later", 1}
	case errors.Is(err, session.ErrBusy):
		return &apiError{http.StatusConflict, "busy", err.Error(), 0}
	case errors.Is(err, session.ErrRestartRequired):
		return &apiError{http.StatusConflict, "restart_required", err.Error() + ": POST /v1/sessions/{id}/restart", 0}
	case errors.Is(err, session.ErrClosed):
		return &apiError{http.StatusNotFound, "not_found", "the session was closed", 0}
	case errors.Is(err, session.ErrTmpUnreachable):
		return &apiError{http.StatusNotImplemented, "unsupported", err.Error(), 0}
	case errors.Is(err, context.Canceled):
		return &apiError{499, "canceled", "the request was canceled", 0}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{http.StatusGatewayTimeout, "timeout", err.Error(), 0}
	}
	return &apiError{http.StatusInternalServerError, "internal", err.Error(), 0}
}

func writeError(w http.ResponseWriter, err error) {
	ae := toAPIError(err)
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	WriteJSON(w, ae.Status, map[string]any{"error": map[string]string{"code": ae.Code, "message": ae.Message}})
}

// WriteJSON writes v as the JSON answer with status (HTML characters not
// escaped), as serve and the gateway answer.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// decodeJSON reads a JSON body strictly: unknown fields and wrong types
// are errors that name the field.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &mbe):
			return err
		case errors.As(err, &te):
			return badRequest("field %q must be %s, not %s", te.Field, te.Type.String(), te.Value)
		case errors.As(err, &se):
			return badRequest("malformed JSON at byte %d: %v", se.Offset, err)
		case err.Error() == "EOF":
			return badRequest("empty body: send a JSON object")
		}
		return badRequest("invalid JSON: %v", err)
	}
	if dec.More() {
		return badRequest("trailing data after the JSON object")
	}
	return nil
}
