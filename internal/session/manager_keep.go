package session

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// managedState is the manager's part of a kept session's record.
type managedState struct {
	Owner       string        `json:"owner"`
	Created     time.Time     `json:"created"`
	Limits      jail.Limits   `json:"limits"`
	Network     jail.Network  `json:"network,omitempty"`
	ExecTimeout time.Duration `json:"exec_timeout"`
	FromPool    bool          `json:"from_pool,omitempty"`
	PortAccess  PortAccess    `json:"port_access"`
	Template    string        `json:"template,omitempty"`
}

// keep hands a session just created to the keeper, if any. A session
// that cannot be kept still works (it is lost with this server): the
// failure is logged.
func (m *Manager) keep(ctx context.Context, ms *Managed) {
	if m.opts.Keeper == nil {
		return
	}
	extra, err := json.Marshal(&managedState{Owner: ms.Owner, Created: ms.Created, Limits: ms.Limits, Network: ms.Network,
		ExecTimeout: ms.ExecTimeout, FromPool: ms.FromPool, PortAccess: ms.PortAccess, Template: ms.Template})
	if err == nil {
		err = ms.Session.Keep(ctx, extra)
	}
	if err != nil {
		m.log.Warn("keeper: the session is not kept: it will not survive a restart of the server", "session", ms.ID(), "err", err)
	}
}

// KeptRecord is a session the keeper held for this server (keeper.Record).
type KeptRecord struct {
	ID    string
	Meta  []byte
	Files []*os.File
}

// Reattach takes over the sessions a server before this one handed to
// the keeper: the same ids, owners, limits, workspaces and kernels. It
// returns how many came back; those that could not are killed, dropped
// from the keeper and reported in the error. The records' files are
// Reattach's from now on.
func (m *Manager) Reattach(ctx context.Context, recs []KeptRecord) (int, error) {
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 16)
	)
	for _, r := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := m.reattach(ctx, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				if m.opts.Keeper != nil {
					_ = m.opts.Keeper.Drop(r.ID)
				}
				return
			}
			n++
		}()
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

func (m *Manager) reattach(ctx context.Context, r KeptRecord) error {
	var probe struct {
		Extra managedState `json:"extra"`
	}
	if err := json.Unmarshal(r.Meta, &probe); err != nil {
		closeFiles(r.Files)
		return err
	}
	st := probe.Extra
	tmpl, err := m.useTemplate(ctx, st.Template)
	if err != nil {
		closeFiles(r.Files)
		return err
	}
	s, _, err := Reattach(r.Meta, r.Files, &ReattachOptions{
		Keeper: m.opts.Keeper, EgressLookup: m.opts.EgressLookup, EgressCache: m.opts.EgressCache,
		MaxOutputBytes: m.opts.MaxOutputBytes, Logger: m.log,
		AutoCheckpoints: m.opts.AutoCheckpoints, MaxCheckpoints: m.opts.MaxCheckpoints, CheckpointMemory: m.opts.CheckpointMemory,
		Template: tmpl,
	})
	if err != nil {
		tmpl.release()
		return err
	}
	now := time.Now()
	ms := &Managed{Session: s, Owner: st.Owner, Created: st.Created, Limits: st.Limits, Network: st.Network, Egress: s.opts.Egress,
		ExecTimeout: st.ExecTimeout, FromPool: st.FromPool, PortAccess: st.PortAccess, Template: st.Template, mgr: m, lastUsed: now}
	var evs []Event
	ms.durable, evs = m.durableOf(s.ID())
	s.events.seed(evs) // its history under the servers before
	m.recordEventsOf(ms)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		s.Detach()
		return ErrClosed
	}
	if _, dup := m.sessions[s.ID()]; dup {
		m.mu.Unlock()
		s.Detach()
		return errors.New("reattach: session " + s.ID() + " is held already")
	}
	s.woken = ms.wokeInUse
	m.sessions[s.ID()] = ms
	m.mu.Unlock()
	ms.note(Event{Type: EventTakenOver,
		Reason: "the server restarted, and the session's kernel lived on in its keeper: its variables and files are as they were"})
	m.log.Info("session reattached", "session", s.ID())
	return nil
}

// Detach stops the manager as Close does, except that kept sessions are
// let go of rather than closed: their kernels go on in the keeper for the
// next server. Sessions that are not kept, and the pool, are closed.
func (m *Manager) Detach() error {
	m.detaching.Store(true)
	return m.Close()
}

// Shelve stops the manager of a server that comes back on the same
// records without a keeper (a restart, an upgrade): each durable session
// (ManagerOptions.Records) is hibernated first, its files and variables
// written to the snapshot store and its processes ended, and then left to
// its record, which the next server's Restore brings back asleep on the
// same id: nothing that serializes is lost to the restart. A cell running
// is interrupted first (within shelveBusyWait). A session whose
// hibernation fails is let go as Detach does: the next server takes its
// files, with the variables of its latest snapshot. Without records it is
// Close. It returns how many sessions went to sleep, and Close's error.
func (m *Manager) Shelve(ctx context.Context) (int, error) {
	if m.opts.Records == "" || m.opts.Snapshots == nil {
		return 0, m.Close()
	}
	m.mu.Lock()
	var list []*Managed
	for _, ms := range m.sessions {
		if ms.Session != nil && ms.durable != nil && !ms.Session.hib.on.Load() {
			list = append(list, ms)
		}
	}
	m.mu.Unlock()
	var slept atomic.Int64
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, ms := range list {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := m.shelve(ctx, ms); err != nil {
				m.log.Warn("shutdown: a session could not be hibernated: the next server takes its files, with the variables of its latest snapshot", "session", ms.ID(), "err", err)
				return
			}
			slept.Add(1)
		})
	}
	wg.Wait()
	m.detaching.Store(true)
	return int(slept.Load()), m.Close()
}

// shelveBusyWait bounds how long Shelve waits for a session's interrupted
// cell to end.
const shelveBusyWait = 5 * time.Second

// shelve hibernates ms for Shelve, interrupting its running cell first.
func (m *Manager) shelve(ctx context.Context, ms *Managed) error {
	const reason = "the server shut down: it sleeps on its snapshot until the next server on its data directory wakes it at its next use"
	deadline := time.Now().Add(shelveBusyWait)
	interrupted := false
	for {
		hctx, cancel := context.WithTimeout(ctx, snapshotDeadline)
		_, err := ms.hibernate(hctx, reason)
		cancel()
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			return err
		}
		if !interrupted {
			interrupted = true
			if err := ms.Session.Interrupt(); err != nil && !errors.Is(err, ErrClosed) {
				m.log.Debug("shutdown: interrupt a running cell", "session", ms.ID(), "err", err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
