package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// A kernel taken over by another server (package keeper).
//
// Handoff gives copies of our ends of the kernel's pipes and what goes
// with them (the markers' token); Attach, in another server, makes a
// Kernel of them. The kernel may have been in the middle of anything
// when the server before died, so Attach resyncs before the Kernel is
// used: it writes a newline (ending a request the server before left
// half-written, which the kernel then skips as not JSON) and a "sync"
// request with a random tag, and reads what the kernel says until the
// sync's reply, skipping lines that are not events (the server before may
// have read half of one). A cell that was running goes on to its end
// (its events are read and dropped: the client that asked for it is
// gone) and its end's status and execution count are recorded: the
// interrupted execution completes. A cell still running after
// Options.ResyncTimeout is interrupted as a timeout would (SIGINT, then
// the kernel is killed after InterruptGrace). Calls on the Kernel wait for
// the resync (it holds the pipes).

// Handoff is what Attach needs besides the pipes.
type Handoff struct {
	Token          string `json:"token"`
	MaxEventBytes  int    `json:"max_event_bytes"`
	StateChannel   bool   `json:"state_channel,omitempty"`
	ExecutionCount int    `json:"execution_count"`
}

// Resynced is what a kernel taken over was doing.
type Resynced struct {
	// Finished is the status of a cell that was running when the server
	// before died and ended since ("" if none was running).
	Finished       Status
	ExecutionCount int
	// Checkpoints are the ids of the checkpoints the kernel holds (the
	// server before took them; the new one has no record of them).
	Checkpoints []int
}

// Handoff returns copies of our ends of the kernel's pipes (the
// caller's to close) and what else another server needs to take the
// kernel over. The kernel must be between cells (the caller holds the
// session's turn).
func (k *Kernel) Handoff() (Handoff, []*os.File, error) {
	files, token, err := k.p.handoff()
	if err != nil {
		return Handoff{}, nil, err
	}
	return Handoff{Token: token, MaxEventBytes: k.opts.MaxEventBytes, StateChannel: k.stateChannel, ExecutionCount: k.count}, files, nil
}

// Attach makes a Kernel of a kernel another server started, from
// Handoff's files (which it owns from now on), and resyncs it in the
// background (see above); done, if not nil, gets what it found.
func Attach(proc Process, h Handoff, files []*os.File, opts *Options, done func(Resynced, error)) (*Kernel, error) {
	k := newKernel(opts, h.MaxEventBytes)
	if k.opts.ResyncTimeout <= 0 {
		k.opts.ResyncTimeout = 5 * time.Minute
	}
	p, err := attachPipes(files, k.opts.MaxEventBytes, h.Token)
	if err != nil {
		return nil, fmt.Errorf("attach kernel: %w", err)
	}
	k.p, k.proc, k.count, k.stateChannel = p, proc, h.ExecutionCount, h.StateChannel
	go func() {
		err := proc.Wait()
		k.mu.Lock()
		k.exitErr = err
		k.mu.Unlock()
		close(k.exited)
		p.wake()
	}()
	k.sem <- struct{}{} // released by the resync
	go func() {
		r, err := k.resync()
		<-k.sem
		if done != nil {
			done(r, err)
		}
	}()
	return k, nil
}

// resyncSink reads up to the sync's reply, keeping the last end.
type resyncSink struct {
	tag int64
	r   Resynced
}

func (s *resyncSink) text(int, string) {}

func (s *resyncSink) event(ev *wireEvent) bool {
	switch {
	case ev.Type == EventEnd:
		s.r.Finished, s.r.ExecutionCount = ev.Status, ev.ExecutionCount
	case ev.Type == "sync" && ev.Tag == s.tag:
		s.r.ExecutionCount, s.r.Checkpoints = ev.ExecutionCount, ev.Checkpoints
		return true
	}
	return false
}

// resync reads what the kernel says until the reply to a sync request
// (see the top of this file). The caller holds sem.
func (k *Kernel) resync() (Resynced, error) {
	var b [8]byte
	rand.Read(b[:])
	s := &resyncSink{tag: int64(binary.NativeEndian.Uint64(b[:]) >> 2)}
	req, _ := json.Marshal(map[string]any{"op": "sync", "tag": s.tag})
	k.p.lenient = true
	defer func() { k.p.lenient = false }()
	if err := k.p.writeRequest(append(append([]byte("\n"), req...), '\n'), time.Now().Add(10*time.Second)); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return s.r, k.Err()
	}
	timeoutAt := time.Now().Add(k.opts.ResyncTimeout)
	var graceAt time.Time
	for {
		wait := time.Until(timeoutAt)
		if !graceAt.IsZero() {
			wait = min(time.Until(graceAt), k.opts.InterruptGrace/4)
		}
		stopped, err := k.p.step(max(wait, 0), s)
		if err != nil {
			k.Kill("protocol error: " + err.Error())
			return s.r, k.Err()
		}
		if stopped {
			k.count = s.r.ExecutionCount
			return s.r, nil
		}
		if k.p.eof[streamEvents] || k.hasExited() {
			k.awaitExit(time.Second)
			return s.r, errors.Join(k.Err(), errors.New("the kernel ended while being taken over"))
		}
		now := time.Now()
		switch {
		case !graceAt.IsZero() && !now.Before(graceAt):
			k.Kill(fmt.Sprintf("the execution running when the server restarted exceeded %s and did not stop within %s of being interrupted; the kernel was killed", k.opts.ResyncTimeout, k.opts.InterruptGrace))
			return s.r, k.Err()
		case !graceAt.IsZero():
			k.signal(os.Interrupt) // again, as a user presses Ctrl-C again
		case !now.Before(timeoutAt):
			k.signal(os.Interrupt)
			graceAt = now.Add(k.opts.InterruptGrace)
		}
	}
}

// Detach lets go of the kernel without killing it, for another server to
// take over (the process must have a Detach method, as a jail a keeper
// started has; otherwise this is Close). A running Execute ends with
// "killed", for this server only.
func (k *Kernel) Detach() {
	d, ok := k.proc.(interface{ Detach() })
	if !ok {
		k.Close()
		return
	}
	k.closeOnce.Do(func() {
		k.mu.Lock()
		if k.killReason == "" {
			k.killReason = "the server is restarting: the cell goes on in the sandbox but its result is not reported here; the session, its variables and files are kept for the next server"
		}
		k.mu.Unlock()
		d.Detach()
		<-k.exited
		k.sem <- struct{}{}
		k.p.close()
		<-k.sem
	})
}
