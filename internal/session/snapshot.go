package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Durable snapshots (issue 28): a session's files, exactly, and its
// kernel's variables as far as they serialize, written to the manager's
// snapshot store (package snapshot: a directory or S3, content-addressed,
// deduplicated, atomic, checksummed on read). A snapshot outlives its
// session and its host; a new session starts from one (CreateOptions.
// Snapshot), and a hibernated session (hibernate.go) is one.
//
// A snapshot holds the session's turn while it is written: its files and
// its variables are of the same moment (no cell runs between them). Not
// kept: what a checkpoint does not carry (threads, child processes), the
// variables that do not serialize (listed with the reason in the
// manifest's state: not_saved), FIFOs and devices of the workspace.

// ErrNoSnapshots: the manager has no snapshot store.
var ErrNoSnapshots = errors.New("this server keeps no snapshots")

// maxSnapshotName caps a snapshot's name, in characters.
const maxSnapshotName = 200

// Snapshots is the manager's snapshot store (nil if it has none).
func (m *Manager) Snapshots() *snapshot.Store { return m.opts.Snapshots }

// Snapshot writes owner's session id (its files and its kernel's
// variables) to the snapshot store, named name (may be empty). It waits
// for a running execution to end; a paused session is resumed for it.
func (m *Manager) Snapshot(ctx context.Context, owner, id, name string) (*snapshot.Manifest, error) {
	if m.opts.Snapshots == nil {
		return nil, ErrNoSnapshots
	}
	if n := utf8.RuneCountInString(name); n > maxSnapshotName || !utf8.ValidString(name) {
		return nil, &ArgumentError{"name", fmt.Errorf("at most %d characters of UTF-8, not %d", maxSnapshotName, n)}
	}
	ms, err := m.Get(owner, id)
	if err != nil {
		return nil, err
	}
	release, err := ms.use()
	if err != nil {
		return nil, err
	}
	defer release()
	if err := ms.Session.acquireRunning(ctx); err != nil {
		return nil, err
	}
	defer ms.Session.release()
	man, err := ms.Session.writeSnapshot(ctx, m.opts.Snapshots, owner, name, false)
	if err != nil {
		return nil, err
	}
	ms.note(Event{Type: EventSnapshot, Snapshot: man.ID, Reason: "asked for"})
	if m.opts.OnSnapshot != nil {
		m.opts.OnSnapshot(ms.ID(), man.ID)
	}
	return man, nil
}

// writeSnapshot writes the session to st, under its turn (held by the
// caller), the kernel running.
func (s *Session) writeSnapshot(ctx context.Context, st *snapshot.Store, owner, name string, held bool) (*snapshot.Manifest, error) {
	kc, err := s.liveCheckpoints()
	if err != nil {
		return nil, err
	}
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	man, err := st.Write(ctx, owner, snapshot.WorkspaceSource(ws), &snapshot.WriteOptions{
		Session: s.id, Name: name, Held: held, Template: s.templateName(),
		State: func(ctx context.Context, w io.Writer) (any, error) {
			sm, err := kc.ExportState(ctx, w, 0)
			if err != nil {
				return nil, s.kernelErr("export its variables", err)
			}
			return sm, nil
		},
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("session snapshot written", "snapshot", man.ID, "files", len(man.Files), "new_bytes", man.NewBytes)
	return man, nil
}

// loadSnapshot puts the snapshot rd reads into the session: its files into
// the workspace (replacing entries of the same names), then its variables
// into the kernel, their blobs read ahead meanwhile. The caller holds the
// turn (or the session is not yet anyone's). On an error the session may
// hold part of it: callers discard the session (a new one) or clear it
// again (a wake).
func (s *Session) loadSnapshot(ctx context.Context, rd *snapshot.Reading, from string) (*Restored, error) {
	k, err := s.kernel()
	if err != nil {
		return nil, err
	}
	kc := checkpointsOf(k)
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return nil, err
	}
	man := rd.Manifest()
	t0 := time.Now()
	fr, err := rd.Restore(ctx, ws)
	ws.Close()
	snapshotStage("load-files", t0)
	if err != nil {
		return nil, err
	}
	res := &Restored{From: from, Files: fr.Files, Snapshot: man.ID}
	if rc := rd.State(); rc != nil {
		r := &errReader{r: rc}
		t0 = time.Now()
		imported, err := kc.ImportState(ctx, r)
		rc.Close()
		snapshotStage("load-state", t0)
		if r.err != nil && !errors.Is(r.err, io.EOF) {
			return nil, r.err // a corrupt chunk: say so, not what the kernel made of it
		}
		if err != nil {
			return nil, s.kernelErr("import the variables of "+man.ID, err)
		}
		res.Variables, res.ExecutionCount = imported.Variables, imported.ExecutionCount
		said := map[string]bool{}
		var exported stateManifest
		if man.State != nil && len(man.State.Manifest) > 0 {
			_ = json.Unmarshal(man.State.Manifest, &exported) // written by ExportState; best effort
		}
		for _, ns := range append(append([]notSaved(nil), imported.NotSaved...), exported.NotSaved...) {
			if !said[ns.Name] {
				said[ns.Name] = true
				res.NotRestored = append(res.NotRestored, ns.Name+": "+ns.Reason)
			}
		}
	}
	s.setRestored(res)
	out := *res
	return &out, nil
}

// snapshotStageHook, if set (by benchmarks), is told how long each stage
// of a restore took: "open" (the manifest read, the reading started),
// "create" (the new session), "load-files", "load-state" (the kernel's
// import, reading the state as it goes).
var snapshotStageHook func(stage string, d time.Duration)

func snapshotStage(stage string, since time.Time) {
	if h := snapshotStageHook; h != nil {
		h(stage, time.Since(since))
	}
}

// errReader keeps the first error of r other than io.EOF.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// fromSnapshot loads the snapshot rd reads into ms, a session Create
// just made.
func (m *Manager) fromSnapshot(ctx context.Context, ms *Managed, rd *snapshot.Reading) error {
	defer ms.Lease()()
	if err := ms.Session.acquireRunning(ctx); err != nil {
		return err
	}
	defer ms.Session.release()
	id := rd.Manifest().ID
	_, err := ms.Session.loadSnapshot(ctx, rd, "snapshot "+id)
	return err
}

// openSnapshot starts reading owner's snapshot id for a new session,
// before its kernel is started (which the reading overlaps): an error if
// owner may not start a session from it.
func (m *Manager) openSnapshot(ctx context.Context, owner, id string) (*snapshot.Reading, error) {
	if m.opts.Snapshots == nil {
		return nil, ErrNoSnapshots
	}
	return m.opts.Snapshots.Open(ctx, owner, id)
}

// Summary says in one line what came back: "files exact (3 files);
// variables restored: df, model; not restorable: conn (...)". It is what
// the Sandloop-Restored header and the restored event carry.
func (r *Restored) Summary() string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	if r.FilesAsOf.IsZero() {
		fmt.Fprintf(&b, "from %s: files exact (%d files)", r.From, r.Files)
	} else {
		fmt.Fprintf(&b, "from %s: files exact as of %s (%d files)", r.From, r.FilesAsOf.UTC().Format(time.RFC3339), r.Files)
	}
	if len(r.Variables) > 0 {
		b.WriteString("; variables restored: " + strings.Join(r.Variables, ", "))
	} else {
		b.WriteString("; no variables restored")
	}
	if len(r.NotRestored) > 0 {
		b.WriteString("; not restorable: " + strings.Join(r.NotRestored, "; "))
	}
	switch {
	case !r.AsOf.IsZero() && !r.FilesAsOf.IsZero():
		b.WriteString("; variables as of " + r.AsOf.UTC().Format(time.RFC3339))
	case !r.AsOf.IsZero():
		b.WriteString("; as of " + r.AsOf.UTC().Format(time.RFC3339))
	}
	if r.Lost != "" {
		b.WriteString("; lost: " + r.Lost)
	}
	return b.String()
}

// snapshotDeadline bounds a snapshot or a wake started by the manager
// itself (hibernation), not by a request with its own deadline.
const snapshotDeadline = 10 * time.Minute

// maintainLoop enforces the snapshot store's retention and collects its
// garbage every interval, until the manager closes.
func (m *Manager) maintainLoop(interval time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		go func() { // a maintenance under way stops with the manager
			select {
			case <-m.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		res, err := m.opts.Snapshots.Maintain(ctx, time.Now())
		cancel()
		if err != nil {
			m.log.Warn("snapshot maintenance", "err", err)
			continue
		}
		if len(res.Expired) > 0 {
			m.log.Info("snapshots expired", "count", len(res.Expired))
		}
	}
}
