package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
)

// networkUpdate is the body of PATCH /v1/sessions/{id}/network: the
// allowlist as create takes it, replacing the one in force.
type networkUpdate struct {
	Allow *[]string `json:"allow"`
}

// updateNetwork replaces a running session's egress allowlist. The new
// list is held to what the server allows, as at create. Its kernel's next
// connections are judged by it at once, and connections under way that it
// no longer allows are cut (egress.Gate.SetAllow). A session without a
// proxy (created with network "none", or "host") cannot get one live: its
// jail has no listener for it, so the answer is 409 saying how to create
// one that can.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var req networkUpdate
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Allow == nil {
		writeError(w, badRequest(`send {"allow": [...]}: the hosts the session may reach from now on ([] for none)`))
		return
	}
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	al, err := s.allowlist(*req.Allow)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := ms.SetAllowlist(al); err != nil {
		writeError(w, noAllowlist(ms, err))
		return
	}
	s.log.Info("session network updated", "session", ms.ID(), "allow", al.Entries())
	WriteJSON(w, http.StatusOK, toSessionJSON(ms))
}

// allowlist parses a list a caller sent and holds it to the server's
// maximum (an empty list allows nothing).
func (s *Server) allowlist(list []string) (*egress.Allowlist, error) {
	al, err := egress.ParseAllowlist(list)
	if err != nil {
		return nil, badRequest("allow: %v", err)
	}
	if err := al.Within(s.opts.Egress.Max); err != nil {
		return nil, &apiError{http.StatusForbidden, "network_not_allowed", "allow: " + err.Error(), 0}
	}
	return al, nil
}

// noAllowlist says why a session's allowlist cannot change.
func noAllowlist(ms *session.Managed, err error) error {
	if !errors.Is(err, session.ErrNoEgress) {
		return err
	}
	if ms.Network == jail.NetworkHost {
		return &apiError{http.StatusConflict, "no_allowlist", fmt.Sprintf("session %s has the host's network: it has no allowlist to change", ms.ID()), 0}
	}
	return &apiError{http.StatusConflict, "no_allowlist", fmt.Sprintf(`session %s was created with network "none": its sandbox has no egress proxy, and one cannot be added while it runs; `+
		`create the session with network "allow" and a list (`+"`"+`{"network": "allow", "allow": []}`+"`"+` starts with nothing allowed) to change it later`, ms.ID()), 0}
}
