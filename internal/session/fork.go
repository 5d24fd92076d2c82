package session

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/workspace"
)

// ForkOptions choose what a Fork copies.
type ForkOptions struct {
	// Count is how many sessions to make, 1 to MaxForks. If zero, 1.
	Count int
	// Checkpoint, if set, is the parent's checkpoint to fork from
	// instead of its state now.
	Checkpoint string
}

// forkSource is what a fork copies from its parent: its variables,
// serialized once into a state file in memory, and its files, as a
// checkpoint in the parent's store.
type forkSource struct {
	owner      *Session
	parent     string
	serial     uint64             // state's, among the session's state files (exportCache)
	bases      []kernel.StateBase // earlier exports given to this one (its own copies of the files)
	refs       []kernel.StateBase // those of bases the export refers to: its children need them
	from       string
	live       bool           // the live kernel's variables (not a checkpoint's)
	remap      *os.File       // state's copy for the parent's remap after the fork (remapLater), if any
	state      *os.File       // the serialized variables (kernel.NewStateFile), sealed once complete
	export     *kernel.Export // streaming into state
	streamed   chan struct{}  // closed when the export has ended (exported or exportErr set)
	exported   *stateManifest
	exportErr  error
	store      *workspace.CheckpointStore
	fileID     string       // a handle of the parent's store, dropped after the fork (copy path, or a checkpoint's)
	frozen     *frozenFiles // the children's shared lower layer (overlay path), held until the fork ends
	files      int
	notCarried []string
}

// stream copies the export to the state file, seals it, and closes
// streamed.
func (f *forkSource) stream(ctx context.Context) {
	defer close(f.streamed)
	f.exported, f.exportErr = f.export.Wait(ctx)
	if f.exportErr == nil {
		f.exportErr = kernel.SealStateFile(f.state)
	}
	if f.exportErr != nil {
		return
	}
	for _, n := range f.exported.Refs {
		i := slices.IndexFunc(f.bases, func(b kernel.StateBase) bool { return b.Serial == n })
		if i < 0 {
			f.exportErr = fmt.Errorf("the export refers to state file %d, which it was not given", n)
			return
		}
		f.refs = append(f.refs, f.bases[i])
	}
	f.owner.remap.last.Store(f.exported)
	// The next fork of the parent compares its buffers with these.
	f.owner.exports.keep(append([]kernel.StateBase{{Serial: f.serial, File: f.state}}, f.refs...), f.owner.exportBound())
	if f.live && len(f.exported.Remap) > 0 && !noRemap.Load() {
		// And, after the fork, its buffers become mappings of this file
		// where they are still equal to it: that comparison then needs
		// none of their bytes.
		if c, err := dupFile(f.state); err == nil {
			f.remap = c
		}
	}
}

// wait returns once the variables are all in the state file.
func (f *forkSource) wait(ctx context.Context) error {
	select {
	case <-f.streamed:
		if f.exportErr != nil {
			return fmt.Errorf("session %s: export its variables: %w", f.parent, f.exportErr)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *forkSource) close() {
	if f.export != nil {
		f.export.Close()
	}
	if f.streamed != nil {
		<-f.streamed
	}
	if f.state != nil {
		f.state.Close() // the children's mappings keep what they use
	}
	if f.remap != nil {
		f.remap.Close()
	}
	closeBases(f.bases)
	if f.fileID != "" {
		f.store.Drop(f.fileID)
	}
	if f.frozen != nil {
		f.frozen.release() // the children hold their own
	}
}

// Fork makes o.Count new sessions for owner, each with the variables and
// the files of owner's session id (or of its checkpoint o.Checkpoint).
// Each is created as Create makes any session (pooled, zygote-forked or
// cold, with the parent's limits, environment, network and checkpoint
// mode) and is as isolated as any: its own jail, workspace and cgroup;
// what one writes, the parent and the others never see.
//
// The variables cross by serialization in the kernel (the C pickler
// first, dill where installed for what it refuses; modules by name),
// written once by a forked copy of the parent's kernel, and its files are
// copied once (see Files below). The parent's turn is held for bringing
// that copy up to date and the kernel's fork() only: the copy streams the
// state on the kernel's state channel into a state file in memory (a
// memfd) while the parent runs on and the children start. Once the state
// is complete the file is sealed and every child maps it copy-on-write
// (kernel.ImportStateFile): the large buffers (numpy arrays, pandas
// blocks) are loaded over the mapping, not copied, so the children share
// those pages until one writes to them, and a child's write stays its
// own.
//
// The session keeps its last export (exportCache): the next fork's copy
// compares each large buffer with the one at the same place in it and
// writes a reference to those bytes instead of a copy when they are equal
// (kernel.StartExportOver), so a DataFrame unchanged since the last fork
// costs a read of its memory, not 100 MB of new pages; the children map
// the earlier file for it. A child keeps the files it was loaded from in
// the same way, so its own forks refer to them, and for a child nothing
// is read: its buffers lie over its mappings of those files, and a buffer
// whose pages are all still the file's own (not written since the
// import; /proc/self/pagemap) is proven equal by that alone (a fork of a
// child holding the 100 MB DataFrame: export 4-10x shorter, the fork
// ~2-3x, see docs/benchmarks.md). The parent's own buffers (anonymous memory) carry
// no such proof (soft-dirty is not built into this kernel, userfaultfd's
// write-protect mode is refused by the jail's seccomp), so after a fork
// of the live kernel its large buffers are made mappings of the export's
// file where they still equal it (remapLater, remap.go; the kernel
// compares each run of pages right before mapping it, between cells,
// with no other thread of its own: kernel.RemapExport and the package
// doc), off the fork's path, in pieces under the parent's turn (a cell
// waits for one piece at most); its next fork then proves them unchanged
// by their pages, as a child's. Their pages leave the session's memory
// charge (they are the state file's, the server's) until it writes them.
// So one child's fork of a parent is the parent's fork(), then the export
// (by pages where remapped, else the compare: 20-40 ms of CPU for 100
// MB, a read of both copies), then the import; the child's session is
// created meanwhile (Create runs beside the export). Of a child, the export takes about as
// long as the Create, and both follow the parent's fork(): starting the
// children beside the parent's turn was tried and gave nothing on a busy
// 2-core machine (the work is CPU-bound). Trade-off: the
// last export stays in the host's memory (not charged to the session,
// like every fork's state file) until the session forks again or closes,
// even once its children are gone.
//
// Files (ManagerOptions.ForkFiles, forkfiles.go). Where it runs (root,
// workspaces that are host tmpfs mounts; doctor says), the children share
// one read-only copy of the parent's files: the fork copies the parent's
// workspace once, plainly (no hashing), into a tmpfs of the server's own
// (jail.NewFrozenDir), remounts it read-only, and each child's workspace
// is its own capped tmpfs with an overlayfs over it, mounted by Create
// before the child's jail attaches it (a cold jail clones the mount on
// the path; the zygote's spare gets a detached clone of it): the frozen
// copy is the lower layer, the upper and work directories are in the
// child's tmpfs. A child reads the shared pages; what it writes (new
// files, a shared file it changes, copied up whole at its first write,
// and a whiteout per shared file it deletes) goes to its own tmpfs,
// charged to its cgroup and bounded by its caps, and nobody else sees
// it. Its usage (Session.Usage, the files API's size cap) counts its own
// layer only, not the shared files; listings, snapshots, checkpoints and
// restores see the merged view (a restore writes and whites out in the
// child's layer). The copy is made before the parent's turn, while it may
// still run (preFreeze), and brought up to date in its turn (a walk of
// the workspace comparing inode, size, mode and times, and a copy of
// only what changed since or was changing; TreeCopy.Update), so the turn
// holds no bulk copy and no hashing. The parent keeps its last fork's
// copy (as it keeps its last export) until it closes or forks changed
// files, and a fork of files unchanged since reuses it, children or not;
// a copy is removed once neither a child using it nor the parent keeping
// it is left (the kernel frees its pages when the last overlay over it
// goes). Its pages are the server's (like the state file), at most one
// parent's Disk per fork with a child alive, plus the parent's last. A
// child that has written no file (its upper layer empty,
// jail.QuotaDir.OverlayUnwritten) shows exactly its lower layer: its own
// forks take that as it is, no copy. A file written through a shared writable mapping without a
// write(2) keeps its times and may be taken as unchanged (as the
// checkpoint store would). Where the overlay cannot run (without root:
// an overlay in the quota holder's user namespace is not built), or with
// ForkFilesCopy, each child's workspace gets a copy of the files from a
// checkpoint of the parent's store (Restored.FilesBy says which ran).
//
// What did not cross (a name that does not serialize, the parent's
// threads and child processes) is listed in the Restored report, which
// each child also keeps (Session.Restored).
//
// A fork waits for a running execution of the parent to end. The children
// are made four at a time (their jails and files), and each loads the
// state once it is complete; if one fails, none is kept. The
// children count toward MaxSessions (ErrCapacity if they do not all fit),
// and more than MaxForks is a *LimitError.
func (m *Manager) Fork(ctx context.Context, owner, id string, o ForkOptions) ([]*Managed, *Restored, error) {
	n := o.Count
	switch {
	case n == 0:
		n = 1
	case n < 0:
		return nil, nil, &ArgumentError{"count", fmt.Errorf("%d: a fork makes 1 to %d sessions", n, MaxForks)}
	case n > MaxForks:
		return nil, nil, &LimitError{Name: "fork count", Requested: fmt.Sprint(n), Max: fmt.Sprint(MaxForks),
			Reason: fmt.Sprintf("a fork makes at most %d sessions; %d were asked for", MaxForks, n)}
	}
	parent, err := m.Get(owner, id)
	if err != nil {
		return nil, nil, err
	}
	release, err := parent.use()
	if err != nil {
		return nil, nil, err
	}
	defer release()
	m.mu.Lock()
	room := m.opts.MaxSessions - len(m.sessions)
	m.mu.Unlock()
	if room < n {
		return nil, nil, fmt.Errorf("%w: a fork into %d sessions needs %d free, %d are", ErrCapacity, n, n, max(room, 0))
	}
	t0 := time.Now()
	start := t0 // of the fork, for the stages' "at-" times
	overlay := m.forkOverlay(parent.Session)
	var pre *preFrozen
	if overlay && o.Checkpoint == "" {
		// The files are copied before the parent's turn, while it may
		// still run; its turn only brings the copy up to date.
		t0 := time.Now()
		if pre, err = parent.Session.preFreeze(); err != nil {
			return nil, nil, err
		}
		forkStage("source-prefreeze", t0)
	}
	src, err := parent.Session.forkSource(ctx, o.Checkpoint, overlay, pre)
	if err != nil {
		return nil, nil, err
	}
	defer src.close()
	forkStage("source", t0)
	if src.frozen != nil {
		if err := parent.Session.publishFrozen(src.frozen); err != nil {
			return nil, nil, err
		}
	} else if overlay {
		// From a checkpoint: its files, frozen outside the parent's turn.
		t0 := time.Now()
		if src.frozen, err = parent.Session.frozenFromCheckpoint(src.store, src.fileID); err != nil {
			return nil, nil, err
		}
		forkStage("source-frozen", t0)
	}
	// The parent is free again: its state streams to the state file while
	// the children start.
	go func() {
		t0 := time.Now()
		src.stream(ctx)
		forkStage("export", t0)
		forkStage("at-exported", start)
	}()

	children := make([]*Managed, n)
	reports := make([]*Restored, n)
	errs := make([]error, n)
	sem := make(chan struct{}, min(n, 4)) // starting jails and copying files is CPU work: a few at once
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			var once sync.Once
			free := func() { once.Do(func() { <-sem }) }
			defer free()
			t0 := time.Now()
			child, err := m.Create(ctx, CreateOptions{
				Owner: owner, Limits: parent.Limits, Env: parent.Session.opts.Env, Network: parent.Network,
				Egress: parent.Egress, ExecTimeout: parent.ExecTimeout, Checkpoints: parent.CheckpointMode(),
				PortAccess: PortAccess{Public: parent.PortAccess.Public, HostMask: parent.PortAccess.HostMask, TLSPorts: parent.PortAccess.TLSPorts}, // a token, if any, is the child's own
				frozen:     src.frozen,
				forkOf:     id,
			})
			if err != nil {
				errs[i] = err
				return
			}
			children[i] = child
			forkStage("create", t0)
			forkStage("at-created", start)
			if parent.Egress != nil {
				// The list in force now, which may have changed since the
				// parent was created (SetAllowlist).
				if err := child.SetAllowlist(parent.Allowlist()); err != nil {
					errs[i] = err
					return
				}
			}
			release := child.Lease()
			defer release()
			reports[i], errs[i] = child.Session.adopt(ctx, src, free)
			if errs[i] == nil && !child.events.begun() { // (begun: lost as it was made, see sleepLost)
				r := *reports[i]
				child.note(Event{Type: EventCreated, How: CreatedFork, Parent: id, Template: child.Template, Restored: &r})
			}
			forkStage("at-imported", start)
		})
	}
	wg.Wait()
	defer forkStage("at-done", start)
	if err := errors.Join(errs...); err != nil {
		src.export.Close() // if it still streams
		for _, c := range children {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, err
	}
	if src.remap != nil {
		parent.Session.remapLater(src.remap, src.exported.Remap)
		src.remap = nil
	}
	ids := make([]string, n)
	for i, c := range children {
		ids[i] = c.ID()
	}
	e := Event{Type: EventForked, Children: ids}
	if o.Checkpoint != "" {
		e.Checkpoint = o.Checkpoint
	}
	parent.note(e)
	m.log.Info("session forked", "session", id, "children", n, "from", src.from)
	return children, reports[0], nil
}

// forkOverlay says whether a fork of parent gives its children its files
// as overlays over one frozen copy (ManagerOptions.ForkFiles).
func (m *Manager) forkOverlay(parent *Session) bool {
	if m.opts.ForkFiles == ForkFilesCopy || m.opts.Keeper != nil || m.opts.DefaultTemplate != "" {
		return false
	}
	if how, _ := ForkFilesSupport(); how != ForkFilesOverlay {
		return false
	}
	// The frozen copy is sized by the parent's own capped workspace.
	return parent.quota != nil && parent.quota.Enforced
}

// forkSource serializes the session's variables and checkpoints its files
// (or takes both from checkpoint cp), under its turn.
func (s *Session) forkSource(ctx context.Context, cp string, overlay bool, pre *preFrozen) (*forkSource, error) {
	if err := s.acquireRunning(ctx); err != nil {
		if pre != nil {
			pre.close()
		}
		return nil, err
	}
	defer s.release()
	defer func() {
		if pre != nil { // not taken
			pre.close()
		}
	}()
	kc, err := s.liveCheckpoints()
	if err != nil {
		return nil, err
	}
	st, ws, err := s.checkpointFiles()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	defer forkStage("source-turn", t0)
	src := &forkSource{owner: s, parent: s.id, store: st, from: "fork of " + s.id, serial: stateSerial.Add(1)}
	ok := false
	defer func() {
		if !ok {
			src.close()
		}
	}()
	from := 0 // the live kernel
	if cp != "" {
		r, err := s.find(cp)
		if err != nil {
			return nil, err
		}
		if r.Fresh {
			return nil, &ArgumentError{"checkpoint", fmt.Errorf("%s was taken before the session's first cell and holds no copy of its kernel, so there is nothing to fork from it: create new sessions instead, or fork a later checkpoint or the session itself", r.ID)}
		}
		src.from = "checkpoint " + r.ID + " of " + s.id
		from = r.kernelID
		if src.fileID, err = st.Dup(r.fileID); err != nil {
			return nil, err
		}
		src.files, src.notCarried = r.Files, append([]string(nil), r.NotCarried...)
	} else if overlay {
		// One plain copy for all the children (or the last one, if
		// nothing changed since): their workspaces are overlays over it.
		p := pre
		pre = nil
		if src.frozen, err = s.freezeFiles(ws, p); err != nil {
			return nil, err
		}
		src.files = src.frozen.copy.Files
		if src.frozen != s.frozen.Load() { // its own lower layer has none of them
			for _, p := range src.frozen.copy.Skipped {
				src.notCarried = append(src.notCarried, "file "+p+" (not a regular file)")
			}
		}
	} else {
		fc, err := st.Take(ws)
		if err != nil {
			return nil, fmt.Errorf("session %s: copy the workspace for a fork: %w", s.id, err)
		}
		src.fileID, src.files = fc.ID, fc.Files
		for _, p := range fc.Skipped {
			src.notCarried = append(src.notCarried, "file "+p+" (not a regular file)")
		}
	}
	forkStage("source-files", t0)
	if src.state, err = kernel.NewStateFile(fmt.Sprintf("sandloop-fork-%s-%d", s.id, src.serial)); err != nil {
		return nil, fmt.Errorf("session %s: fork: %w", s.id, err)
	}
	// The kernel forks a copy that serializes the variables, and answers:
	// the files taken above and the variables are of the same moment.
	// The copy streams them to the state file after this turn.
	if from == 0 {
		src.bases = s.exports.get()
		src.live = true
	}
	src.export, err = kc.StartExportOver(ctx, src.state, from, from == 0, src.bases)
	if err != nil {
		return nil, s.kernelErr("export its variables", err)
	}
	src.streamed = make(chan struct{})
	for _, t := range src.export.Threads {
		src.notCarried = append(src.notCarried, "thread "+t)
	}
	for _, p := range src.export.Processes {
		src.notCarried = append(src.notCarried, "process "+p+" (stays with the parent)")
	}
	ok = true
	return src, nil
}

// adopt gives a new session src's files and variables, under its turn.
// filesDone is called once the files are in: the wait for the state and
// the import (milliseconds: a mapping) need no slot of the fork's bound
// on children started at once.
func (s *Session) adopt(ctx context.Context, src *forkSource, filesDone func()) (*Restored, error) {
	if err := s.acquireRunning(ctx); err != nil {
		return nil, err
	}
	defer s.release()
	k, err := s.kernel()
	if err != nil {
		return nil, err
	}
	kc := checkpointsOf(k)
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	filesBy := ForkFilesCopy
	if src.frozen != nil && s.frozen.Load() == src.frozen {
		filesBy = ForkFilesOverlay // its workspace is an overlay over them already
	} else if src.fileID == "" {
		err = errors.New("its workspace is not an overlay over the fork's files")
	} else {
		_, err = src.store.Restore(ws, src.fileID)
	}
	ws.Close()
	forkStage("files", t0)
	filesDone()
	if err != nil {
		return nil, fmt.Errorf("session %s: copy the files of %s: %w", s.id, src.parent, err)
	}
	// The variables, mapped from the state file once it is complete.
	if err := src.wait(ctx); err != nil {
		return nil, err
	}
	t0 = time.Now()
	imported, err := kc.ImportStateFiles(ctx, src.state, src.refs)
	forkStage("import", t0)
	if err != nil {
		return nil, s.kernelErr("import the variables of "+src.parent, err)
	}
	// The child's buffers are mappings of these files: its own first fork
	// compares against them rather than copying them again.
	s.exports.keep(append([]kernel.StateBase{{Serial: src.serial, File: src.state}}, src.refs...), s.exportBound())
	res := &Restored{From: src.from, Files: src.files, FilesBy: filesBy, Variables: imported.Variables, ExecutionCount: imported.ExecutionCount}
	said := map[string]bool{}
	for _, ns := range append(append([]notSaved(nil), imported.NotSaved...), src.exported.NotSaved...) {
		if !said[ns.Name] { // the import repeats what the export could not save
			said[ns.Name] = true
			res.NotRestored = append(res.NotRestored, ns.Name+": "+ns.Reason)
		}
	}
	res.NotRestored = append(res.NotRestored, src.notCarried...)
	s.setRestored(res)
	out := *res
	return &out, nil
}

// stateSerial names the state files of forks (kernel.StateBase).
var stateSerial atomic.Uint64

// exportCache keeps a session's last fork export, sealed (and the earlier
// ones it refers to), so that the next fork's export refers to the
// buffers that have not changed since instead of copying them again
// (kernel.StartExportOver): a 100 MB DataFrame untouched between two
// forks is compared, not copied. The files are in the host's memory (not
// the session's, like every fork's state file) until the next fork
// replaces them or the session closes; the pages are shared with the
// children that mapped them.
type exportCache struct {
	mu     sync.Mutex
	bases  []kernel.StateBase // [0] the last export, then the files it refers to; the cache's own descriptors
	closed bool
}

// get returns copies of the cached files (the caller closes them), nil if
// none.
func (c *exportCache) get() []kernel.StateBase {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []kernel.StateBase
	for _, b := range c.bases {
		f, err := dupFile(b.File)
		if err != nil {
			closeBases(out)
			return nil
		}
		out = append(out, kernel.StateBase{Serial: b.Serial, File: f})
	}
	return out
}

// keep replaces the cache with copies of bases. More than the kernel takes
// at once, or more than bound bytes in all (if bound > 0), empties it: the
// next export copies everything again and starts a new chain. (A chain
// keeps each earlier file whole for the buffers of it still referred to:
// without the bound, forks that each change all but a small array could
// keep a dozen files of the session's size in the server's memory.)
func (c *exportCache) keep(bases []kernel.StateBase, bound int64) {
	var mine []kernel.StateBase
	if len(bases) <= kernel.MaxStateBases && (bound <= 0 || statesSize(bases) <= bound) {
		for _, b := range bases {
			f, err := dupFile(b.File)
			if err != nil {
				closeBases(mine)
				mine = nil
				break
			}
			mine = append(mine, kernel.StateBase{Serial: b.Serial, File: f})
		}
	}
	c.mu.Lock()
	old := c.bases
	if c.closed {
		old, mine = mine, nil
	}
	c.bases = mine
	c.mu.Unlock()
	closeBases(old)
}

func (c *exportCache) close() {
	c.mu.Lock()
	old := c.bases
	c.bases, c.closed = nil, true
	c.mu.Unlock()
	closeBases(old)
}

// exportBound bounds the bytes of the state files the session's export
// cache keeps (exportCache.keep): twice its memory limit, what it may hold
// with its remapped buffers (remapFits); none without a limit.
func (s *Session) exportBound() int64 {
	return 2 * s.opts.Limits.WithDefaults().Memory
}

// statesSize is the bytes of the files of bases (a file it cannot stat
// counts as unbounded).
func statesSize(bases []kernel.StateBase) int64 {
	var n int64
	for _, b := range bases {
		fi, err := b.File.Stat()
		if err != nil {
			return math.MaxInt64
		}
		n += fi.Size()
	}
	return n
}

func closeBases(bases []kernel.StateBase) {
	for _, b := range bases {
		b.File.Close()
	}
}

// forkStageHook, if set (by benchmarks), is told how long each stage of a
// fork took: "source" (the parent's part, lease included), "source-turn"
// (under its turn), "source-files" (its files' checkpoint), "export" (the
// state written), and per child "create", "files", "import"; and of a
// checkpoint ("checkpoint-kernel", "checkpoint-files") and a restore
// ("restore-kernel", "restore-files"). The "at-" stages are times since
// the fork began: "at-exported" (the state sealed), per child
// "at-created" and "at-imported", and "at-done" (the fork returns).
var forkStageHook func(stage string, d time.Duration)

func forkStage(stage string, since time.Time) {
	if h := forkStageHook; h != nil {
		h(stage, time.Since(since))
	}
}
