package mcpserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/tools"
)

// The lifecycle tools (checkpoint, undo, fork_session) over a connection's
// session.

// checkpointSession is a Session with checkpoints (*session.Session and
// *session.Managed have them).
type checkpointSession interface {
	Checkpoint(ctx context.Context, name string) (*session.Checkpoint, error)
	RestoreCheckpoint(ctx context.Context, id string) (*session.Restored, error)
	Undo(ctx context.Context) (*session.Restored, error)
}

// Forker is a SessionSource that can copy a session, for fork_session: a
// new session with parent's variables and files. Without it the tool is
// not offered.
type Forker interface {
	Fork(ctx context.Context, parent Session) (Session, *tools.Restored, error)
}

// identified is a Session with an id (fork_session names the sessions).
type identified interface{ ID() string }

func sessionID(s Session) string {
	if i, ok := s.(identified); ok {
		return i.ID()
	}
	return fmt.Sprintf("%p", s)
}

func toolsRestored(r *session.Restored) *tools.Restored {
	if r == nil {
		return &tools.Restored{From: "unknown"}
	}
	return &tools.Restored{From: r.From, Files: r.Files, Variables: r.Variables, NotRestored: r.NotRestored, ExecutionCount: r.ExecutionCount, Lost: r.Lost}
}

// Checkpoint takes a checkpoint of the connection's session, making it
// first if need be.
func (c *callSession) Checkpoint(ctx context.Context, name string) (*tools.Checkpoint, error) {
	sess, err := c.awake(ctx)
	if err != nil {
		return nil, err
	}
	cs, ok := sess.(checkpointSession)
	if !ok {
		return nil, errors.New("this server's sessions cannot take checkpoints")
	}
	k, err := cs.Checkpoint(ctx, name)
	if err != nil {
		return nil, err
	}
	return &tools.Checkpoint{ID: k.ID, Name: k.Name, ExecutionCount: k.ExecutionCount, MemoryBytes: k.MemoryBytes,
		FileBytes: k.FileBytes, Files: k.Files, NotCarried: k.NotCarried}, nil
}

// Restore restores checkpoint id, or undoes the last execution.
func (c *callSession) Restore(ctx context.Context, id string) (*tools.Restored, error) {
	sess := c.s.existing(c.req.Session)
	if sess == nil {
		return nil, errors.New("nothing to undo: no code has run in this session yet")
	}
	cs, ok := sess.(checkpointSession)
	if !ok {
		return nil, errors.New("this server's sessions have no checkpoints")
	}
	var r *session.Restored
	var err error
	if id == "" {
		r, err = cs.Undo(ctx)
	} else {
		r, err = cs.RestoreCheckpoint(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	return toolsRestored(r), nil
}

// Fork makes a copy of the connection's session and continues in it; the
// session left is kept (and closed with the connection).
func (c *callSession) Fork(ctx context.Context) (child, parent string, r *tools.Restored, err error) {
	f, ok := c.s.src.(Forker)
	if !ok {
		return "", "", nil, errors.New("this server cannot fork sessions")
	}
	return c.continueIn(ctx, "fork_session", func(cur Session) (Session, *tools.Restored, error) { return f.Fork(ctx, cur) })
}

// continueIn makes the connection continue in the session next returns
// (made from its current one); the session left is kept (and closed with
// the connection). again is the tool to call again when another call
// changed the connection's session meanwhile.
func (c *callSession) continueIn(ctx context.Context, again string, next func(cur Session) (Session, *tools.Restored, error)) (child, parent string, r *tools.Restored, err error) {
	s := c.s
	cur, err := s.session(ctx, c.req.Session)
	if err != nil {
		return "", "", nil, err
	}
	cn := s.conn(c.req.Session)
	if cn == nil {
		return "", "", nil, ErrClosed
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.gone || cn.sess != cur {
		return "", "", nil, errors.New("the session changed meanwhile; call " + again + " again")
	}
	kid, r, err := next(cur)
	if err != nil {
		return "", "", nil, err
	}
	cn.kept = append(cn.kept, cur)
	cn.sess = kid
	return sessionID(kid), sessionID(cur), r, nil
}

// SwitchTo makes the kept session id the connection's current one; the
// current one is kept in its place.
func (c *callSession) SwitchTo(ctx context.Context, id string) error {
	cn := c.s.conn(c.req.Session)
	if cn == nil {
		return ErrClosed
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.sess != nil && sessionID(cn.sess) == id {
		return nil
	}
	var ids []string
	for i, k := range cn.kept {
		if sessionID(k) == id {
			if cn.sess != nil {
				cn.kept[i] = cn.sess
			} else {
				cn.kept = append(cn.kept[:i], cn.kept[i+1:]...)
			}
			cn.sess = k
			return nil
		}
		ids = append(ids, sessionID(k))
	}
	if len(ids) == 0 {
		return &tools.ArgumentError{Name: "switch_to", Err: fmt.Errorf("no session %q to switch to: fork_session has not left any", id)}
	}
	return &tools.ArgumentError{Name: "switch_to", Err: fmt.Errorf("no session %q to switch to; the sessions you left are %v", id, ids)}
}

// Snapshotter is a SessionSource that keeps durable snapshots, for the
// snapshot tool. Without it (or while KeepsSnapshots is false) the tool
// is not offered.
type Snapshotter interface {
	KeepsSnapshots() bool
	// Snapshot writes sess to durable storage, named name.
	Snapshot(ctx context.Context, sess Session, name string) (*tools.Snapshot, error)
	// FromSnapshot starts a new session from snapshot id.
	FromSnapshot(ctx context.Context, id string) (Session, *tools.Restored, error)
}

// Snapshot writes the connection's session (made first if need be) to
// durable storage.
func (c *callSession) Snapshot(ctx context.Context, name string) (*tools.Snapshot, error) {
	sn, ok := c.s.src.(Snapshotter)
	if !ok {
		return nil, errors.New("this server keeps no snapshots")
	}
	sess, err := c.s.session(ctx, c.req.Session)
	if err != nil {
		return nil, err
	}
	return sn.Snapshot(ctx, sess, name)
}

// FromSnapshot starts a new session from snapshot id and continues in it;
// the session left is kept, as fork_session keeps it.
func (c *callSession) FromSnapshot(ctx context.Context, id string) (child, parent string, r *tools.Restored, err error) {
	sn, ok := c.s.src.(Snapshotter)
	if !ok {
		return "", "", nil, errors.New("this server keeps no snapshots")
	}
	return c.continueIn(ctx, "snapshot", func(Session) (Session, *tools.Restored, error) { return sn.FromSnapshot(ctx, id) })
}
