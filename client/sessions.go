package client

import (
	"context"
	"net/http"
	"time"
)

// CreateOptions are what a new session may ask for. Zero fields take the
// server's defaults; values above the server's maxima are refused
// (APIError code "limit_too_high"). A session that asks for nothing
// special comes from the warm pool.
type CreateOptions struct {
	// TimeoutS is the default timeout of the session's executions, in seconds.
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// MemoryMB caps the session's memory (at least 16).
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// CPUs caps the session's CPU time, in CPUs (0.5 is half of one).
	CPUs float64 `json:"cpus,omitempty"`
	// Pids caps the session's processes and threads (at least 8).
	Pids int `json:"pids,omitempty"`
	// Env is added to the kernel's environment.
	Env map[string]string `json:"env,omitempty"`
	// Network gives the session the host's network; only servers started
	// with --allow-network accept it.
	Network bool `json:"network,omitempty"`
	// Checkpoints "auto" takes a checkpoint before every execution (the
	// last few are kept), so Undo reverts the last one; "off" takes none
	// unless asked. If empty, the server's default.
	Checkpoints string `json:"checkpoints,omitempty"`
	// NetworkMode, if set, is "none", "allow" or "host" (it overrides
	// Network): see docs/network.md.
	NetworkMode string `json:"-"`
	// Allow is the allowlist of allow mode (a list alone asks for allow
	// mode). Nil: the server's default list; empty (not nil) with
	// NetworkMode "allow": nothing, until UpdateNetwork opens it.
	Allow []string `json:"-"`
	// PublicPorts lets anyone who reaches the server reach the servers the
	// session's code starts (see Client.Ports), with no token.
	PublicPorts bool `json:"public_ports,omitempty"`
	// Snapshot, if set, is the id of one of the caller's snapshots (see
	// Client.Snapshot) the session starts from: its files exactly, then
	// its variables. Session.Restored says what came back.
	Snapshot string `json:"snapshot,omitempty"`
}

// Session describes a session.
type Session struct {
	ID string `json:"id"`
	// Status is "ready" or "restart_required" (the kernel died; see
	// Message, and call Restart).
	Status     string    `json:"status"`
	Message    string    `json:"message,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	TimeoutS   float64   `json:"timeout_s"`
	MemoryMB   int64     `json:"memory_mb"`
	CPUs       float64   `json:"cpus"`
	Pids       int       `json:"pids"`
	Network    bool      `json:"network"`
	// NetworkMode is "none", "allow" or "host"; Allow is the allowlist in
	// force in allow mode (presets expanded; empty when it lists nothing).
	NetworkMode string   `json:"network_mode"`
	Allow       []string `json:"allow,omitempty"`
	// FromPool reports that the session took a kernel from the warm pool.
	FromPool bool `json:"from_pool"`
	// State is "running", "paused" (see Pause) or "hibernated" (on
	// storage only; the next request restores it: see Hibernate).
	State string `json:"state"`
	// Restored says what came back at the session's last restore, undo
	// or fork (a fork's child: from its parent); nil if none.
	Restored *Restored `json:"restored,omitempty"`
	// PublicPorts: see CreateOptions.
	PublicPorts bool `json:"public_ports"`
}

// CreateSession starts a session. When the server is full it returns an
// *APIError with StatusCode 429 and RetryAfter set.
func (c *Client) CreateSession(ctx context.Context, opts *CreateOptions) (*Session, error) {
	if opts == nil {
		opts = &CreateOptions{}
	}
	var s Session
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sessions", nil, opts, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetSession describes session id.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, ""), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSessions returns the caller's sessions, oldest first.
func (c *Client) ListSessions(ctx context.Context) ([]Session, error) {
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sessions", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Sessions, nil
}

// DeleteSession closes session id: its kernel is killed and its workspace removed.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, c.sessionPath(id, ""), nil, nil, nil)
}

// Interrupt interrupts session id's running execution (which then ends
// with status "interrupted"); the session's state survives.
func (c *Client) Interrupt(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/interrupt"), nil, nil, nil)
}

// Restart starts session id's kernel afresh: its variables are gone, its
// workspace stays.
func (c *Client) Restart(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/restart"), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
