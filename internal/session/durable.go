package session

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
	"golang.org/x/sys/unix"
)

// Sessions brought back from storage (issue 28): when a session's
// processes are lost with the process that held them (a keeper killed, a
// server killed without a keeper), the next server brings the session
// back on the same id from its latest snapshot.
//
// With ManagerOptions.Records, the manager keeps one small file per
// session there (durableRecord: its owner, limits, network, environment,
// its latest snapshot and whether it was used since), written at its
// creation, after every snapshot and at its first use after one; it is
// removed when the session is closed (deleted, reaped, or a shutdown that
// ends sessions), and left when a server lets go of its sessions for the
// next one (Detach). With SnapshotEvery, a session used since its last
// snapshot (an execution, a files call: any lease) is written to the
// snapshot store again, at most once every SnapshotEvery, as an
// automatic snapshot: held (retention leaves it alone), its files
// exactly and its variables as far as they serialize, incremental (only
// changed chunks are stored); the one before it is deleted then. A
// session whose kernel died (restart required) and that was used since
// its latest snapshot has its files written, once its kernel has been
// seen dead for deadGrace and its keeper (if any) still runs, with the
// variables of that snapshot (salvageDead; its record's Salvaged says its
// variables are older than its files, and why). A session is not
// written while a cell runs in it (its files and variables must be of
// one moment), so a long cell's effects wait for its end. After each
// automatic snapshot, what changed in the workspace since it started and
// differs from what it holds (changedSince: work left running wrote after
// the walk passed) keeps the session due.
//
// Manager.KeeperDied, when the keeper dies under a running server, puts
// the sessions whose kernels it spawned to sleep in place, the same way
// (lostState), on a new workspace in the next keeper. Their old
// workspaces outlived the keeper (host directories): each one's files as
// they were are written first to a new automatic snapshot, with the
// variables of its latest one (Session.sleepLost), which it sleeps on
// instead, so that no file written after the latest snapshot is lost; its
// record says so (Salvaged) until a newer snapshot replaces it.
//
// Manager.Restore, at a server's start (after the keeper's sessions are
// taken over), adopts every record whose session is not held: as a
// hibernated session on its snapshot (a hibernated one on its
// hibernation's), which wakes at its first use; Restored then says what
// came back and, for a session whose processes were lost, as of when and
// what was lost (what was done after that snapshot). A session lost
// before its first snapshot comes back empty, saying so. Where the host
// stayed up, the workspace of a session whose processes were lost (a
// server and its keeper killed, or a server without a keeper) outlived
// them: a durable session's workspace is a lasting one
// (jail.NewLastingQuotaDir, named in its record), which sweeps spare for
// jail.LeftoverGrace, and Restore takes its files as KeeperDied does
// (takeLeftover) before it removes it.

// autoSnapshotName names the automatic snapshots.
const autoSnapshotName = "automatic"

// durableRecord is a session's file in ManagerOptions.Records.
type durableRecord struct {
	ID          string            `json:"id"`
	Owner       string            `json:"owner"`
	Created     time.Time         `json:"created"`
	Limits      jail.Limits       `json:"limits"`
	Network     jail.Network      `json:"network,omitempty"`
	Egress      *keptPolicy       `json:"egress,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	ExecTimeout time.Duration     `json:"exec_timeout"`
	PortAccess  PortAccess        `json:"port_access"`
	Template    string            `json:"template,omitempty"`
	Checkpoints string            `json:"checkpoints,omitempty"`
	// Snapshot is the latest snapshot of the session (automatic or its
	// hibernation's), taken at SnapshotAt; "" for none yet.
	Snapshot   string    `json:"snapshot,omitempty"`
	SnapshotAt time.Time `json:"snapshot_at,omitzero"`
	Hibernated bool      `json:"hibernated,omitempty"`
	// UsedAt is the first use after Snapshot (zero: none since).
	UsedAt time.Time `json:"used_at,omitzero"`
	// Salvaged: Snapshot holds a lost session's files as they were when
	// its processes were lost, with the variables of an earlier snapshot
	// (Session.sleepLost); nil for any other snapshot.
	Salvaged *salvageNote `json:"salvaged,omitempty"`
	// Workspace is the session's workspace on the host: a lasting one
	// (jail.NewLastingQuotaDir) outlives a server's (or keeper's) death,
	// and the next server takes its files (adopt).
	Workspace string `json:"workspace,omitempty"`
	// Events are the session's latest events (recordEvents), written at
	// each one: the next server's go on from them.
	Events []Event `json:"events,omitempty"`
}

// recordEvents is how many of a session's latest events its record holds.
const recordEvents = 64

// salvageNote is what a salvaged snapshot lacks: its variables are as of
// VariablesAsOf (zero: it has none), and Lost says what was lost.
type salvageNote struct {
	VariablesAsOf time.Time `json:"variables_as_of,omitzero"`
	Lost          string    `json:"lost,omitempty"`
}

// durableState is a managed session's part of its record.
type durableState struct {
	write sync.Mutex // one record write at a time, in order

	mu         sync.Mutex
	snap       string
	at         time.Time
	hibernated bool
	uses       uint64
	usedAt     time.Time // the first use since snap
	salvaged   *salvageNote
	tried      time.Time // the last automatic snapshot tried
	gone       bool      // the session was closed: no more writes
	commands   int       // commands running (StartCommand): in use until they end
	deadSince  time.Time // when its kernel was first seen dead (zero: alive)
	// The sandbox's CPU time when it was last watched (watched; zero:
	// never), for what runs on in it without a call (backgroundActive).
	cpu     time.Duration
	watched time.Time

	// writing: automatic snapshots holding (or taking) the session's
	// turn, which a Pause then waits for rather than fail busy.
	writing atomic.Int32
}

func (m *Manager) recordPath(id string) string {
	return filepath.Join(m.opts.Records, id+".json")
}

// saveRecord writes ms's record (atomically: a temporary file renamed).
func (m *Manager) saveRecord(ms *Managed) {
	d := ms.durable
	if d == nil {
		return
	}
	d.write.Lock()
	defer d.write.Unlock()
	d.mu.Lock()
	if d.gone {
		d.mu.Unlock()
		return
	}
	rec := m.recordOfLocked(ms)
	d.mu.Unlock()
	b, err := json.Marshal(&rec)
	if err == nil {
		err = writeFileAtomic(m.recordPath(rec.ID), b)
	}
	if err != nil {
		m.log.Warn("record of the session for the next server", "session", rec.ID, "err", err)
	}
}

// recordEventsOf has ms's record written again at each of its events
// (it holds the latest): in the background, as an event may be noted
// under the session's lock, which a record's writing takes. Close waits
// for the writes under way.
func (m *Manager) recordEventsOf(ms *Managed) {
	if ms.durable == nil {
		return
	}
	ms.Session.noted = func() {
		m.recordWrites.add()
		go func() {
			defer m.recordWrites.done()
			m.saveRecord(ms)
		}()
	}
}

// inflight counts work under way in the background, which wait waits
// for (unlike a WaitGroup's, its count may rise from zero while one
// waits: a session closing in the background notes its events late).
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero (nil: no one waits)
}

func (f *inflight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// wait returns once nothing is under way.
func (f *inflight) wait() {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	<-idle
}

// recordOf is ms's record as it stands.
func (m *Manager) recordOf(ms *Managed) durableRecord {
	ms.durable.mu.Lock()
	defer ms.durable.mu.Unlock()
	return m.recordOfLocked(ms)
}

// recordOfLocked is recordOf with ms.durable.mu held.
func (m *Manager) recordOfLocked(ms *Managed) durableRecord {
	d, s := ms.durable, ms.Session
	return durableRecord{ID: ms.ID(), Owner: ms.Owner, Created: ms.Created, Limits: ms.Limits, Network: ms.Network,
		Egress: keptPolicyOf(ms.Egress), Env: s.opts.Env, ExecTimeout: ms.ExecTimeout, PortAccess: ms.PortAccess,
		Template: ms.Template, Checkpoints: s.opts.Checkpoints,
		Snapshot: d.snap, SnapshotAt: d.at, Hibernated: d.hibernated, UsedAt: d.usedAt, Salvaged: d.salvaged,
		Workspace: s.workspaceNow(), Events: s.events.latest(recordEvents)}
}

func writeFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// forget removes the record and the automatic snapshot of a session
// being closed for good.
func (m *Manager) forget(ms *Managed) {
	d := ms.durable
	if d == nil {
		return
	}
	d.write.Lock()
	d.mu.Lock()
	d.gone = true
	snap, hib := d.snap, d.hibernated
	d.mu.Unlock()
	if err := os.Remove(m.recordPath(ms.ID())); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("remove the record of a closed session", "session", ms.ID(), "err", err)
	}
	d.write.Unlock()
	if snap == "" || hib {
		return // a hibernation's snapshot goes with the session (Close)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.opts.Snapshots.Delete(ctx, ms.Owner, snap); err != nil && !errors.Is(err, snapshot.ErrNotFound) {
		m.log.Warn("delete the automatic snapshot of a closed session", "session", ms.ID(), "snapshot", snap, "err", err)
	}
}

// markUsed notes a use of the session (its files or variables may
// change): it is written again at the next automatic snapshot.
func (m *Managed) markUsed() {
	d := m.durable
	if d == nil {
		return
	}
	d.mu.Lock()
	d.uses++
	first := d.usedAt.IsZero()
	if first {
		d.usedAt = time.Now()
	}
	d.mu.Unlock()
	if first {
		m.mgr.saveRecord(m)
	}
}

// backgroundActive says whether ms's sandbox used backgroundCPU or more
// since it was last watched (or snapshotted), noting it as a use from
// then; the first watch only notes the CPU time. False where no cgroup
// measures the sandbox.
func (m *Managed) backgroundActive(now time.Time) bool {
	u, err := m.Session.Resources()
	if err != nil {
		return false
	}
	d := m.durable
	d.mu.Lock()
	since, prev := d.watched, d.cpu
	d.cpu, d.watched = u.CPU, now
	active := !since.IsZero() && u.CPU-prev >= backgroundCPU && d.usedAt.IsZero()
	if active {
		d.usedAt = since
	}
	d.mu.Unlock()
	if active {
		m.Session.log.Info("the session ran without a call since its last snapshot: written again", "cpu", u.CPU-prev)
		m.mgr.saveRecord(m)
	}
	return active
}

// watchedAfter notes ms's sandbox's CPU time after an automatic snapshot
// (which made its kernel work), as the mark backgroundActive measures from.
func (m *Managed) watchedAfter() {
	u, err := m.Session.Resources()
	if err != nil {
		return
	}
	d := m.durable
	d.mu.Lock()
	d.cpu, d.watched = u.CPU, time.Now()
	d.mu.Unlock()
}

// commandStarted notes a command started in the session: it may change
// the files at any time until it ends (a terminal, a server), so the
// session stays due for automatic snapshots while it runs, and its end
// is a use. (The caller waits for p: Done is closed by its Wait.)
func (m *Managed) commandStarted(p *jail.Process) {
	d := m.durable
	if d == nil {
		return
	}
	d.mu.Lock()
	d.commands++
	d.mu.Unlock()
	go func() {
		<-p.Done()
		d.mu.Lock()
		d.commands--
		d.mu.Unlock()
		m.markUsed()
	}()
}

// hibernated notes the snapshot ms hibernated to (its record names it;
// the automatic one before it goes).
func (m *Managed) hibernated(man *snapshot.Manifest) {
	d := m.durable
	if d == nil {
		return
	}
	d.mu.Lock()
	old := d.snap
	if man.ID != old {
		d.salvaged = nil
	}
	d.snap, d.at, d.hibernated, d.usedAt = man.ID, man.CreatedAt, true, time.Time{}
	d.mu.Unlock()
	m.mgr.saveRecord(m)
	m.mgr.deleteSnapshot(m, old, man.ID)
}

// woke notes that ms woke: the snapshot it woke from stays its latest
// (the wake left it in the store). A kept session is handed to the
// keeper again (its new kernel is the keeper's child).
func (m *Managed) woke(ctx context.Context, res *Restored) {
	if d := m.durable; d != nil {
		d.mu.Lock()
		d.hibernated, d.usedAt = false, time.Time{}
		d.mu.Unlock()
		m.mgr.saveRecord(m)
	}
	if m.mgr.opts.Keeper != nil {
		m.mgr.keep(ctx, m)
	}
}

// wokeInUse is woke for a session woken by a call on it (Session.Resume:
// an execution or a files call through the Session, as E2B and MCP make):
// the call is a use, so the session is written again at the next
// automatic snapshot.
func (m *Managed) wokeInUse(res *Restored) {
	if d := m.durable; d != nil {
		d.mu.Lock()
		d.hibernated = false
		if d.usedAt.IsZero() {
			d.usedAt = time.Now()
		}
		d.mu.Unlock()
		m.mgr.saveRecord(m)
	}
	if m.mgr.opts.Keeper != nil {
		m.mgr.keep(context.Background(), m)
	}
}

func (m *Manager) deleteSnapshot(ms *Managed, old, cur string) {
	if old == "" || old == cur {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.opts.Snapshots.Delete(ctx, ms.Owner, old); err != nil && !errors.Is(err, snapshot.ErrNotFound) {
		m.log.Warn("delete a replaced automatic snapshot", "session", ms.ID(), "snapshot", old, "err", err)
	}
}

// autoSnapshotLoop writes the sessions used since their last snapshot,
// until the manager closes.
func (m *Manager) autoSnapshotLoop(every time.Duration) {
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(max(every/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.SnapshotChanged(ctx, every)
	}
}

// backgroundCPU is the CPU time a sandbox must have used since it was
// last watched, without a call, to count as used: what a cell or command
// left running (a thread, a subprocess) may change files. A sleeping
// thread's wake-ups cost ~0.1 ms a second, an idle kernel nothing.
const backgroundCPU = 10 * time.Millisecond

// SnapshotChanged writes an automatic snapshot of every session used
// since its last one and not tried for every, and returns how many it
// wrote. Sessions running a cell, paused or hibernated are skipped. A
// session not used by a call since, but whose sandbox used CPU time
// (backgroundActive), counts as used.
func (m *Manager) SnapshotChanged(ctx context.Context, every time.Duration) int {
	if m.opts.Snapshots == nil {
		return 0
	}
	m.mu.Lock()
	var due, quiet []*Managed
	now := time.Now()
	for _, ms := range m.sessions {
		d := ms.durable
		if ms.Session == nil || d == nil || ms.Session.paused.Load() || ms.Session.hib.on.Load() {
			continue
		}
		d.mu.Lock()
		ready := !d.hibernated && now.Sub(d.tried) >= every
		used := !d.usedAt.IsZero()
		watch := ready && !used && now.Sub(d.watched) >= every
		d.mu.Unlock()
		switch {
		case ready && used:
			due = append(due, ms)
		case watch:
			quiet = append(quiet, ms)
		}
	}
	m.mu.Unlock()
	for _, ms := range quiet {
		if ms.backgroundActive(now) {
			due = append(due, ms)
		}
	}
	n := 0
	for _, ms := range due {
		if ctx.Err() != nil {
			break
		}
		if m.autoSnapshot(ctx, ms) {
			n++
		}
	}
	return n
}

// autoSnapshot writes one automatic snapshot of ms, if its turn is free.
func (m *Manager) autoSnapshot(ctx context.Context, ms *Managed) bool {
	s, d, st := ms.Session, ms.durable, m.opts.Snapshots
	d.writing.Add(1)
	defer d.writing.Add(-1)
	select {
	case s.turn <- struct{}{}:
	default:
		return false // a cell runs: after it
	}
	d.mu.Lock()
	uses := d.uses
	start := time.Now()
	d.tried = start
	d.mu.Unlock()
	fileStart := fileClock()
	var (
		man  *snapshot.Manifest
		note *salvageNote
		err  error
	)
	switch {
	case s.paused.Load() || s.hib.on.Load():
		err = ErrBusy
	case s.Err() != nil:
		// A dead kernel (restart required): its files as they are, with
		// the variables of its latest snapshot; not a kernel lost with
		// its keeper (KeeperDied's), nor a session closed.
		if errors.Is(s.Err(), ErrRestartRequired) && m.kernelDiedAlone(ms, start) {
			man, note, err = m.salvageDead(ctx, ms)
			if err == nil {
				ms.watchedAfter() // what else runs in its sandbox, from now
			}
		} else {
			err = ErrBusy
		}
	default:
		d.mu.Lock()
		d.deadSince = time.Time{}
		d.mu.Unlock()
		man, err = s.writeSnapshot(ctx, st, ms.Owner, autoSnapshotName, true)
		if err == nil {
			ms.watchedAfter()
		}
	}
	if err != nil {
		s.release()
		if !errors.Is(err, ErrBusy) && ctx.Err() == nil {
			m.log.Warn("automatic snapshot", "session", ms.ID(), "err", err)
		}
		return false
	}
	// Anything in the workspace changed while the snapshot was written
	// (work left running, which may then use no CPU for long) may have
	// been missed by its walk: the session stays due.
	if snapshotWrittenHook != nil {
		snapshotWrittenHook(s.workspace)
	}
	changed := changedSince(s.workspace, fileStart, man)
	// Named before the turn is let go: a KeeperDied that takes it next
	// starts from this one, not from the one deleted below.
	d.mu.Lock()
	old := d.snap
	d.snap, d.at, d.salvaged = man.ID, man.CreatedAt, note
	if d.uses == uses && d.commands == 0 && !changed {
		d.usedAt = time.Time{}
	} else {
		d.usedAt = start // used or changed while it was written, or a command runs on
	}
	gone := d.gone
	d.mu.Unlock()
	s.release()
	if gone {
		m.deleteSnapshot(ms, man.ID, "")
		return false
	}
	m.saveRecord(ms)
	m.deleteSnapshot(ms, old, man.ID)
	reason := "automatic: the server writes one of a session used since its last"
	if note != nil {
		reason = "automatic: the session's files as its dead kernel left them, with the variables of its snapshot before"
	}
	ms.note(Event{Type: EventSnapshot, Snapshot: man.ID, Reason: reason})
	if m.opts.OnSnapshot != nil {
		m.opts.OnSnapshot(ms.ID(), man.ID)
	}
	return true
}

// fileClock is the time the kernel stamps files with now: the coarse
// real-time clock, which lags time.Now by up to a tick (a change stamped
// finer is later still).
func fileClock() unix.Timespec {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts) != nil {
		now := time.Now().Add(-time.Second) // (never here: a second's slack)
		ts = unix.NsecToTimespec(now.UnixNano())
	}
	return ts
}

// snapshotWrittenHook, if set (by tests), runs after an automatic
// snapshot is written, before the workspace is checked for changes made
// meanwhile (a test writes there, as work left running would just after
// the walk passed).
var snapshotWrittenHook func(workspace string)

// changedSince reports whether what is under dir differs from man, the
// snapshot just written of it, where something changed at or after t
// (fileClock, read before the snapshot started): the entries whose inode
// changed since t (a write, a chmod, a rename; a directory whose entries
// were made or removed; the change time, unlike the modification time,
// cannot be set by the sandbox) are compared with what man holds of them.
// An entry changed since t that man holds as it is (written just before
// the snapshot) is no change; one changed after the walk read it is.
func changedSince(dir string, t unix.Timespec, man *snapshot.Manifest) bool {
	held := make(map[string]*snapshot.File, len(man.Files))
	children := map[string][]string{}
	for i := range man.Files {
		f := &man.Files[i]
		held[f.Path] = f
		parent := path.Dir(f.Path)
		children[parent] = append(children[parent], path.Base(f.Path))
	}
	errFound := errors.New("found")
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile: its directory changed
		}
		info, err := e.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || st.Ctim.Sec < t.Sec || st.Ctim.Sec == t.Sec && st.Ctim.Nsec < t.Nsec {
			return nil // as it was before the snapshot started
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if info.IsDir() {
			names, err := os.ReadDir(p)
			if err != nil {
				return nil
			}
			got := make([]string, 0, len(names))
			for _, n := range names {
				if workspace.TypeOf(n.Type()) != "other" {
					got = append(got, n.Name())
				}
			}
			want := children[rel]
			slices.Sort(want)
			if !slices.Equal(got, want) { // (ReadDir sorts by name)
				return errFound
			}
		}
		if rel == "." {
			return nil
		}
		typ := workspace.TypeOf(info.Mode())
		if typ == "other" {
			return nil // not kept
		}
		f := held[rel]
		if f == nil || f.Type != typ || f.Mode != info.Mode()&(fs.ModePerm|fs.ModeSticky) ||
			typ == "file" && (f.Size != info.Size() || !f.ModTime.Equal(info.ModTime())) {
			return errFound
		}
		return nil
	})
	return err == errFound
}

// deadGrace is how long a session's kernel must have been seen dead before
// its files are salvaged (salvageDead): a kernel that died with its keeper
// is KeeperDied's, which learns of the death at once.
const deadGrace = 2 * time.Second

// kernelDiedAlone says whether ms's kernel, dead, died on its own (a
// crash, the memory limit, os._exit) rather than with its keeper: seen
// dead for deadGrace, and its keeper, if any, still runs.
func (m *Manager) kernelDiedAlone(ms *Managed, now time.Time) bool {
	d := ms.durable
	d.mu.Lock()
	if d.deadSince.IsZero() {
		d.deadSince = now
	}
	since := d.deadSince
	d.mu.Unlock()
	if now.Sub(since) < deadGrace {
		return false
	}
	pid := ms.Session.keeperPid.Load()
	if pid == 0 {
		return true
	}
	m.mu.Lock()
	known := slices.Contains(m.keeperDeaths, pid)
	m.mu.Unlock()
	return !known && processRuns(int(pid))
}

// processRuns says whether process pid runs (exists and is no zombie).
func processRuns(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z' && stat[i+2] != 'X'
}

// salvageDead writes an automatic snapshot of a session whose kernel died
// (the caller holds its turn): its files as they are, with the variables
// of its latest snapshot, and the note its record keeps of that. Files
// written before the kernel died are then not lost with the host, as they
// would be until the session's next use.
func (m *Manager) salvageDead(ctx context.Context, ms *Managed) (*snapshot.Manifest, *salvageNote, error) {
	d, st := ms.durable, m.opts.Snapshots
	d.mu.Lock()
	snap, prev, since := d.snap, d.salvaged, d.deadSince
	d.mu.Unlock()
	h := &hibernating{store: st, owner: ms.Owner}
	if snap != "" {
		man, err := st.Get(ctx, ms.Owner, snap)
		if err != nil {
			return nil, nil, err
		}
		h.m = man
	}
	man, err := ms.Session.salvageWorkspace(ctx, h)
	if err != nil {
		return nil, nil, err
	}
	note := &salvageNote{}
	switch {
	case prev != nil:
		note.VariablesAsOf = prev.VariablesAsOf
	case h.m != nil:
		note.VariablesAsOf = h.m.CreatedAt
	}
	died := fmt.Sprintf("its kernel died (restart required), seen at %s", since.UTC().Format(time.RFC3339))
	if note.VariablesAsOf.IsZero() {
		note.Lost = "its variables: " + died + " before its first snapshot"
	} else {
		note.Lost = fmt.Sprintf("the variables set after %s: %s", note.VariablesAsOf.UTC().Format(time.RFC3339), died)
	}
	m.log.Info("session's kernel dead: its files written to a snapshot with the variables of its latest one", "session", ms.ID(), "snapshot", man.ID, "variables_of", snap)
	return man, note, nil
}

// loadRecord reads session id's record, if it has one.
func (m *Manager) loadRecord(id string) *durableRecord {
	if m.opts.Records == "" || m.opts.Snapshots == nil {
		return nil
	}
	b, err := os.ReadFile(m.recordPath(id))
	if err != nil {
		return nil
	}
	var rec durableRecord
	if json.Unmarshal(b, &rec) != nil || rec.ID != id {
		return nil
	}
	return &rec
}

// RecordedWorkspaces are the workspaces the session records in dir
// (ManagerOptions.Records) name: a server's start keeps them from its
// keeper's sweep of the workspaces of sessions that ended while no server
// held them (jail.SweepWorkspacesOf), for Restore to take their files.
func RecordedWorkspaces(dir string) map[string]bool {
	out := map[string]bool{}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, p := range paths {
		var rec durableRecord
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &rec) == nil && rec.Workspace != "" {
			out[rec.Workspace] = true
		}
	}
	return out
}

// durableOf is the state of a session taken over from the keeper, from
// its record (a new one if it had none).
func (m *Manager) durableOf(id string) (*durableState, []Event) {
	if m.opts.Records == "" || m.opts.Snapshots == nil {
		return nil, nil
	}
	d := &durableState{}
	rec := m.loadRecord(id)
	if rec == nil {
		return d, nil
	}
	d.snap, d.at, d.usedAt = rec.Snapshot, rec.SnapshotAt, rec.UsedAt
	return d, rec.Events
}

// Restore brings back, asleep on their latest snapshots, the sessions
// recorded in ManagerOptions.Records that this manager does not hold
// (see above): a server's start calls it once its keeper's sessions are
// taken over. It returns how many came back; those that could not are
// in the error (their records stay, for a later start).
func (m *Manager) Restore(ctx context.Context) (int, error) {
	if m.opts.Records == "" || m.opts.Snapshots == nil {
		return 0, nil
	}
	entries, err := os.ReadDir(m.opts.Records)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8) // (a left workspace's files are written)
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			if strings.HasSuffix(e.Name(), ".tmp") {
				os.Remove(filepath.Join(m.opts.Records, e.Name()))
			}
			continue
		}
		m.mu.Lock()
		_, held := m.sessions[id]
		m.mu.Unlock()
		if held {
			continue // taken over from the keeper, alive
		}
		rec := m.loadRecord(id)
		if rec == nil {
			fail(fmt.Errorf("restore session %s: its record is unreadable", id))
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := m.adopt(ctx, rec); err != nil {
				fail(fmt.Errorf("restore session %s: %w", id, err))
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
		})
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// adopt makes the session rec describes, asleep on its snapshot.
func (m *Manager) adopt(ctx context.Context, rec *durableRecord) error {
	h, d, err := m.lostState(ctx, rec)
	if err != nil {
		return err
	}
	policy, err := rec.Egress.policy()
	if err != nil {
		return err
	}
	tmpl, err := m.useTemplate(ctx, rec.Template)
	if err != nil {
		return err
	}
	o := m.sessionOptions(rec.Limits, rec.Env, rec.Network, policy, rec.ExecTimeout)
	o.Checkpoints = rec.Checkpoints
	o.Template = tmpl
	s, err := newAsleep(o, rec.ID)
	if err != nil {
		tmpl.release()
		return err
	}
	took := m.takeLeftover(ctx, rec, &h, d)
	s.sleepOn(h)
	s.events.seed(rec.Events) // its history under the servers before
	ms := &Managed{Session: s, Owner: rec.Owner, Created: rec.Created, Limits: rec.Limits, Network: rec.Network, Egress: policy,
		ExecTimeout: rec.ExecTimeout, PortAccess: rec.PortAccess, Template: rec.Template, mgr: m, lastUsed: time.Now(),
		durable: d}
	s.woken = ms.wokeInUse
	m.recordEventsOf(ms)
	if took {
		// The record names the files taken from now on; the snapshot
		// they replace goes.
		m.saveRecord(ms)
		m.deleteSnapshot(ms, rec.Snapshot, d.snap)
		if m.opts.OnSnapshot != nil {
			m.opts.OnSnapshot(rec.ID, d.snap)
		}
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		s.keepSnapshots.Store(true)
		s.Close()
		return ErrClosed
	}
	m.sessions[rec.ID] = ms
	m.mu.Unlock()
	switch {
	case rec.Hibernated && rec.Salvaged == nil && h.m != nil:
		s.note(Event{Type: EventHibernated, Snapshot: h.m.ID, Reason: "it was hibernated when the server restarted: nothing was lost, and its next use wakes it"})
	case rec.Hibernated:
		s.noteLost("it was asleep after an earlier loss of its processes when the server restarted", h)
	default:
		s.noteLost("the server restarted without the session's processes (it or its keeper was stopped or died)", h)
	}
	if took {
		m.log.Info("session restored from storage, with its files as its processes left them (its workspace outlived them) and the variables of its latest snapshot: it wakes at its first use",
			"session", rec.ID, "snapshot", d.snap, "variables_of", rec.Snapshot)
	} else {
		m.log.Info("session restored from storage: it wakes at its first use", "session", rec.ID, "snapshot", d.snap, "hibernated", rec.Hibernated)
	}
	return nil
}

// takeLeftover takes the files of rec's session from the workspace that
// outlived its processes (a lasting one, jail.NewLastingQuotaDir: the
// server or its keeper was killed, the host stayed up): if it was used
// since its latest snapshot, they are written as they are, with the
// variables of h's snapshot, to a new automatic snapshot that it comes
// back from instead (h and d say so, as KeeperDied's sleepLost would),
// and it reports true. The left workspace is then removed; one whose
// files could not be written stays (a sweep removes it
// jail.LeftoverGrace after its owner's death was seen, a later start
// tries again), and the session comes back from its latest snapshot.
func (m *Manager) takeLeftover(ctx context.Context, rec *durableRecord, h **hibernating, d *durableState) bool {
	// (A workspace of this server's keeper, alive: the session's jail
	// ended while no server held it, since it was not taken over.)
	keeper := 0
	if m.opts.Keeper != nil {
		keeper = m.opts.Keeper.Pid()
	}
	if rec.Workspace == "" || !jail.Leftover(rec.Workspace, keeper) {
		return false
	}
	took := false
	if !rec.Hibernated && !rec.UsedAt.IsZero() {
		man, err := salvageDir(ctx, rec.Workspace, rec.ID, rec.Template, *h)
		if err != nil {
			m.log.Warn("restore: the files the session's workspace held when its processes were lost could not be written to a snapshot: it comes back from its latest one",
				"session", rec.ID, "workspace", rec.Workspace, "err", err)
			return false
		}
		sh := (*h).salvaged(man)
		*h, took = sh, true
		d.snap, d.at, d.salvaged = man.ID, man.CreatedAt, &salvageNote{VariablesAsOf: sh.asOf, Lost: sh.lost}
	}
	if err := jail.RemoveLeftover(rec.Workspace, keeper); err != nil {
		m.log.Warn("restore: remove the workspace the session's processes left", "session", rec.ID, "workspace", rec.Workspace, "err", err)
	}
	return took
}

// lostState is what the session rec describes comes back as, from its
// latest snapshot: the hibernation its wake loads (saying, for a session
// whose processes were lost, from what, as of when and what was lost),
// and its durable state from then on. Restore (a server's start) and
// KeeperDied (a keeper's death under a running server) both use it.
func (m *Manager) lostState(ctx context.Context, rec *durableRecord) (*hibernating, *durableState, error) {
	st := m.opts.Snapshots
	var man *snapshot.Manifest
	if rec.Snapshot != "" {
		var err error
		man, err = st.Get(ctx, rec.Owner, rec.Snapshot)
		switch {
		case errors.Is(err, snapshot.ErrNotFound):
			man = nil
		case err != nil:
			return nil, nil, err
		}
	}
	h := &hibernating{store: st, owner: rec.Owner, m: man, keep: true, usedAt: rec.UsedAt}
	switch {
	case rec.Hibernated && man != nil && rec.Salvaged != nil:
		// Asleep on its files as they were when its processes were lost
		// (sleepLost): what its wake would have said.
		h.from = "the automatic snapshot " + man.ID + " (the session's processes were lost)"
		h.asOf, h.filesAsOf, h.lost = rec.Salvaged.VariablesAsOf, man.CreatedAt, rec.Salvaged.Lost
	case rec.Hibernated && man != nil:
		// Hibernated before the server stopped: nothing was lost.
	case man == nil:
		h.from = "nothing: the session's processes were lost before its first snapshot"
		h.lost = "everything (files and variables): it was lost before its first snapshot"
	default:
		h.from = "the automatic snapshot " + man.ID + " (the session's processes were lost)"
		h.asOf = man.CreatedAt
		var lost []string
		if rec.Salvaged != nil {
			// A salvage (its kernel had died, or it was woken from one
			// since): its variables are older than its files.
			h.asOf, h.filesAsOf = rec.Salvaged.VariablesAsOf, man.CreatedAt
			if rec.Salvaged.Lost != "" {
				lost = append(lost, rec.Salvaged.Lost)
			}
		}
		if !rec.UsedAt.IsZero() {
			lost = append(lost, fmt.Sprintf("what was done in the session after %s (it was used from %s until its processes were lost)",
				man.CreatedAt.UTC().Format(time.RFC3339), rec.UsedAt.UTC().Format(time.RFC3339)))
		}
		h.lost = strings.Join(lost, "; ")
	}
	d := &durableState{at: rec.SnapshotAt, hibernated: true}
	if man != nil {
		d.snap, d.salvaged = man.ID, rec.Salvaged
		if rec.UsedAt.IsZero() {
			d.at = man.CreatedAt
		}
	}
	return h, d, nil
}

// KeeperDied puts to sleep, on their latest snapshots, the sessions whose
// kernels the keeper pid spawned: they died with it (its jails die with
// the keeper). Each keeps its id, owner and holders, and wakes at its
// first use as a session Restore brought back at a server's start would,
// saying what came back and what was lost; one lost before its first
// snapshot comes back empty, saying so. The server calls it as soon as it
// learns of the keeper's death, so the sessions need no restart of the
// server; their wakes start in the next keeper (and are handed to it). It
// returns how many were put to sleep; sessions without a record (no
// ManagerOptions.Records) stay as they are: their kernels are gone.
func (m *Manager) KeeperDied(ctx context.Context, pid int) (int, error) {
	if pid <= 0 {
		return 0, nil
	}
	m.mu.Lock()
	// Marked under the same lock as the sweep: a session registered
	// after the sweep (its kernel started in this keeper just before it
	// died) sees the mark at its registration, one registered before is
	// in the sweep.
	m.keeperDeaths = append(m.keeperDeaths, int64(pid))
	// The pool's kernels it spawned died with it: not handed out.
	kept := m.pool[:0]
	var dead []*Session
	for _, s := range m.pool {
		if s.keeperPid.Load() == int64(pid) {
			dead = append(dead, s)
		} else {
			kept = append(kept, s)
		}
	}
	m.pool = kept
	m.closing.Add(len(dead))
	for _, s := range dead {
		go func() { defer m.closing.Done(); s.Close() }()
	}
	var lost []*Managed
	for _, ms := range m.sessions {
		if ms.Session != nil && ms.Session.keeperPid.Load() == int64(pid) && !ms.Session.hib.on.Load() {
			lost = append(lost, ms)
		}
	}
	m.mu.Unlock()
	if len(dead) > 0 {
		m.kick() // refilled in the next keeper
	}
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
	)
	for _, ms := range lost {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			err := m.sleepLost(ctx, ms)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				n++
			case !errors.Is(err, ErrClosed):
				errs = append(errs, fmt.Errorf("session %s: %w", ms.ID(), err))
			}
		})
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// sleepLost puts ms to sleep on its latest snapshot (KeeperDied).
func (m *Manager) sleepLost(ctx context.Context, ms *Managed) error {
	if !ms.Session.events.begun() {
		// Lost as it was made (its keeper died then), before Create or
		// Fork noted its creation: that first, then the loss.
		ms.note(createdEvent(ms))
	}
	d := ms.durable
	if d == nil || m.opts.Snapshots == nil {
		return errors.New("its processes were lost and it has no snapshot to come back from (the server keeps none: --snapshot-every)")
	}
	var (
		rec durableRecord
		nd  *durableState
	)
	lost := func() (*hibernating, error) {
		rec = m.recordOf(ms)
		h, d, err := m.lostState(ctx, &rec)
		nd = d
		return h, err
	}
	var err error
	// A new workspace, in the keeper that will hold the session woken
	// (started here if none runs): the old one is named after the dead
	// keeper, and any sandloop starting sweeps those (once their grace
	// is over: they are lasting).
	var q *jail.QuotaDir
	if old := ms.Session.quota; old != nil && ms.Session.opts.Keeper != nil {
		if q, err = newWorkspaceFor(&ms.Session.opts, old.Disk, old.Files); err != nil {
			return err
		}
	}
	sh, err := ms.Session.sleepLost(ctx, lost, q)
	if err != nil || nd == nil {
		if q != nil {
			q.Remove()
		}
		return err // (nd nil: it was hibernated meanwhile, and its record says so)
	}
	if sh != nil {
		// Its files as they were, with the variables of the snapshot
		// before: the record names it, and says so, from now on.
		nd.snap, nd.at, nd.salvaged = sh.m.ID, sh.m.CreatedAt, &salvageNote{VariablesAsOf: sh.asOf, Lost: sh.lost}
	}
	d.mu.Lock()
	d.snap, d.at, d.hibernated, d.usedAt, d.salvaged = nd.snap, nd.at, true, time.Time{}, nd.salvaged
	d.mu.Unlock()
	if sh != nil {
		m.saveRecord(ms)
		m.deleteSnapshot(ms, rec.Snapshot, sh.m.ID)
		if m.opts.OnSnapshot != nil {
			m.opts.OnSnapshot(ms.ID(), sh.m.ID)
		}
		m.log.Info("session lost with its keeper, asleep on its files as they were and the variables of its latest snapshot: it wakes at its first use",
			"session", ms.ID(), "snapshot", nd.snap, "variables_of", rec.Snapshot)
		return nil
	}
	m.log.Info("session lost with its keeper, asleep on its latest snapshot: it wakes at its first use", "session", ms.ID(), "snapshot", nd.snap)
	return nil
}

// newAsleep makes session id as New does, without a kernel (kernel.Gone):
// a hibernated session's wake starts one.
func newAsleep(o *Options, id string) (*Session, error) {
	opts := *o
	s := &Session{id: id, opts: opts, turn: make(chan struct{}, 1), done: make(chan struct{})}
	s.log = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)).With("session", id)
	q, err := newWorkspaceDir(&opts)
	if err != nil {
		return nil, err
	}
	s.workspace, s.quota = q.Path, q
	if opts.Egress != nil {
		s.gate = egress.New(&egress.Options{Policy: *opts.Egress, LookupIP: opts.EgressLookup, Cache: opts.EgressCache, Logger: s.log})
	}
	s.launch = s.launcher()
	s.k = kernel.Gone("the session is asleep: its next use restores it")
	return s, nil
}
