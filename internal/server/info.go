package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sandloop/sandloop/internal/llm"
)

// Info is what GET /v1/info answers: what a client such as the web UI
// needs to know of the server before the user asks it for anything.
type Info struct {
	// TokenRequired says the server accepts requests only with a token
	// (a caller without one gets 401 here, as everywhere else).
	TokenRequired bool     `json:"token_required"`
	Runs          RunsInfo `json:"runs"`
}

// RunsInfo says whether the server runs agents and with which model.
type RunsInfo struct {
	Enabled bool `json:"enabled"`
	// Model is the model of runs that name none, as PROVIDER/MODEL.
	Model string `json:"model,omitempty"`
	// ModelError says why there is no such model and how to configure one.
	ModelError string `json:"model_error,omitempty"`
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	in := Info{TokenRequired: len(s.tokens) > 0}
	if s.opts.Runs != nil && s.opts.Store != nil {
		in.Runs.Enabled = true
		// Finding the default may probe a local model server: bounded.
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if m, err := s.opts.Runs.DefaultModel(ctx); err != nil {
			in.Runs.ModelError = ModelProblem(err)
		} else {
			in.Runs.Model = m.String()
		}
	}
	WriteJSON(w, http.StatusOK, in)
}

// ModelProblem says why runs have no usable default model (err from
// resolving it) and, where none is configured, how to configure one. serve
// prints the same words at start.
func ModelProblem(err error) string {
	var nm *llm.NoModelError
	if errors.As(err, &nm) {
		return "no model configured: set SANDLOOP_MODEL or --model"
	}
	return "the model cannot be used: " + err.Error()
}
