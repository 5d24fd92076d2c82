package session

import (
	"fmt"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
)

// A session's events are its lifecycle, one transition at a time: how it
// was created, every pause, resume, hibernation and wake, checkpoint,
// undo, fork, snapshot and restart, a kernel that died on its own, a loss
// of its processes (its keeper, or the server, died) and its close, each
// saying why and, where something was restored, what came back
// (Restored). A client or a model reads them (GET
// /v1/sessions/{id}/events) to learn what happened to a session while it
// was not looking, never guessing what survived.
//
// They are kept in memory, the latest MaxEvents of each session, numbered
// from 1 (Seq) so a reader can resume after the last it saw, and a closed
// session's stay with its manager for ClosedEventsKept (its id then says
// why it is gone: Manager.Get). A durable session's latest recordEvents
// are written with its record at each event (durable.go), so the server
// that brings it back after a restart goes on from them, with how it came
// back: "taken_over", "lost" or "hibernated".

// Event types (Event.Type).
const (
	// EventCreated: the session started; How says from what.
	EventCreated = "created"
	// EventPaused and EventResumed: frozen in memory, and running again.
	EventPaused  = "paused"
	EventResumed = "resumed"
	// EventHibernated: written to storage and its processes ended
	// (Snapshot); EventWoken: back from it (Restored).
	EventHibernated = "hibernated"
	EventWoken      = "woken"
	// EventCheckpoint: a checkpoint was taken (Checkpoint; automatic
	// ones before each cell are not events: they are the checkpoint list).
	EventCheckpoint = "checkpoint"
	// EventCheckpointRestored and EventUndone: back at a checkpoint, or
	// before the last cell (Restored).
	EventCheckpointRestored = "checkpoint_restored"
	EventUndone             = "undone"
	// EventForked: new sessions were forked from this one (Children).
	EventForked = "forked"
	// EventSnapshot: a durable snapshot was written (Snapshot; Reason
	// "automatic" for the server's own, ManagerOptions.SnapshotEvery).
	EventSnapshot = "snapshot"
	// EventKernelRestarted: a fresh kernel replaced the old one (a
	// restart): variables gone, files kept.
	EventKernelRestarted = "kernel_restarted"
	// EventKernelDied: the kernel ended on its own (Reason: how, e.g.
	// killed by the memory limit); the next cell says so too.
	EventKernelDied = "kernel_died"
	// EventTakenOver: the server restarted, and the session's kernel
	// lived on in its keeper: taken over alive, nothing lost.
	EventTakenOver = "taken_over"
	// EventLost: the session's processes were lost with the process that
	// held them (its keeper, or the server): it sleeps on its latest
	// snapshot, and its next use wakes it (Reason says from what, and
	// what is lost).
	EventLost = "lost"
	// EventClosed: the session ended (Reason, in words: deleted by its
	// owner, idle, past its lifetime, the server shut down...). It is the
	// last event.
	EventClosed = "closed"
)

// How a session was created (Event.How).
const (
	CreatedNew      = "new"      // a kernel started for it
	CreatedPool     = "pool"     // a kernel ready in the warm pool
	CreatedTemplate = "template" // in a template (Event.Template)
	CreatedSnapshot = "snapshot" // from a snapshot (Event.Snapshot, Restored)
	CreatedFork     = "fork"     // forked (Event.Parent, Restored)
)

// Event is one transition in a session's life.
type Event struct {
	// Seq numbers the session's events from 1, in order.
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	// State is the session's state after the event: "running",
	// "paused", "hibernated" or "closed".
	State string `json:"state"`
	// How, for EventCreated (Created*).
	How string `json:"how,omitempty"`
	// Reason says why, in words (a pause, hibernation, loss, kernel's
	// death or close).
	Reason     string   `json:"reason,omitempty"`
	Checkpoint string   `json:"checkpoint,omitempty"`
	Snapshot   string   `json:"snapshot,omitempty"`
	Template   string   `json:"template,omitempty"`
	Parent     string   `json:"parent,omitempty"`   // a fork's child: its parent
	Children   []string `json:"children,omitempty"` // EventForked
	// Restored is what came back, for the events that restore (created
	// from a snapshot or by a fork, woken, checkpoint_restored, undone).
	Restored *Restored `json:"restored,omitempty"`
}

// MaxEvents is how many of a session's latest events are kept.
const MaxEvents = 256

// eventLog is a session's events, in memory; usable at its zero value.
type eventLog struct {
	mu      sync.Mutex
	events  []Event // the latest MaxEvents, oldest first
	seq     int64
	state   string
	ended   bool          // EventClosed was added, or end called: no more
	changed chan struct{} // closed at the next event (nil: none made yet)
}

// stateAfter is the state an event type leaves the session in ("" for
// the types that do not change it).
func stateAfter(typ string) string {
	switch typ {
	case EventCreated, EventResumed, EventWoken, EventCheckpointRestored, EventUndone, EventKernelRestarted, EventTakenOver:
		return StateRunning
	case EventPaused:
		return StatePaused
	case EventHibernated, EventLost:
		return StateHibernated
	case EventClosed:
		return StateClosed
	}
	return ""
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.seq++
	e.Seq = l.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if st := stateAfter(e.Type); st != "" {
		l.state = st
	}
	e.State = l.state
	if e.State == "" {
		e.State = StateRunning
	}
	if len(l.events) == MaxEvents {
		l.events = append(l.events[:0], l.events[1:]...)
	}
	l.events = append(l.events, e)
	l.ended = e.Type == EventClosed
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// begun says whether an event was added.
func (l *eventLog) begun() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq > 0
}

// end ends the log without an event: this server let go of the session
// (Detach), which goes on under the next. Readers waiting for its next
// event stop waiting (a stream ends, not holding up the server's
// shutdown).
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// seed starts the log with evs, a durable session's recorded events (a
// server before this one noted them): the next event follows them.
func (l *eventLog) seed(evs []Event) {
	if len(evs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append([]Event(nil), evs[max(0, len(evs)-MaxEvents):]...)
	last := evs[len(evs)-1]
	l.seq, l.state = last.Seq, last.State
}

// latest is a copy of the latest n events.
func (l *eventLog) latest(n int) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events[max(0, len(l.events)-n):]...)
}

// since returns the events after seq after (a copy), whether the log has
// ended, and, if it has not, a channel closed at the next event.
func (l *eventLog) since(after int64) ([]Event, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.events {
		if e.Seq > after {
			out = append(out, e)
		}
	}
	if l.ended {
		return out, true, nil
	}
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return out, false, l.changed
}

// Events is a session's event log, as read by a face: its events after
// a given one, and the next as they come.
type Events interface {
	// Since returns the events after seq after, oldest first (those
	// still kept: MaxEvents), whether the session has ended (no event
	// follows), and, if not, a channel closed at its next event.
	Since(after int64) (events []Event, ended bool, next <-chan struct{})
}

// Since implements Events.
func (l *eventLog) Since(after int64) ([]Event, bool, <-chan struct{}) { return l.since(after) }

// Events returns the session's events (see Events).
func (s *Session) Events() Events { return &s.events }

// note adds an event to the session's log, and tells the manager of a
// durable session (its record holds its latest events).
func (s *Session) note(e Event) {
	s.events.add(e)
	if s.noted != nil {
		s.noted()
	}
}

// noteRestored notes e, an event that restored the session: res says
// what came back.
func (s *Session) noteRestored(e Event, res *Restored) {
	if res != nil {
		r := *res
		e.Restored, e.Snapshot = &r, r.Snapshot
	}
	s.note(e)
}

// noteLost notes EventLost: the session's processes were lost (cause),
// and it sleeps on h, whose wake brings back what it says.
func (s *Session) noteLost(cause string, h *hibernating) {
	e := Event{Type: EventLost, Reason: cause + ": its processes are gone; its next use wakes it"}
	if h.m != nil {
		e.Snapshot = h.m.ID
		e.Reason += " from its latest snapshot"
	}
	if h.lost != "" {
		e.Reason += "; lost: " + h.lost
	}
	s.note(e)
}

// watchKernel notes EventKernelDied if k, the session's kernel, ends on
// its own (not retired: a restart, hibernation, close), while the session
// is open.
func (s *Session) watchKernel(k *kernel.Kernel) {
	if k == nil || k.Retired() {
		return
	}
	go func() {
		select {
		case <-k.Exited():
		case <-s.done:
			return
		}
		s.mu.Lock()
		current := s.k == k && !s.closed
		s.mu.Unlock()
		if !current || k.Retired() {
			return
		}
		s.note(Event{Type: EventKernelDied, Reason: k.ExitReason() + ": its variables are gone, its files stay; the session runs again once restarted"})
	}()
}

// ClosedEventsKept is how long a manager keeps a closed session's events
// (and why it closed), MaxClosedEvents how many sessions' at most, and
// closedTail how many of each one's latest events.
const (
	ClosedEventsKept = time.Hour
	MaxClosedEvents  = 1000
	closedTail       = 64
)

// tail is a copy of the log with its latest n events only.
func (l *eventLog) tail(n int) *eventLog {
	evs := l.latest(n)
	l.mu.Lock()
	defer l.mu.Unlock()
	return &eventLog{events: evs, seq: l.seq, state: l.state, ended: l.ended}
}

// ended is what a manager remembers of a closed session.
type ended struct {
	owner  string
	at     time.Time
	reason string
	events *eventLog
}

// endedSessions are a manager's closed sessions, the oldest going first
// (MaxClosedEvents, ClosedEventsKept).
type endedSessions struct {
	mu    sync.Mutex
	byID  map[string]*ended
	order []string // oldest first
}

func (e *endedSessions) add(id string, x *ended) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byID == nil {
		e.byID = map[string]*ended{}
	}
	if _, ok := e.byID[id]; !ok {
		e.order = append(e.order, id)
	}
	e.byID[id] = x
	e.pruneLocked(time.Now())
}

func (e *endedSessions) pruneLocked(now time.Time) {
	n := 0
	for _, id := range e.order {
		x := e.byID[id]
		if len(e.order)-n <= MaxClosedEvents && now.Sub(x.at) < ClosedEventsKept {
			break
		}
		delete(e.byID, id)
		n++
	}
	e.order = e.order[n:]
}

func (e *endedSessions) get(owner, id string) *ended {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pruneLocked(time.Now())
	x := e.byID[id]
	if x == nil || x.owner != owner {
		return nil
	}
	return x
}

// closedError is ErrNotFound for a session that was closed not long ago:
// it says when and why.
type closedError struct {
	id string
	x  *ended
}

func (e *closedError) Error() string {
	return fmt.Sprintf("session %s was closed at %s: %s (its events: GET /v1/sessions/%s/events)",
		e.id, e.x.at.UTC().Format(time.RFC3339), closeWords(e.x.reason), e.id)
}

func (e *closedError) Is(target error) bool { return target == ErrNotFound }

// closeWords says a close's reason in words.
func closeWords(reason string) string {
	switch reason {
	case "deleted":
		return "deleted by its owner"
	case "idle":
		return "idle past the server's limit"
	case "expired":
		return "past the server's maximum lifetime"
	case "shutdown":
		return "the server shut down"
	}
	return reason
}

// SessionEvents returns owner's session id's events: a session held, one
// being closed, or one closed within ClosedEventsKept.
func (m *Manager) SessionEvents(owner, id string) (Events, error) {
	if ms, err := m.Get(owner, id); err == nil {
		return ms.Events(), nil
	}
	// Being closed: its own events still, its close to come (ended has
	// it only once the close is over).
	m.mu.Lock()
	ms := m.shutting[id]
	m.mu.Unlock()
	if ms != nil && ms.Owner == owner {
		return ms.Events(), nil
	}
	if x := m.ended.get(owner, id); x != nil {
		return x.events, nil
	}
	return nil, ErrNotFound
}
