package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Durable snapshots: a session's files exactly and its variables as far
// as they serialize, kept in the server's snapshot store after the session
// (and the server's host) is gone. CreateOptions.Snapshot starts a session
// from one.

// Snapshot describes a durable snapshot.
type Snapshot struct {
	ID        string    `json:"id"` // snap-...
	Name      string    `json:"name,omitempty"`
	Session   string    `json:"session,omitempty"` // the session it was taken of
	CreatedAt time.Time `json:"created_at"`
	// Hibernation: a hibernated session's (deleted when it wakes).
	Hibernation bool `json:"hibernation,omitempty"`
	Files       int  `json:"files"`
	// TotalBytes is what it holds uncompressed; StoredBytes compressed
	// (blobs shared with other snapshots included); NewBytes what this
	// one wrote, the rest being stored already.
	TotalBytes  int64 `json:"total_bytes"`
	StoredBytes int64 `json:"stored_bytes"`
	NewBytes    int64 `json:"new_bytes"`
	// Variables are the names saved; NotRestorable those that did not
	// serialize, with the reason.
	Variables     []string       `json:"variables"`
	NotRestorable []NotSavedName `json:"not_restorable"`
	Serializer    string         `json:"serializer,omitempty"`
	// FileList is filled by GetSnapshot only.
	FileList []SnapshotFile `json:"file_list,omitempty"`
}

// NotSavedName is a variable a snapshot could not keep, and why.
type NotSavedName struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// SnapshotFile is one entry of a snapshot's workspace.
type SnapshotFile struct {
	Path   string `json:"path"`
	Type   string `json:"type"` // file, dir, symlink
	Size   int64  `json:"size,omitempty"`
	Mode   string `json:"mode"`
	Target string `json:"target,omitempty"`
}

// Snapshot writes a durable snapshot of session id, named name (may be
// empty). Over the server's --snapshot-quota it returns an *APIError with
// status 413 (code "snapshot_quota").
func (c *Client) Snapshot(ctx context.Context, id, name string) (*Snapshot, error) {
	in := struct {
		Name string `json:"name,omitempty"`
	}{name}
	var out Snapshot
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/snapshots"), nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Snapshots lists the caller's snapshots, newest first; of session id
// only if id is not empty.
func (c *Client) Snapshots(ctx context.Context, id string) ([]Snapshot, error) {
	p := "/v1/snapshots"
	if id != "" {
		p = c.sessionPath(id, "/snapshots")
	}
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot describes snapshot sid, with its file list.
func (c *Client) GetSnapshot(ctx context.Context, sid string) (*Snapshot, error) {
	var out Snapshot
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(sid), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSnapshot deletes snapshot sid.
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(sid), nil, nil, nil)
}

// RestoreSnapshot starts a new session from snapshot sid, with opts's
// limits (nil: the defaults). The session's Restored says what came back.
func (c *Client) RestoreSnapshot(ctx context.Context, sid string, opts *CreateOptions) (*Session, error) {
	o := CreateOptions{}
	if opts != nil {
		o = *opts
	}
	o.Snapshot = sid
	return c.CreateSession(ctx, &o)
}

// Hibernate writes session id to the snapshot store and frees its
// processes and files; the next request to it restores it on the same id.
func (c *Client) Hibernate(ctx context.Context, id string) (*Session, error) {
	return c.sessionCall(ctx, http.MethodPost, c.sessionPath(id, "/hibernate"), nil)
}
