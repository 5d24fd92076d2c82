package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Hibernation frees an idle session's processes and files and keeps it on
// storage only: its files and variables are written to the snapshot store
// as a held snapshot (retention leaves it alone), then its kernel is
// killed, its checkpoints dropped and its workspace emptied. The session
// keeps its id, owner, limits, network and notebook. The next call that
// needs it (Execute, Files, Lease, Resume: any request) wakes it: a new
// kernel in the same jail settings, the snapshot's files and variables
// loaded, the held snapshot deleted; Session.Restored (and the wake's
// report) says what came back, so a client is never misled: what did not
// serialize is gone, and the kernel's other state (imports done, threads,
// child processes such as a server a cell started) is not carried.
//
// A Manager hibernates sessions unused past ManagerOptions.IdleHibernate,
// and paused ones (an E2B sandbox paused by its owner or by its lifecycle's
// onTimeout "pause") paused that long: a pause keeps memory, a hibernation
// keeps nothing but storage, so a long pause is moved to storage. A wake
// that fails (the storage unreachable, the snapshot corrupted) leaves the
// session hibernated and says why; a hibernated session is closed after
// ManagerOptions.PausedTimeout unused, and closing it deletes its snapshot.

// StateHibernated is the state of a hibernated session (State).
const StateHibernated = "hibernated"

// hibernation is a session's hibernated state.
type hibernation struct {
	mu    sync.Mutex   // one hibernate or wake at a time
	on    atomic.Bool  // hibernated (written under mu)
	snap  *hibernating // under mu; nil when awake
	since time.Time    // under mu
}

type hibernating struct {
	store *snapshot.Store
	owner string
	m     *snapshot.Manifest // nil: a session lost before its first snapshot (durable.go)
	// keep: the wake leaves the snapshot in the store (the manager's
	// durable records name it until a newer one replaces it).
	keep bool
	// from, asOf and lost say, in Restored, what the snapshot is: ""
	// for a hibernation (nothing lost); an automatic snapshot of a
	// session whose processes were lost says what was lost.
	from, lost string
	asOf       time.Time
	// usedAt is the first use after m (zero: none), for a lost session.
	usedAt time.Time
	// filesAsOf: m's files are of then, newer than its variables (asOf):
	// a lost session's workspace salvaged (salvaged).
	filesAsOf time.Time
}

// salvaged is h for a lost session whose workspace survived its
// processes (the keeper died, the host did not): man, written from that
// workspace and h's snapshot's variables (salvageWorkspace), replaces h's
// snapshot. Its files are as of the loss, its variables as of h's.
func (h *hibernating) salvaged(man *snapshot.Manifest) *hibernating {
	n := &hibernating{store: h.store, owner: h.owner, m: man, keep: true, asOf: h.asOf, filesAsOf: man.CreatedAt,
		from: "the automatic snapshot " + man.ID + " (the session's processes were lost)"}
	switch {
	case h.m == nil:
		n.lost = "its variables: its processes were lost before its first snapshot (its files were kept as they were)"
	case !h.usedAt.IsZero():
		n.lost = fmt.Sprintf("the variables set after %s (it was used from %s until its processes were lost; its files were kept as they were)",
			h.asOf.UTC().Format(time.RFC3339), h.usedAt.UTC().Format(time.RFC3339))
	case h.lost != "":
		n.lost = h.lost // its snapshot was a salvage: what that lacked
	}
	return n
}

// salvageWorkspace writes a held automatic snapshot of a lost session's
// workspace as it is, with the variables of h's snapshot (its state
// stream copied: its chunks are stored once), for sleepLost. The caller
// holds the turn; the kernel is dead.
func (s *Session) salvageWorkspace(ctx context.Context, h *hibernating) (*snapshot.Manifest, error) {
	return salvageDir(ctx, s.workspace, s.id, s.templateName(), h)
}

// salvageDir is salvageWorkspace of session id (of template tmpl) whose
// workspace is dir.
func salvageDir(ctx context.Context, dir, id, tmpl string, h *hibernating) (*snapshot.Manifest, error) {
	ws, err := OpenWorkspace(dir, workspace.Options{})
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	o := &snapshot.WriteOptions{Session: id, Name: autoSnapshotName, Held: true, Template: tmpl}
	if old := h.m; old != nil && old.State != nil {
		o.State = func(ctx context.Context, w io.Writer) (any, error) {
			rc, _, err := h.store.OpenState(ctx, h.owner, old.ID)
			if err != nil {
				return nil, err
			}
			if rc == nil {
				return nil, fmt.Errorf("snapshot %s has no variables to carry over", old.ID)
			}
			defer rc.Close()
			if _, err := io.Copy(w, rc); err != nil {
				return nil, err
			}
			return old.State.Manifest, nil
		}
	}
	return h.store.Write(ctx, h.owner, snapshot.WorkspaceSource(ws), o)
}

// Hibernated says whether the session is hibernated.
func (s *Session) Hibernated() bool { return s.hib.on.Load() }

// hibernate writes the session to st for owner and frees its processes and
// files. It fails with ErrBusy while a call holds the session (an
// execution), as Pause does; hibernating a hibernated session does nothing.
func (s *Session) hibernate(ctx context.Context, st *snapshot.Store, owner string, keep bool, reason string) (*snapshot.Manifest, error) {
	s.stopRemaps() // as Pause
	select {
	case s.turn <- struct{}{}:
	default:
		return nil, ErrBusy
	}
	defer s.release()
	s.hib.mu.Lock()
	defer s.hib.mu.Unlock()
	if s.hib.snap != nil {
		return s.hib.snap.m, nil
	}
	if err := s.Resume(); err != nil { // a paused kernel answers nothing
		return nil, err
	}
	m, err := s.writeSnapshot(ctx, st, owner, "hibernation", true)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if err := st.Delete(ctx, owner, m.ID); err != nil {
			s.log.Warn("delete the snapshot of a session closed while it hibernated", "snapshot", m.ID, "err", err)
		}
		return nil, ErrClosed
	}
	k := s.k
	s.mu.Unlock()
	s.dropWarm()
	k.Retire("the session hibernated")
	k.Close()
	if err := s.closeCheckpoints(); err != nil {
		s.log.Warn("hibernate: remove the checkpoint store", "err", err)
	}
	if err := s.clearWorkspace(); err != nil {
		// The files are safe in the snapshot; what is left holds memory
		// until the wake replaces it.
		s.log.Warn("hibernate: empty the workspace", "err", err)
	}
	s.hib.snap = &hibernating{store: st, owner: owner, m: m, keep: keep}
	s.hib.since = time.Now()
	s.hib.on.Store(true)
	s.note(Event{Type: EventHibernated, Reason: reason, Snapshot: m.ID})
	s.log.Info("session hibernated", "snapshot", m.ID, "bytes", m.TotalBytes)
	return m, nil
}

// sleepOn makes the session hibernated on h (the caller holds hib.mu, or
// the session is not shared yet).
func (s *Session) sleepOn(h *hibernating) {
	s.hib.snap = h
	s.hib.since = time.Now()
	s.hib.on.Store(true)
}

// sleepLost puts to sleep, in place, a session whose processes were lost
// (the keeper that held its jail died): its kernel is killed if it is not
// dead yet (an execution in flight ends "killed"), its checkpoints and
// workspace emptied, and the session is hibernated on h, what its latest
// snapshot brings back (lost, Manager.lostState, called under the turn).
// The next call wakes it.
// Its workspace outlived the keeper (a host directory): its files as they
// are, with h's variables, are written to a new automatic snapshot first
// (salvageWorkspace), which the session sleeps on instead: sleepLost
// returns that (h.salvaged), nil if none (the files could not be read or
// stored, and the session comes back from h's snapshot, as it says).
// Whoever holds the session (an E2B sandbox, a client's stream) keeps it:
// same id, owner, limits and network. q, if not nil, is its new
// workspace (the old one is named after the dead keeper: any sandloop
// starting sweeps it), swapped in while the session is asleep and holds
// its turn, and then q is the session's; on an error the caller removes q.
func (s *Session) sleepLost(ctx context.Context, lost func() (*hibernating, error), q *jail.QuotaDir) (*hibernating, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	k := s.k
	s.mu.Unlock()
	k.Retire("the session's processes were lost (the process that held them died)")
	if err := s.acquire(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	s.hib.mu.Lock()
	defer s.hib.mu.Unlock()
	if s.hib.snap != nil {
		return nil, nil // hibernated: its snapshot has it all
	}
	if s.isClosed() {
		return nil, ErrClosed
	}
	// Under the turn: an automatic snapshot that replaced the latest one
	// meanwhile has named its own (the one before is deleted).
	h, err := lost()
	if err != nil {
		return nil, err
	}
	// The kernel is dead and the turn ours: nothing in the sandbox
	// writes any more.
	var salvaged *hibernating
	if man, err := s.salvageWorkspace(ctx, h); err != nil {
		s.log.Warn("lost session: its files as they were could not be written to a snapshot; it comes back from its latest one",
			"err", err)
	} else {
		salvaged = h.salvaged(man)
		h = salvaged
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if salvaged != nil { // no record will name it
			if err := h.store.Delete(ctx, h.owner, salvaged.m.ID); err != nil {
				s.log.Warn("lost session closed meanwhile: delete its files' snapshot", "snapshot", salvaged.m.ID, "err", err)
			}
		}
		return nil, ErrClosed
	}
	k = s.k // a Restart may have replaced it meanwhile
	s.k = kernel.Gone("the session is asleep: its next use restores it")
	s.paused.Store(false)
	oldQuota := s.quota
	if q != nil {
		s.workspace, s.quota = q.Path, q
	}
	s.mu.Unlock()
	k.Retire("the session's processes were lost (the process that held them died)")
	k.Close()
	if err := s.closeCheckpoints(); err != nil {
		s.log.Warn("lost session: remove the checkpoint store", "err", err)
	}
	if q != nil && oldQuota != nil {
		if err := oldQuota.Remove(); err != nil {
			s.log.Warn("lost session: remove the workspace of the dead keeper", "err", err)
		}
	} else if err := s.clearWorkspace(); err != nil {
		s.log.Warn("lost session: empty the workspace", "err", err)
	}
	s.sleepOn(h)
	s.noteLost("the process that held its kernel (the keeper) died", h)
	return salvaged, nil
}

func (s *Session) clearWorkspace() error {
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return err
	}
	defer ws.Close()
	return ws.Clear()
}

// wake restores a hibernated session on the same id and returns what came
// back (nil if it was not hibernated). On an error it stays hibernated.
func (s *Session) wake(ctx context.Context) (*Restored, error) {
	s.hib.mu.Lock()
	defer s.hib.mu.Unlock()
	h := s.hib.snap
	if h == nil {
		return nil, nil
	}
	if s.isClosed() {
		return nil, ErrClosed
	}
	// The snapshot's blobs are read (and verified) while the kernel starts.
	var rd *snapshot.Reading
	if h.m != nil {
		var err error
		if rd, err = h.store.Open(ctx, h.owner, h.m.ID); err != nil {
			return nil, s.wakeErr(h, err)
		}
		defer rd.Close()
	}
	k, err := s.start(ctx)
	if err != nil {
		return nil, fmt.Errorf("wake session %s: %w", s.id, err)
	}
	if err := s.install(k); err != nil {
		return nil, err
	}
	var res *Restored
	if rd != nil {
		res, err = s.loadSnapshot(ctx, rd, cmp.Or(h.from, "hibernation"))
	} else {
		res = &Restored{From: h.from}
	}
	if err != nil {
		k.Retire("the session's wake failed")
		if cerr := s.clearWorkspace(); cerr != nil {
			s.log.Warn("wake failed: empty the workspace", "err", cerr)
		}
		return nil, s.wakeErr(h, err)
	}
	s.hib.snap = nil
	s.hib.on.Store(false)
	if h.lost != "" || !h.asOf.IsZero() || !h.filesAsOf.IsZero() {
		res.Lost, res.AsOf, res.FilesAsOf = h.lost, h.asOf, h.filesAsOf
		s.setRestored(res)
		out := *res
		res = &out
	}
	s.noteRestored(Event{Type: EventWoken}, res)
	if h.m == nil {
		s.log.Info("session restarted empty: it was lost before its first snapshot")
		return res, nil
	}
	if !h.keep {
		if err := h.store.Delete(ctx, h.owner, h.m.ID); err != nil {
			s.log.Warn("delete the snapshot of a session woken", "snapshot", h.m.ID, "err", err)
		}
	}
	s.log.Info("session woke", "snapshot", h.m.ID, "variables", len(res.Variables), "not_restored", len(res.NotRestored))
	return res, nil
}

func (s *Session) wakeErr(h *hibernating, err error) error {
	var ce *snapshot.CorruptError
	if errors.As(err, &ce) {
		return fmt.Errorf("session %s cannot wake: %w", s.id, err)
	}
	return fmt.Errorf("wake session %s from snapshot %s: %w", s.id, h.m.ID, err)
}

// dropHibernation deletes the held snapshot of a session being closed.
func (s *Session) dropHibernation() error {
	s.hib.mu.Lock()
	defer s.hib.mu.Unlock()
	h := s.hib.snap
	if h == nil || h.m == nil || s.keepSnapshots.Load() {
		return nil
	}
	s.hib.snap = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.store.Delete(ctx, h.owner, h.m.ID); err != nil && !errors.Is(err, snapshot.ErrNotFound) {
		return fmt.Errorf("delete the snapshot of hibernated session %s: %w", s.id, err)
	}
	return nil
}

// Hibernate writes the session to the manager's snapshot store and frees
// its processes and files (see hibernation above). It fails with ErrBusy
// while the session is in use, ErrNoSnapshots without a store.
func (m *Managed) Hibernate(ctx context.Context) (*snapshot.Manifest, error) {
	return m.hibernate(ctx, "asked for")
}

// hibernate is Hibernate, its event saying reason.
func (m *Managed) hibernate(ctx context.Context, reason string) (*snapshot.Manifest, error) {
	st := m.mgr.opts.Snapshots
	if st == nil {
		return nil, ErrNoSnapshots
	}
	m.mu.Lock()
	busy := m.busy > 0
	m.mu.Unlock()
	if busy {
		return nil, ErrBusy
	}
	man, err := m.Session.hibernate(ctx, st, m.Owner, m.durable != nil, reason)
	if err != nil {
		return nil, err
	}
	m.hibernated(man)
	if m.mgr.opts.OnSnapshot != nil {
		m.mgr.opts.OnSnapshot(m.ID(), man.ID)
	}
	return man, nil
}

// Wake restores a hibernated session and returns what came back; nil if
// it was not hibernated (Session.Restored still says what came back at
// its latest restore). It counts as a use.
func (m *Managed) Wake(ctx context.Context) (*Restored, error) {
	m.Touch()
	res, err := m.Session.wake(ctx)
	if err == nil && res != nil {
		m.woke(ctx, res)
	}
	return res, err
}

// hibernateIdle hibernates the sessions the reaper picked, two at a time
// (each writes its files and variables to storage); one that fails is
// not tried again for IdleHibernate, and is closed at IdleTimeout as any.
func (m *Manager) hibernateIdle(list []*Managed) {
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, ms := range list {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), snapshotDeadline)
			defer cancel()
			_, err := ms.hibernate(ctx, fmt.Sprintf("idle for longer than the server's hibernation delay (%s)", m.opts.IdleHibernate))
			switch {
			case err == nil:
				m.log.Info("session hibernated", "session", ms.ID(), "reason", "idle")
			case errors.Is(err, ErrBusy), errors.Is(err, ErrClosed):
			default:
				m.log.Warn("hibernating an idle session failed", "session", ms.ID(), "err", err)
				ms.mu.Lock()
				ms.hibFailed = time.Now()
				ms.mu.Unlock()
			}
		})
	}
	wg.Wait()
}
