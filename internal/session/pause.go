package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
)

// Pausing a session stops every process of its sandbox where it is (the
// kernel, its threads, whatever it started): the cgroup freezer, or
// SIGSTOP of each process where there is none (jail.FreezeMethod). A
// paused session uses no CPU and keeps its memory (the kernel may still
// reclaim it under pressure, as for any idle process), its variables and
// its files; Resume lets it go on where it was, a background loop
// included. Any call that needs the kernel (Execute, CheckComplete,
// Interrupt, Restart; in a Manager also Lease and Files) resumes it
// first. Closing a paused session kills it as any other: the kill thaws
// its processes so that they die.
//
// A session is paused only between calls: while an execution runs, Pause
// refuses with ErrBusy rather than freeze the execution's timeout with
// it. Pause and Resume are idempotent.

// States a session reports (State).
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateClosed  = "closed"
)

// freezable is a kernel process whose sandbox can be paused (jail's and
// zygote's processes are).
type freezable interface {
	Freeze() error
	Thaw() error
}

// Pause stops every process of the session until Resume (or any call that
// needs the kernel). It fails with ErrBusy while an execution runs,
// ErrClosed once closed, and an error wrapping ErrRestartRequired if the
// kernel has died. Pausing a paused session does nothing.
func (s *Session) Pause() error { return s.pause("asked for") }

// pause is Pause, its event saying reason.
func (s *Session) pause(reason string) error {
	s.stopRemaps() // a fork's remap is not an execution: it gives way
	select {
	case s.turn <- struct{}{}:
	default:
		return ErrBusy
	}
	defer s.release()
	// Under mu: Close, which kills (and so thaws) the sandbox, never
	// runs between the check and the freeze, which would leave a dying
	// sandbox frozen.
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.paused.Load(), s.hib.on.Load():
		return nil
	}
	if err := s.k.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	f, ok := s.proc.(freezable)
	if !ok {
		return fmt.Errorf("session %s: its kernel's launcher cannot pause it", s.id)
	}
	if w := s.warm; w != nil {
		// A join being made ahead (commands.go) is let finish first: the
		// processes it moves into the jail's group would run a moment
		// after the freeze. Made, it waits frozen with the jail.
		<-w.ready
	}
	if err := f.Freeze(); err != nil {
		return fmt.Errorf("pause session %s: %w", s.id, err)
	}
	s.paused.Store(true)
	s.note(Event{Type: EventPaused, Reason: reason})
	s.log.Debug("session paused")
	return nil
}

// Resume lets a paused session run again; a session that is not paused
// is left alone. It fails with ErrClosed once the session is closed.
func (s *Session) Resume() error {
	if s.hib.on.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), snapshotDeadline)
		defer cancel()
		res, err := s.wake(ctx)
		if err == nil && res != nil && s.woken != nil {
			// Woken by a call on the session itself (Execute, Files...),
			// which may hold its turn: the manager's part (its record,
			// the keeper) waits for the turn, so it runs beside.
			go s.woken(res)
		}
		return err
	}
	if !s.paused.Load() {
		if s.isClosed() {
			return ErrClosed
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if !s.paused.Load() {
		return nil
	}
	if f, ok := s.proc.(freezable); ok {
		// A sandbox already gone (its group removed) holds nothing frozen.
		if err := f.Thaw(); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("resume session %s: %w", s.id, err)
		}
	}
	s.paused.Store(false)
	s.note(Event{Type: EventResumed})
	s.log.Debug("session resumed")
	return nil
}

// State is "running", "paused", "hibernated" or (after Close) "closed".
func (s *Session) State() string {
	switch {
	case s.isClosed():
		return StateClosed
	case s.hib.on.Load():
		return StateHibernated
	case s.paused.Load():
		return StatePaused
	}
	return StateRunning
}

// acquireRunning takes the session's turn and resumes it if paused, as a
// call that talks to the kernel needs (a frozen kernel would never answer).
// The caller releases the turn.
func (s *Session) acquireRunning(ctx context.Context) error {
	if err := s.acquire(ctx); err != nil {
		return err
	}
	if err := s.Resume(); err != nil {
		s.release()
		return err
	}
	return nil
}
