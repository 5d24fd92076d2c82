package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/workspace"
)

// Checkpoint modes (Options.Checkpoints).
const (
	CheckpointsOff  = "off"
	CheckpointsAuto = "auto" // one before every execution: Undo reverts the last cell
)

// Defaults of the checkpoint options.
const (
	DefaultAutoCheckpoints  = 3
	DefaultMaxCheckpoints   = 16
	DefaultCheckpointMemory = 1 << 30
	// MaxForks bounds the sessions one Fork makes.
	MaxForks = 16
)

// Checkpoint describes one checkpoint of a session.
type Checkpoint struct {
	ID             string    `json:"id"` // "cp1", "cp2", ... unique within the session
	Name           string    `json:"name,omitempty"`
	Auto           bool      `json:"auto"` // taken before an execution (checkpoints "auto")
	CreatedAt      time.Time `json:"created_at"`
	ExecutionCount int       `json:"execution_count"`
	// MemoryBytes is the private memory its kernel copy held when last
	// measured, at MemoryMeasuredAt (zero: not yet measured). The host
	// measures all copies in the background each time a call on the
	// session ends (a measure walks the copies' page tables: milliseconds,
	// so a listing does not measure), and exactly, before a checkpoint is
	// taken, when they may be near the bound; it grows as the live kernel
	// changes memory the copy still shares.
	MemoryBytes      int64     `json:"memory_bytes"`
	MemoryMeasuredAt time.Time `json:"memory_measured_at,omitzero"`
	FileBytes        int64     `json:"file_bytes"` // bytes of its files
	Files            int       `json:"files"`
	// NotCarried names what the checkpoint does not hold: threads other
	// than the main one, child processes ("PID COMMAND": they keep
	// running, not rolled back), FIFOs and devices in the workspace.
	NotCarried []string `json:"not_carried,omitempty"`
	// Fresh marks the automatic checkpoint taken before the first cell of
	// a kernel no code had run in (kernel.Fresh): it holds the files but
	// no copy of the kernel (memory 0), and restoring it starts a fresh
	// kernel in a fresh sandbox (restoreFresh), whose Python state is the
	// one it had. Taking it costs a copy of the files only.
	Fresh bool `json:"fresh,omitempty"`
}

// Restored says what came back after a restore, an undo or a fork: the
// API and the model are told, never left to guess.
type Restored struct {
	From string `json:"from"` // "checkpoint cp2", "fork of s-abc", "undo", "snapshot snap-…", "hibernation"
	// Snapshot is the snapshot it came from, if it did.
	Snapshot string `json:"snapshot,omitempty"`
	Files    int    `json:"files"`
	// FilesBy, for a fork's child, is how it got the parent's files:
	// "overlay" (a read-only copy shared with its siblings, under a layer
	// of its own that takes its writes) or "copy" (its own copy).
	FilesBy        string   `json:"files_by,omitempty"`
	Variables      []string `json:"variables,omitempty"`
	NotRestored    []string `json:"not_restored,omitempty"`
	ExecutionCount int      `json:"execution_count"`
	// AsOf is when the snapshot it came from was taken, for a session
	// brought back after its processes were lost (durable.go).
	AsOf time.Time `json:"as_of,omitzero"`
	// Lost says what did not come back beyond NotRestored: what was done
	// after AsOf. Empty when nothing was.
	Lost string `json:"lost,omitempty"`
	// FilesAsOf, when set, is when the files are of: a session whose
	// processes were lost but whose workspace was not (its keeper died,
	// the host did not) comes back with its files as they were then, and
	// with its variables as of AsOf.
	FilesAsOf time.Time `json:"files_as_of,omitzero"`
}

// ArgumentError reports bad input to a session call: what is wrong, and
// how to fix it.
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// notFoundError is an ErrNotFound with its own words (a checkpoint, not
// the session, is missing).
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

// checkpointMode validates a mode ("" means def).
func checkpointMode(mode, def string) (string, error) {
	switch mode {
	case "":
		if def == "" {
			return CheckpointsOff, nil
		}
		return checkpointMode(def, "")
	case CheckpointsOff, CheckpointsAuto:
		return mode, nil
	}
	return "", &ArgumentError{"checkpoints", fmt.Errorf("%q is not a mode: use \"auto\" (one before every execution, for undo) or \"off\"", mode)}
}

// cpRecord is one checkpoint: the kernel's copy and the files' copy.
type cpRecord struct {
	Checkpoint
	kernelID int
	fileID   string
}

// checkpoints is a session's checkpoint state. Changed under the
// session's turn; mu guards it for readers that do not take the turn.
type checkpoints struct {
	mu       sync.Mutex
	list     []*cpRecord // oldest first
	seq      int
	store    *workspace.CheckpointStore // made at the first checkpoint
	ws       *workspace.Workspace
	restored *Restored
	measured time.Time // when the kernel copies' memory was last measured (measureOnRequest)
	memory   int64     // what they held then
	// The background measure (cpmeasure.go).
	released time.Time     // when the turn was last given back with checkpoints held
	bgDone   chan struct{} // the running measure's; nil when none runs
	bgAgain  bool          // the turn was given back while it ran: measure again
	hostErr  error         // the host cannot read the copies: the kernel measures
}

// measureEvery: measuring the copies' memory walks their page tables
// (milliseconds for a large kernel), so it is done at most this often
// while what checkpoints hold is far from the bound.
const measureEvery = time.Second

// files opens the session's checkpoint store and workspace handle if not
// yet open. Called under the turn.
func (s *Session) checkpointFiles() (*workspace.CheckpointStore, *workspace.Workspace, error) {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.store != nil {
		return c.store, c.ws, nil
	}
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return nil, nil, err
	}
	// Beside the workspace, never inside it: the sandbox must not see or
	// change the copies. Named so a sandloop killed before its cleanup
	// has it swept by the next one.
	dir, err := jail.OwnedTempDir("checkpoints")
	if err != nil {
		ws.Close()
		return nil, nil, fmt.Errorf("session %s: checkpoint store: %w", s.id, err)
	}
	st, err := workspace.OpenCheckpointStore(dir)
	if err != nil {
		ws.Close()
		return nil, nil, err
	}
	c.store, c.ws = st, ws
	return st, ws, nil
}

// closeCheckpoints forgets every checkpoint and removes the store (its
// kernel copies die with the kernel).
func (s *Session) closeCheckpoints() error {
	c := &s.cps
	c.mu.Lock()
	st, ws := c.store, c.ws
	c.store, c.ws, c.list = nil, nil, nil
	c.mu.Unlock()
	var err error
	if st != nil {
		err = st.Close()
	}
	if ws != nil {
		ws.Close()
	}
	return err
}

// Checkpoints lists the session's checkpoints, oldest first.
func (s *Session) Checkpoints() []Checkpoint {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Checkpoint, len(c.list))
	for i, r := range c.list {
		out[i] = r.Checkpoint
		out[i].NotCarried = append([]string(nil), r.NotCarried...)
	}
	return out
}

// Restored is what came back at the session's latest restore, undo or
// fork (nil if none).
func (s *Session) Restored() *Restored {
	s.cps.mu.Lock()
	defer s.cps.mu.Unlock()
	if s.cps.restored == nil {
		return nil
	}
	r := *s.cps.restored
	return &r
}

func (s *Session) setRestored(r *Restored) {
	s.cps.mu.Lock()
	s.cps.restored = r
	s.cps.mu.Unlock()
}

// CheckpointMode is the session's mode: "auto" or "off".
func (s *Session) CheckpointMode() string {
	m, _ := checkpointMode(s.opts.Checkpoints, "")
	return m
}

// Checkpoint captures the session's exact state now: its kernel's memory
// (variables, imports, random state, execution count) and its workspace's
// files. It waits for a running execution to end. More than
// MaxCheckpoints named ones, or one that does not fit in CheckpointMemory
// once the automatic ones are dropped, is a *LimitError.
func (s *Session) Checkpoint(ctx context.Context, name string) (*Checkpoint, error) {
	if len(name) > 200 || strings.ContainsAny(name, "\x00\n") {
		return nil, &ArgumentError{"name", errors.New("at most 200 characters on one line")}
	}
	if err := s.acquireRunning(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	r, err := s.checkpoint(ctx, name, false)
	if err != nil {
		return nil, err
	}
	cp := r.Checkpoint
	s.note(Event{Type: EventCheckpoint, Checkpoint: cp.ID})
	return &cp, nil
}

func (s *Session) maxCheckpoints() int {
	return cmpOr(s.opts.MaxCheckpoints, DefaultMaxCheckpoints)
}

func (s *Session) autoCheckpoints() int {
	return cmpOr(s.opts.AutoCheckpoints, DefaultAutoCheckpoints)
}

func (s *Session) checkpointMemory() int64 {
	return cmpOr(s.opts.CheckpointMemory, DefaultCheckpointMemory)
}

func cmpOr[T int | int64](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// checkpoint takes one, under the turn: the kernel's copy and the
// files' at once, then the bound on what checkpoints hold.
func (s *Session) checkpoint(ctx context.Context, name string, auto bool) (*cpRecord, error) {
	kc, err := s.liveCheckpoints()
	if err != nil {
		return nil, err
	}
	if !auto {
		if n := s.countCheckpoints(false); n >= s.maxCheckpoints() {
			return nil, &LimitError{Name: "checkpoints", Requested: strconv.Itoa(n + 1), Max: strconv.Itoa(s.maxCheckpoints()),
				Reason: fmt.Sprintf("the session holds %d checkpoints, its maximum: delete one first", n)}
		}
	}
	st, ws, err := s.checkpointFiles()
	if err != nil {
		return nil, err
	}
	if k, err := s.kernel(); err == nil && auto && k.Fresh() {
		return s.checkpointFresh(ctx, kc, st, ws)
	}
	// The kernel's copy and the files' at once: both are of this moment,
	// between cells, under the turn.
	var fc *workspace.FileCheckpoint
	var ferr error
	filesDone := make(chan struct{})
	go func() {
		defer close(filesDone)
		t0 := time.Now()
		fc, ferr = st.Take(ws)
		forkStage("checkpoint-files", t0)
	}()
	t0 := time.Now()
	ki, err := kc.Checkpoint(ctx)
	forkStage("checkpoint-kernel", t0)
	<-filesDone
	if err != nil {
		if ferr == nil {
			st.Drop(fc.ID)
		}
		return nil, s.kernelErr("checkpoint", err)
	}
	if ferr != nil {
		_ = kc.DropCheckpoint(context.WithoutCancel(ctx), ki.ID)
		return nil, fmt.Errorf("session %s: checkpoint the workspace: %w", s.id, ferr)
	}
	c := &s.cps
	c.mu.Lock()
	c.seq++
	r := &cpRecord{Checkpoint: Checkpoint{
		ID: "cp" + strconv.Itoa(c.seq), Name: name, Auto: auto, CreatedAt: time.Now().UTC(),
		ExecutionCount: ki.ExecutionCount, FileBytes: fc.Bytes, Files: fc.Files,
	}, kernelID: ki.ID, fileID: fc.ID}
	for _, t := range ki.Threads {
		r.NotCarried = append(r.NotCarried, "thread "+t)
	}
	for _, p := range ki.Processes {
		r.NotCarried = append(r.NotCarried, "process "+p+" (keeps running; not rolled back)")
	}
	for _, p := range fc.Skipped {
		r.NotCarried = append(r.NotCarried, "file "+p+" (not a regular file)")
	}
	c.list = append(c.list, r)
	c.mu.Unlock()
	if auto {
		s.trimAuto(ctx, kc, s.autoCheckpoints())
	}
	if err := s.fit(ctx, kc, r); err != nil {
		return nil, err
	}
	return r, nil
}

// checkpointFresh takes the automatic checkpoint before the first cell of
// a fresh kernel: the files alone (see Checkpoint.Fresh). A fork of the
// kernel (its page tables, the copy's start, its memory measured after)
// cost a session's first cell several milliseconds of CPU, the most of
// it in a burst of new sessions (issue 26: BenchmarkMCPBurst, whose
// sessions take automatic checkpoints for the undo tool).
func (s *Session) checkpointFresh(ctx context.Context, kc kernelCheckpoints, st *workspace.CheckpointStore, ws *workspace.Workspace) (*cpRecord, error) {
	fc, err := st.Take(ws)
	if err != nil {
		return nil, fmt.Errorf("session %s: checkpoint the workspace: %w", s.id, err)
	}
	c := &s.cps
	c.mu.Lock()
	c.seq++
	r := &cpRecord{Checkpoint: Checkpoint{
		ID: "cp" + strconv.Itoa(c.seq), Auto: true, Fresh: true, CreatedAt: time.Now().UTC(),
		FileBytes: fc.Bytes, Files: fc.Files,
	}, fileID: fc.ID}
	for _, p := range fc.Skipped {
		r.NotCarried = append(r.NotCarried, "file "+p+" (not a regular file)")
	}
	c.list = append(c.list, r)
	c.mu.Unlock()
	s.trimAuto(ctx, kc, s.autoCheckpoints())
	if err := s.fit(ctx, kc, r); err != nil {
		return nil, err
	}
	return r, nil
}

func (s *Session) countCheckpoints(auto bool) int {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.list {
		if r.Auto == auto {
			n++
		}
	}
	return n
}

// trimAuto drops the oldest automatic checkpoints beyond keep.
func (s *Session) trimAuto(ctx context.Context, kc kernelCheckpoints, keep int) {
	for s.countCheckpoints(true) > keep {
		if r := s.oldestAuto(nil); r != nil {
			s.drop(ctx, kc, r)
		}
	}
}

// oldestAuto is the oldest automatic checkpoint other than except.
func (s *Session) oldestAuto(except *cpRecord) *cpRecord {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.list {
		if r.Auto && r != except {
			return r
		}
	}
	return nil
}

// fit keeps what the checkpoints hold (their kernel copies' private memory
// and their files' distinct bytes) within CheckpointMemory: the oldest
// automatic ones go first; if the new one still does not fit it goes too,
// and a named one is then a *LimitError.
func (s *Session) fit(ctx context.Context, kc kernelCheckpoints, added *cpRecord) error {
	limit := s.checkpointMemory()
	if measureOnRequest {
		c := &s.cps
		c.mu.Lock()
		estimate := c.memory + c.store.HeldBytes()
		recent := time.Since(c.measured) < measureEvery
		c.mu.Unlock()
		if recent && estimate <= limit/2 {
			return nil
		}
	} else {
		// The background figures (cpmeasure.go): fresh ones within the
		// bound, or ones under a second old far from it, need no measure
		// here; a running measure is waited for rather than repeated.
		for {
			held, stale, oldest, running := s.estimateHeld()
			if held <= limit && (!stale || time.Since(oldest) < measureEvery && held <= limit/2) {
				return nil
			}
			if held > limit || !stale || running == nil {
				break
			}
			select {
			case <-running:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	for {
		held, err := s.measure(ctx, kc)
		if err != nil {
			return err
		}
		if held <= limit {
			return nil
		}
		if old := s.oldestAuto(added); old != nil {
			s.log.Info("checkpoint memory over its bound: dropping the oldest automatic checkpoint", "checkpoint", old.ID, "held", held, "limit", limit)
			s.drop(ctx, kc, old)
			continue
		}
		s.drop(ctx, kc, added)
		what := "an automatic checkpoint"
		if !added.Auto {
			what = "the checkpoint"
		}
		return &LimitError{Name: "checkpoint memory", Requested: bytesText(held), Max: bytesText(limit),
			Reason: fmt.Sprintf("%s was not kept: with it the session's checkpoints would hold %s of memory and files, above this server's bound of %s per session; delete checkpoints, or keep less in memory or in the workspace", what, bytesText(held), bytesText(limit))}
	}
}

// measure updates each checkpoint's MemoryBytes and returns what all of
// them hold. A checkpoint whose copy is gone (the OOM killer) is dropped.
func (s *Session) measure(ctx context.Context, kc kernelCheckpoints) (int64, error) {
	mem, err := kc.CheckpointMemory(ctx)
	if err != nil {
		return 0, s.kernelErr("measure checkpoints", err)
	}
	now := time.Now().UTC()
	c := &s.cps
	c.mu.Lock()
	var held int64
	var gone []*cpRecord
	for _, r := range c.list {
		if r.Fresh {
			continue // no copy of the kernel
		}
		m, ok := mem[r.kernelID]
		if !ok {
			gone = append(gone, r)
			continue
		}
		r.MemoryBytes, r.MemoryMeasuredAt = m, now
		held += m
	}
	c.measured, c.memory = now, held
	if c.store != nil {
		held += c.store.HeldBytes()
	}
	c.mu.Unlock()
	for _, r := range gone {
		s.log.Warn("a checkpoint's kernel copy is gone: forgetting it", "checkpoint", r.ID)
		s.drop(ctx, kc, r)
	}
	return held, nil
}

// drop forgets r, freeing its kernel copy and its files.
func (s *Session) drop(ctx context.Context, kc kernelCheckpoints, r *cpRecord) {
	if r.Fresh {
		s.forget(r)
		return
	}
	if err := kc.DropCheckpoint(context.WithoutCancel(ctx), r.kernelID); err != nil && !errors.Is(err, errCheckpointGone) {
		s.log.Warn("drop a checkpoint's kernel copy", "checkpoint", r.ID, "err", err)
	}
	s.forget(r)
}

// forget drops r from the list and frees its files (its kernel copy is
// gone already).
func (s *Session) forget(r *cpRecord) {
	c := &s.cps
	c.mu.Lock()
	for i, x := range c.list {
		if x == r {
			c.list = append(c.list[:i], c.list[i+1:]...)
			break
		}
	}
	st := c.store
	c.mu.Unlock()
	if st != nil {
		if err := st.Drop(r.fileID); err != nil {
			s.log.Warn("drop a checkpoint's files", "checkpoint", r.ID, "err", err)
		}
	}
}

// find returns checkpoint id.
func (s *Session) find(id string) (*cpRecord, error) {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.list {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, &notFoundError{fmt.Sprintf("checkpoint %q not found in session %s (GET its checkpoints to list them)", id, s.id)}
}

// kernelErr words a kernel's failure during a checkpoint call.
func (s *Session) kernelErr(what string, err error) error {
	if k, kerr := s.kernel(); kerr == nil && k.Err() != nil {
		if s.isClosed() {
			return ErrClosed
		}
		return fmt.Errorf("%w: %w", ErrRestartRequired, k.Err())
	}
	return fmt.Errorf("session %s: %s: %w", s.id, what, err)
}

// RestoreCheckpoint puts the session back exactly at checkpoint id: its
// kernel's memory and its workspace's files (files written since are
// gone, deleted ones back). The checkpoint is kept (it can be restored
// again), and so are the ones taken after it. It waits for a running
// execution to end.
func (s *Session) RestoreCheckpoint(ctx context.Context, id string) (*Restored, error) {
	if err := s.acquireRunning(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	r, err := s.find(id)
	if err != nil {
		return nil, err
	}
	res, err := s.restore(ctx, r, "checkpoint "+r.ID, false)
	if err == nil {
		s.noteRestored(Event{Type: EventCheckpointRestored, Checkpoint: r.ID}, res)
	}
	return res, err
}

// Undo reverts the last execution: the session goes back to its newest
// automatic checkpoint (taken just before that execution), which is then
// dropped, so a second Undo reverts the execution before.
func (s *Session) Undo(ctx context.Context) (*Restored, error) {
	if err := s.acquireRunning(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	c := &s.cps
	c.mu.Lock()
	var r *cpRecord
	for i := len(c.list) - 1; i >= 0; i-- {
		if c.list[i].Auto {
			r = c.list[i]
			break
		}
	}
	c.mu.Unlock()
	if r == nil {
		why := "the session takes none (create it with checkpoints \"auto\")"
		if s.CheckpointMode() == CheckpointsAuto {
			why = "none is left (each undo uses one; a restart drops them all)"
		}
		return nil, &notFoundError{"nothing to undo: undo goes back to the automatic checkpoint taken before the last execution, and " + why}
	}
	res, err := s.restore(ctx, r, "undo", true)
	if err == nil {
		s.noteRestored(Event{Type: EventUndone}, res)
	}
	return res, err
}

// restore puts the session back at r, under the turn: the kernel and the
// files at once, but no file changes where the sandbox sees it before the
// kernel is back (a copy that is gone leaves the files untouched): the
// checkpoint's content of the changed files is written beside them while
// the kernel restores, and put in place after (workspace.PreparedRestore).
// With drop, r is used up (an undo): its kernel copy becomes the live
// kernel without leaving a copy to restore again, and r is forgotten.
func (s *Session) restore(ctx context.Context, r *cpRecord, from string, drop bool) (*Restored, error) {
	if r.Fresh {
		return s.restoreFresh(ctx, r, from, drop)
	}
	kc, err := s.liveCheckpoints()
	if err != nil {
		return nil, err
	}
	st, ws, err := s.checkpointFiles()
	if err != nil {
		return nil, err
	}
	var prep *workspace.PreparedRestore
	var perr error
	prepared := make(chan struct{})
	go func() {
		defer close(prepared)
		t0 := time.Now()
		prep, perr = st.PrepareRestore(ws, r.fileID)
		forkStage("restore-files-prepare", t0)
	}()
	t0 := time.Now()
	var ki *kernelCheckpointInfo
	if drop {
		ki, err = kc.RestoreAndDrop(ctx, r.kernelID)
	} else {
		ki, err = kc.Restore(ctx, r.kernelID)
	}
	forkStage("restore-kernel", t0)
	<-prepared
	if err != nil && perr == nil {
		prep.Abort()
	}
	if lost := (*lostCheckpoint)(nil); errors.As(err, &lost) {
		s.drop(ctx, kc, r)
		return nil, &notFoundError{fmt.Sprintf("checkpoint %s is gone: its copy of the kernel could not be made after it was taken (%s); it is deleted", r.ID, lost.Why)}
	}
	if errors.Is(err, errCheckpointGone) {
		s.drop(ctx, kc, r)
		return nil, &notFoundError{fmt.Sprintf("checkpoint %s is gone: its copy of the kernel was killed (most likely by the out-of-memory killer: the session's memory limit counts what checkpoints hold)", r.ID)}
	}
	if err != nil {
		return nil, s.kernelErr("restore "+r.ID, err)
	}
	t0 = time.Now()
	if perr == nil {
		_, err = prep.Commit()
	} else {
		s.log.Warn("restore the workspace without preparing it", "checkpoint", r.ID, "err", perr)
		_, err = st.Restore(ws, r.fileID)
	}
	if drop {
		s.forget(r)
	}
	if err != nil {
		return nil, fmt.Errorf("session %s: restore the workspace of %s (the kernel's state was restored): %w", s.id, r.ID, err)
	}
	forkStage("restore-files", t0)
	res := &Restored{From: from, Files: r.Files, ExecutionCount: ki.ExecutionCount, NotRestored: append([]string(nil), r.NotCarried...)}
	s.setRestored(res)
	out := *res
	return &out, nil
}

// restoreFresh restores r, a Fresh checkpoint, under the turn: a new
// kernel from the session's launcher replaces the live one, as Restart
// does (the live kernel's end ends its sandbox: the new kernel comes in a
// fresh one), and the files come back as r holds them. The live kernel's
// other checkpoints are copies of it and end with it: they are dropped,
// and the result says so, with what a fresh sandbox does not keep.
func (s *Session) restoreFresh(ctx context.Context, r *cpRecord, from string, drop bool) (*Restored, error) {
	st, ws, err := s.checkpointFiles()
	if err != nil {
		return nil, err
	}
	old, err := s.kernel()
	if err != nil {
		return nil, err
	}
	c := &s.cps
	c.mu.Lock()
	var others []*cpRecord
	for _, x := range c.list {
		if x != r && !x.Fresh {
			others = append(others, x)
		}
	}
	c.mu.Unlock()
	s.dropWarm()
	old.Retire("the session went back to its start: a fresh kernel replaces this one")
	old.Close()
	notRestored := append([]string(nil), r.NotCarried...)
	notRestored = append(notRestored, "processes, /tmp and /dev/shm of the sandbox (ended and emptied: going back to before the first cell starts a fresh kernel in a fresh sandbox)")
	for _, x := range others {
		s.forget(x)
		notRestored = append(notRestored, "checkpoint "+x.ID+" (dropped: it was a copy of the kernel that the fresh one replaced)")
	}
	t0 := time.Now()
	k, err := s.start(ctx)
	forkStage("restore-kernel", t0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRestartRequired, err)
	}
	if err := s.install(k); err != nil {
		return nil, err
	}
	if err := s.keepLocked(); err != nil {
		s.log.Warn("keeper: the fresh kernel is not kept", "err", err)
	}
	t0 = time.Now()
	_, err = st.Restore(ws, r.fileID)
	if drop {
		s.forget(r)
	}
	if err != nil {
		return nil, fmt.Errorf("session %s: restore the workspace of %s (a fresh kernel was started): %w", s.id, r.ID, err)
	}
	forkStage("restore-files", t0)
	res := &Restored{From: from, Files: r.Files, NotRestored: notRestored}
	s.setRestored(res)
	out := *res
	return &out, nil
}

// DeleteCheckpoint frees checkpoint id.
func (s *Session) DeleteCheckpoint(ctx context.Context, id string) error {
	if err := s.acquireRunning(ctx); err != nil {
		return err
	}
	defer s.release()
	r, err := s.find(id)
	if err != nil {
		return err
	}
	k, err := s.kernel()
	if err != nil {
		return err
	}
	kc := checkpointsOf(k)
	s.drop(ctx, kc, r)
	return nil
}

// autoCheckpoint takes the checkpoint before an execution in "auto" mode,
// under Execute's turn. Failing to take it does not stop the execution
// (its undo will not be there; the log says why).
func (s *Session) autoCheckpoint(ctx context.Context) {
	if s.CheckpointMode() != CheckpointsAuto {
		return
	}
	if s.quota != nil && s.quota.Enforced {
		// A workspace larger than the bound would be copied only to be
		// dropped, before every cell: say so instead (statfs is cheap).
		if u, err := s.quota.Usage(); err == nil && u.Bytes > s.checkpointMemory() {
			s.log.Warn("no automatic checkpoint before this execution: the workspace alone is larger than the checkpoint bound", "workspace", u.Bytes, "limit", s.checkpointMemory())
			return
		}
	}
	if _, err := s.checkpoint(ctx, "", true); err != nil {
		s.log.Warn("no automatic checkpoint before this execution: it cannot be undone", "err", err)
	}
}
