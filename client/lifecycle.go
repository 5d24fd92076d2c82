package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// A session's lifecycle: pause and resume, checkpoints and undo, fork.

// Checkpoint is a session's exact state at one moment, kept in memory on
// the server: the kernel's memory (variables, imports, random state,
// execution count) and the workspace's files. Restoring it puts the
// session back there.
type Checkpoint struct {
	// ID is "cp1", "cp2", ... unique within the session.
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Auto: taken before an execution (a session with Checkpoints "auto");
	// the oldest automatic ones are dropped first.
	Auto           bool      `json:"auto"`
	CreatedAt      time.Time `json:"created_at"`
	ExecutionCount int       `json:"execution_count"`
	// MemoryBytes is the private memory its copy of the kernel holds now
	// (copy-on-write: it grows as the live session changes); FileBytes the
	// bytes of its files. Both are charged to the session.
	MemoryBytes int64 `json:"memory_bytes"`
	// MemoryMeasuredAt is when MemoryBytes was measured (zero: not yet):
	// the server measures at most once a second, not at every listing.
	MemoryMeasuredAt time.Time `json:"memory_measured_at,omitzero"`
	FileBytes        int64     `json:"file_bytes"`
	Files            int       `json:"files"`
	// NotCarried lists what the session held that a restore does not
	// bring back (threads, child processes).
	NotCarried []string `json:"not_carried,omitempty"`
	// Fresh marks the automatic checkpoint before the first cell of a
	// kernel no code had run in: it holds the files only; restoring it
	// starts a fresh kernel in a fresh sandbox, and it cannot be forked.
	Fresh bool `json:"fresh,omitempty"`
}

// Restored says what came back at a restore, an undo or a fork.
type Restored struct {
	// From is "checkpoint cp2", "undo", "fork of ID", "snapshot ID" or
	// "hibernation".
	From string `json:"from"`
	// Snapshot is the snapshot it came from, if it did.
	Snapshot string `json:"snapshot,omitempty"`
	Files    int    `json:"files"`
	// FilesBy, for a fork's child, is how it got the parent's files:
	// "overlay" (a read-only copy shared with its siblings, under a layer
	// of its own) or "copy".
	FilesBy string `json:"files_by,omitempty"`
	// Variables are those carried (a fork: those that serialized).
	Variables []string `json:"variables,omitempty"`
	// NotRestored lists what did not come back, each with the reason.
	NotRestored    []string `json:"not_restored,omitempty"`
	ExecutionCount int      `json:"execution_count"`
	// AsOf, for a session whose processes were lost (its keeper or the
	// server died), is when the snapshot it came back from was taken:
	// its variables are of then.
	AsOf time.Time `json:"as_of,omitzero"`
	// Lost says what did not come back beyond NotRestored (what was done
	// after AsOf); empty when nothing was.
	Lost string `json:"lost,omitempty"`
	// FilesAsOf, when set, is when its files are of, newer than its
	// variables (its workspace outlived its processes).
	FilesAsOf time.Time `json:"files_as_of,omitzero"`
}

// Pause freezes session id: it uses no CPU and keeps its memory. Any
// request to it (Execute, files, Resume) resumes it.
func (c *Client) Pause(ctx context.Context, id string) (*Session, error) {
	return c.sessionCall(ctx, http.MethodPost, c.sessionPath(id, "/pause"), nil)
}

// Resume thaws a paused session; a running one is left as it is.
func (c *Client) Resume(ctx context.Context, id string) (*Session, error) {
	return c.sessionCall(ctx, http.MethodPost, c.sessionPath(id, "/resume"), nil)
}

// Undo reverts session id's last execution, to its newest automatic
// checkpoint (a session created with Checkpoints "auto"), which is then
// dropped. With nothing to undo it returns an *APIError with status 409.
func (c *Client) Undo(ctx context.Context, id string) (*Restored, error) {
	s, err := c.sessionCall(ctx, http.MethodPost, c.sessionPath(id, "/undo"), nil)
	if err != nil {
		return nil, err
	}
	return s.Restored, nil
}

// Checkpoint takes a checkpoint of session id, named name (which may be
// empty).
func (c *Client) Checkpoint(ctx context.Context, id, name string) (*Checkpoint, error) {
	in := struct {
		Name string `json:"name,omitempty"`
	}{name}
	var cp Checkpoint
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/checkpoints"), nil, in, &cp); err != nil {
		return nil, err
	}
	return &cp, nil
}

// Checkpoints lists session id's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]Checkpoint, error) {
	var out struct {
		Checkpoints []Checkpoint `json:"checkpoints"`
	}
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, "/checkpoints"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Checkpoints, nil
}

// RestoreCheckpoint puts session id back exactly at checkpoint cid: its
// variables and its files (those written since are removed, those deleted
// come back). The checkpoint is kept, so it can be restored again.
func (c *Client) RestoreCheckpoint(ctx context.Context, id, cid string) (*Restored, error) {
	s, err := c.sessionCall(ctx, http.MethodPost, c.sessionPath(id, "/checkpoints/"+url.PathEscape(cid)+"/restore"), nil)
	if err != nil {
		return nil, err
	}
	return s.Restored, nil
}

// DeleteCheckpoint drops checkpoint cid of session id.
func (c *Client) DeleteCheckpoint(ctx context.Context, id, cid string) error {
	return c.doJSON(ctx, http.MethodDelete, c.sessionPath(id, "/checkpoints/"+url.PathEscape(cid)), nil, nil, nil)
}

// Fork makes count new sessions (0 means 1), each with session id's
// variables and files, or those of its checkpoint if checkpoint is not
// empty. Each is a session of its own, as isolated as any; the parent
// keeps running. Restored says what came across: variables that do not
// serialize are listed in NotRestored.
func (c *Client) Fork(ctx context.Context, id string, count int, checkpoint string) ([]Session, *Restored, error) {
	in := struct {
		Count      int    `json:"count,omitempty"`
		Checkpoint string `json:"checkpoint,omitempty"`
	}{count, checkpoint}
	var out struct {
		Sessions []Session `json:"sessions"`
		Restored *Restored `json:"restored"`
	}
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/fork"), nil, in, &out); err != nil {
		return nil, nil, err
	}
	return out.Sessions, out.Restored, nil
}

func (c *Client) sessionCall(ctx context.Context, method, path string, in any) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, method, path, nil, in, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
