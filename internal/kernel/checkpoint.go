package kernel

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Errors of checkpoints.
var (
	// ErrCheckpointGone means the checkpoint's process has died (the
	// out-of-memory killer may pick it: it is charged to the session). It
	// cannot be restored; drop it.
	ErrCheckpointGone = errors.New("the checkpoint is gone: its process was killed (the session may have run out of memory)")
	// ErrNoCheckpoint means the kernel has no checkpoint of that id.
	ErrNoCheckpoint = errors.New("no such checkpoint")
)

// CheckpointInfo describes a checkpoint.
type CheckpointInfo struct {
	ID             int      // assigned by the kernel, increasing from 1
	ExecutionCount int      // the kernel's count when it was taken
	Threads        []string // other threads, not carried
	Processes      []string // child processes, "PID COMMAND", not carried
}

// StateManifest says what ExportState wrote or ImportState loaded.
type StateManifest struct {
	Serializer     string     `json:"serializer"` // "dill" or "pickle"
	Variables      []string   `json:"variables"`  // names saved (or loaded)
	NotSaved       []NotSaved `json:"not_saved,omitempty"`
	ExecutionCount int        `json:"execution_count"`
}

// NotSaved is a variable that could not be saved or loaded, and why.
type NotSaved struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// checkpointDeadline bounds a checkpoint request: the kernel forks (a few
// milliseconds per GiB of page tables) and answers.
const checkpointDeadline = 60 * time.Second

// Checkpoint takes a checkpoint of the kernel's memory: a dormant copy of
// the kernel process (see the package doc), restorable any number of times
// until dropped.
func (k *Kernel) Checkpoint(ctx context.Context) (*CheckpointInfo, error) {
	ev, err := k.call(ctx, map[string]any{"op": "checkpoint"}, "checkpoint", "a checkpoint", checkpointDeadline, nil)
	if err != nil {
		return nil, err
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("checkpoint: %s", ev.Reason)
	}
	return ev.info(), nil
}

// Restore puts the kernel back at checkpoint id (kept: it can be restored
// again). The kernel's execution count becomes the checkpoint's.
func (k *Kernel) Restore(ctx context.Context, id int) (*CheckpointInfo, error) {
	ev, err := k.call(ctx, map[string]any{"op": "restore", "id": id}, "restore", "a restore", checkpointDeadline, func(ev *wireEvent) {
		if ev.Reason == "" && !ev.Gone {
			k.count = ev.ExecutionCount
		}
	})
	if err != nil {
		return nil, err
	}
	if err := ev.checkpointErr(id); err != nil {
		return nil, err
	}
	return ev.info(), nil
}

// DropCheckpoint ends checkpoint id's process, freeing its memory.
func (k *Kernel) DropCheckpoint(ctx context.Context, id int) error {
	ev, err := k.call(ctx, map[string]any{"op": "drop_checkpoint", "id": id}, "drop_checkpoint", "a request to drop a checkpoint", checkpointDeadline, nil)
	if err != nil {
		return err
	}
	return ev.checkpointErr(id)
}

// CheckpointMemory returns the private memory (bytes) each checkpoint holds
// now, by id: Private_Clean+Private_Dirty of its process's smaps_rollup,
// the pages it no longer shares with the live kernel or other checkpoints.
// A checkpoint whose process has died is left out (Restore reports it as
// ErrCheckpointGone).
func (k *Kernel) CheckpointMemory(ctx context.Context) (map[int]int64, error) {
	ev, err := k.call(ctx, map[string]any{"op": "checkpoint_memory"}, "checkpoint_memory", "a checkpoint memory request", checkpointDeadline, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(ev.Memory))
	for id, n := range ev.Memory {
		i, err := strconv.Atoi(id)
		if err != nil {
			return nil, fmt.Errorf("checkpoint memory: bad id %q", id)
		}
		out[i] = n
	}
	return out, nil
}

// ExportState writes the user's variables (the __main__ namespace) to w;
// fromCheckpoint > 0 exports a checkpoint's state instead of the live one.
// A forked copy of the kernel (or of the checkpoint) serializes them, so
// the live kernel stalls only for a fork; the bytes stream through the
// event pipe as they are made (memory here is bounded by one chunk).
// Variables that cannot be serialized are listed in the manifest's
// NotSaved, with the reason.
func (k *Kernel) ExportState(ctx context.Context, w io.Writer, fromCheckpoint int) (*StateManifest, error) {
	s := &exportSink{w: w}
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "export_state", "checkpoint": fromCheckpoint}, sink: s, what: "an export of its state"})
	if err != nil {
		return nil, err
	}
	if fromCheckpoint > 0 {
		if err := ev.checkpointErr(fromCheckpoint); err != nil {
			return nil, fmt.Errorf("export state: %w", err)
		}
	} else if ev.Reason != "" {
		return nil, fmt.Errorf("export state: %s", ev.Reason)
	}
	if s.err != nil {
		return nil, fmt.Errorf("export state: write: %w", s.err)
	}
	if ev.Manifest == nil {
		return nil, errors.New("export state: the kernel sent no manifest")
	}
	return ev.Manifest, nil
}

// ImportState loads what ExportState wrote into this kernel's namespace,
// then reseeds random and numpy's global generator (a copy must not repeat
// its source's draws) and sets the execution count to the exported one.
// Variables that could not be loaded are in the manifest's NotSaved, with
// those the export could not save. If the stream itself is broken the
// error says so; the variables loaded before the break stay.
func (k *Kernel) ImportState(ctx context.Context, r io.Reader) (*StateManifest, error) {
	send := func(write func([]byte) error) error {
		br := bufio.NewReaderSize(r, 1<<20)
		buf := make([]byte, 768<<10)
		line := make([]byte, 0, base64.StdEncoding.EncodedLen(len(buf))+16)
		for {
			n, rerr := io.ReadFull(br, buf)
			if n > 0 {
				line = append(line[:0], `{"chunk":"`...)
				line = base64.StdEncoding.AppendEncode(line, buf[:n])
				line = append(line, "\"}\n"...)
				if err := write(line); err != nil {
					return err
				}
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				return write([]byte("{\"end\":true}\n"))
			}
			if rerr != nil {
				b, _ := json.Marshal(map[string]any{"end": true, "abort": rerr.Error()})
				return write(append(b, '\n'))
			}
			if err := ctx.Err(); err != nil {
				b, _ := json.Marshal(map[string]any{"end": true, "abort": err.Error()})
				return write(append(b, '\n'))
			}
		}
	}
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "import_state"}, sink: &replySink{typ: "import_state", tagged: true}, what: "an import of state", send: send,
		onReply: func(ev *wireEvent) {
			if ev.Reason == "" && ev.Manifest != nil {
				k.count = ev.Manifest.ExecutionCount
			}
		}})
	if err != nil {
		return nil, err
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("import state: %s", ev.Reason)
	}
	if ev.Manifest == nil {
		return nil, errors.New("import state: the kernel sent no manifest")
	}
	return ev.Manifest, nil
}

func (ev *wireEvent) info() *CheckpointInfo {
	return &CheckpointInfo{ID: ev.ID, ExecutionCount: ev.ExecutionCount, Threads: ev.Threads, Processes: ev.Processes}
}

func (ev *wireEvent) checkpointErr(id int) error {
	switch {
	case ev.Gone:
		return fmt.Errorf("checkpoint %d: %w", id, ErrCheckpointGone)
	case ev.Reason == fmt.Sprintf("no checkpoint %d", id):
		return fmt.Errorf("checkpoint %d: %w", id, ErrNoCheckpoint)
	case ev.Reason != "":
		return fmt.Errorf("checkpoint %d: %s", id, ev.Reason)
	}
	return nil
}

// exportSink writes the state_data chunks to w and stops at the state_end.
type exportSink struct {
	w   io.Writer
	tag int64
	err error // the first write error; the stream is read to its end anyway
}

func (s *exportSink) text(int, string) {}
func (s *exportSink) setTag(t int64)   { s.tag = t }

func (s *exportSink) event(ev *wireEvent) bool {
	if ev.Tag != s.tag {
		return false // from an abandoned export
	}
	switch ev.Type {
	case "state_data":
		if s.err != nil {
			return false
		}
		b, err := base64.StdEncoding.DecodeString(ev.Chunk)
		if err != nil {
			s.err = fmt.Errorf("bad chunk from the kernel: %w", err)
			return false
		}
		_, s.err = s.w.Write(b)
		return false
	case "state_end":
		return true
	}
	return false
}

// lastEvent is a sink that keeps the event it stopped at.
type lastEvent struct {
	sink
	last *wireEvent
}

func (l *lastEvent) event(ev *wireEvent) bool {
	if l.sink.event(ev) {
		l.last = ev
		return true
	}
	return false
}

// call sends a request between cells and returns the kernel's reply of
// type typ; a kernel that does not answer within d is killed. onReply, if
// not nil, sees the reply while the caller still holds the pipes.
func (k *Kernel) call(ctx context.Context, req map[string]any, typ, what string, d time.Duration, onReply func(*wireEvent)) (*wireEvent, error) {
	return k.converse(ctx, conversation{req: req, sink: &replySink{typ: typ, tagged: true}, what: what, deadline: time.Now().Add(d), onReply: onReply})
}

// conversation is a request between cells and how to take its reply.
type conversation struct {
	req      map[string]any
	sink     sink   // what the kernel says goes here until it stops at an event
	what     string // names the request in errors
	deadline time.Time
	// send, if not nil, writes more request lines after req.
	send    func(write func([]byte) error) error
	onReply func(*wireEvent)
}

// converse holds the pipes for one conversation and returns the event the
// sink stopped at. A ctx done abandons it: the rest of the reply is skipped
// by the next reader. Past c.deadline the kernel is killed.
func (k *Kernel) converse(ctx context.Context, c conversation) (*wireEvent, error) {
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return nil, err
	}
	// The tag tells this conversation's replies from those of one abandoned
	// earlier, which may still come.
	k.tag++
	c.req["tag"] = k.tag
	if t, ok := c.sink.(interface{ setTag(int64) }); ok {
		t.setTag(k.tag)
	}
	b, _ := json.Marshal(c.req)
	if err := k.p.writeRequest(append(b, '\n'), time.Now().Add(10*time.Second)); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return nil, k.Err()
	}
	l := &lastEvent{sink: c.sink}
	stopped := false
	if c.send != nil {
		// The kernel reads the lines as it loads them; a large value takes
		// it a while, hence the long bound on each write.
		err := c.send(func(line []byte) error {
			st, err := k.p.writeRequestListening(line, time.Now().Add(5*time.Minute), l)
			stopped = stopped || st
			return err
		})
		if err != nil {
			k.Kill("could not write to the kernel: " + err.Error())
			return nil, k.Err()
		}
	}
	stop := context.AfterFunc(ctx, k.p.wake)
	defer stop()
	for !stopped {
		wait := time.Duration(-1)
		if !c.deadline.IsZero() {
			wait = max(time.Until(c.deadline), 0)
		}
		st, err := k.p.step(wait, l)
		switch {
		case err != nil:
			k.Kill("protocol error: " + err.Error())
			return nil, k.Err()
		case st:
			stopped = true
		case k.p.eof[streamEvents] || k.hasExited():
			k.awaitExit(time.Second)
			return nil, k.Err()
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !c.deadline.IsZero() && time.Now().After(c.deadline):
			k.Kill("the kernel did not answer " + c.what)
			return nil, k.Err()
		}
	}
	if c.onReply != nil {
		c.onReply(l.last)
	}
	return l.last, nil
}
