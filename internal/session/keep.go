package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
)

// Sessions that outlive the server (package keeper).
//
// A session whose Options.Keeper is set starts its kernel's jail through
// the keeper (jail.Config.Spawn: the keeper's child, which dies with the
// keeper, not with the server), in a workspace named after the keeper
// (jail.NewQuotaDirFor: a host directory that another sandloop sweeps
// only once the keeper is gone), and never from a zygote (a zygote's
// forks are the zygote's jail's, which dies with the server). Once the
// session is handed to a caller (Manager.Create), Keep gives the keeper
// copies of its descriptors and its metadata (keptState), and again
// after every kernel restart; Close drops the record first. Reattach, in
// the next server, makes the same session of a record: same id,
// workspace, limits, environment and network (an allowlist gets a new
// gate on the same listener), and the same kernel, resynced (package
// kernel, Attach): a cell that was running completes. A paused session is
// thawed. Not carried over: checkpoints (their kernel copies are dropped
// and their files were in the server's temporary store) and an upload
// cut off by the server's death (stores nothing: files are written to a
// temporary name and renamed; the temporary file is removed here).

// Keeper holds sessions' jails and descriptors for the next server.
type Keeper interface {
	// Spawn starts a jail's init as the keeper's child.
	Spawn(cmd *exec.Cmd) (pid int, pidfd *os.File, err error)
	// Keep records session id (its jail's init pid, metadata and copies
	// of its descriptors), replacing an earlier record.
	Keep(id string, pid int, meta []byte, files []*os.File) error
	// Drop forgets session id.
	Drop(id string) error
	// Pid is the keeper's process, which owns the workspaces.
	Pid() int
}

// keeperSpawnIn is a Keeper that says which keeper a Spawn started its
// process in: one that reconnects to a new keeper when its keeper died
// would answer Pid with the new one's, hiding from KeeperDied a kernel
// started in the dead one just before it died.
type keeperSpawnIn interface {
	SpawnIn(cmd *exec.Cmd) (pid int, pidfd *os.File, keeper int, err error)
}

// keptState is a kept session's metadata. Its descriptors are the
// jail's (jail.Handoff: 2 or 3), then the kernel's (5).
type keptState struct {
	ID          string            `json:"id"`
	Workspace   string            `json:"workspace"`
	Disk        int64             `json:"disk"`
	Files       int               `json:"files"`
	Enforced    bool              `json:"enforced"`
	Limits      jail.Limits       `json:"limits"`
	Env         map[string]string `json:"env,omitempty"`
	Network     jail.Network      `json:"network,omitempty"`
	Egress      *keptPolicy       `json:"egress,omitempty"`
	ExecTimeout time.Duration     `json:"exec_timeout"`
	Checkpoints string            `json:"checkpoints,omitempty"`
	Jail        jail.Handoff      `json:"jail"`
	JailFiles   int               `json:"jail_files"`
	Kernel      kernel.Handoff    `json:"kernel"`
	// Extra is the manager's part (owner, creation time...).
	Extra json.RawMessage `json:"extra,omitempty"`
}

// keptPolicy is an egress.Policy as JSON.
type keptPolicy struct {
	Allow       []string         `json:"allow"`
	Deny        []netip.AddrPort `json:"deny,omitempty"`
	MaxBytes    int64            `json:"max_bytes,omitempty"`
	MaxConns    int              `json:"max_conns,omitempty"`
	DialTimeout time.Duration    `json:"dial_timeout,omitempty"`
	IdleTimeout time.Duration    `json:"idle_timeout,omitempty"`
}

func keptPolicyOf(p *egress.Policy) *keptPolicy {
	if p == nil {
		return nil
	}
	return &keptPolicy{Allow: p.AllowEntries(), Deny: p.Deny, MaxBytes: p.MaxBytes, MaxConns: p.MaxConns, DialTimeout: p.DialTimeout, IdleTimeout: p.IdleTimeout}
}

func (k *keptPolicy) policy() (*egress.Policy, error) {
	if k == nil {
		return nil, nil
	}
	allow, err := egress.ParseAllowlist(k.Allow)
	if err != nil {
		return nil, err
	}
	return &egress.Policy{Allow: allow, Deny: k.Deny, MaxBytes: k.MaxBytes, MaxConns: k.MaxConns, DialTimeout: k.DialTimeout, IdleTimeout: k.IdleTimeout}, nil
}

// handoffable is a kernel process another server can take over.
type handoffable interface {
	Handoff() (jail.Handoff, []*os.File, error)
}

// Keep hands the session to its keeper (Options.Keeper), with extra (the
// caller's part of the record, given back by Reattach), and again after
// every restart of its kernel. It does nothing without a keeper.
func (s *Session) Keep(ctx context.Context, extra []byte) error {
	if s.opts.Keeper == nil {
		return nil
	}
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	s.mu.Lock()
	s.keptExtra = append(json.RawMessage(nil), extra...)
	s.mu.Unlock()
	return s.keepLocked()
}

// keepLocked records the session in its keeper; the caller holds the
// turn.
func (s *Session) keepLocked() error {
	s.mu.Lock()
	k, p, extra, closed := s.k, s.proc, s.keptExtra, s.closed
	s.mu.Unlock()
	if s.opts.Keeper == nil || extra == nil || closed {
		return nil
	}
	h, ok := p.(handoffable)
	if !ok {
		return fmt.Errorf("session %s: its kernel was not started by the keeper", s.id)
	}
	jh, jfiles, err := h.Handoff()
	if err != nil {
		return fmt.Errorf("session %s: %w", s.id, err)
	}
	defer closeFiles(jfiles)
	kh, kfiles, err := k.Handoff()
	if err != nil {
		return fmt.Errorf("session %s: %w", s.id, err)
	}
	defer closeFiles(kfiles)
	st := keptState{ID: s.id, Workspace: s.workspace, Limits: s.opts.Limits, Env: s.opts.Env, Network: s.opts.Network,
		Egress: keptPolicyOf(s.opts.Egress), ExecTimeout: s.opts.ExecTimeout, Checkpoints: s.opts.Checkpoints,
		Jail: jh, JailFiles: len(jfiles), Kernel: kh, Extra: extra}
	if s.quota != nil {
		st.Disk, st.Files, st.Enforced = s.quota.Disk, s.quota.Files, s.quota.Enforced
	}
	meta, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	if err := s.opts.Keeper.Keep(s.id, jh.Pid, meta, append(jfiles, kfiles...)); err != nil {
		return fmt.Errorf("session %s: %w", s.id, err)
	}
	return nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// dropKept forgets the session's record in its keeper (it is closing).
func (s *Session) dropKept() {
	s.mu.Lock()
	kept := s.keptExtra != nil
	s.mu.Unlock()
	if s.opts.Keeper == nil || !kept {
		return
	}
	if err := s.opts.Keeper.Drop(s.id); err != nil {
		s.log.Warn("keeper: drop the session's record", "err", err)
	}
}

// Detach lets go of a kept session without ending it: this server's
// descriptors are closed, the kernel and its jail go on in the keeper for
// the next server (Reattach). A session that is not kept is closed. A
// running execution ends with an error, not a result.
func (s *Session) Detach() error {
	s.letGo.Store(true)
	s.mu.Lock()
	kept := s.opts.Keeper != nil && s.keptExtra != nil && s.k.Err() == nil
	if !kept || s.closed {
		// Its processes lost with its keeper, which no server has put it
		// to sleep for yet (a SIGTERM right after the keeper's death):
		// its lasting workspace is left for the next server, which takes
		// its files (Manager.Restore).
		if !s.closed && s.opts.lasting && jail.Leftover(s.workspace, 0) {
			s.keepWorkspace.Store(true)
		}
		s.mu.Unlock()
		return s.Close()
	}
	s.closed = true
	k := s.k
	s.mu.Unlock()
	close(s.done)
	s.events.end()
	k.Detach()
	if s.gate != nil {
		s.gate.Close()
	}
	s.closeStandby()
	s.opts.Template.release()
	return nil
}

// ReattachOptions are what a session taken over gets from its new
// server; the rest comes from its record.
type ReattachOptions struct {
	Keeper         Keeper
	EgressLookup   func(ctx context.Context, host string) ([]netip.Addr, error)
	EgressCache    *egress.Cache
	MaxOutputBytes int
	// ExecTimeout bounds the cell the kernel was running, if any, from
	// now (kernel.Options.ResyncTimeout). If zero, the session's own.
	ExecTimeout time.Duration
	Logger      *slog.Logger
	// Checkpoint bounds (Options' fields of the same names).
	AutoCheckpoints  int
	MaxCheckpoints   int
	CheckpointMemory int64
	// Template is the session's template, if its record names one.
	Template *TemplateUse
}

// Reattach makes the session a record describes (meta, with its
// descriptors files, which it owns from now on), returning it and the
// record's extra part (Keep's). On failure the record's jail is killed.
func Reattach(meta []byte, files []*os.File, o *ReattachOptions) (*Session, json.RawMessage, error) {
	var st keptState
	if err := json.Unmarshal(meta, &st); err != nil {
		closeFiles(files)
		return nil, nil, fmt.Errorf("reattach: a bad record: %w", err)
	}
	fail := func(err error) (*Session, json.RawMessage, error) {
		return nil, st.Extra, fmt.Errorf("reattach session %s: %w", st.ID, err)
	}
	if st.JailFiles < 2 || len(files) != st.JailFiles+5 {
		closeFiles(files)
		return fail(fmt.Errorf("%d descriptors, want %d", len(files), st.JailFiles+5))
	}
	jp, err := jail.Attach(st.Jail, files[:st.JailFiles])
	if err != nil {
		closeFiles(files[st.JailFiles:])
		return fail(err)
	}
	proc := &jailProcess{p: jp, limits: st.Limits.WithDefaults()}
	kill := func() {
		jp.Kill()
		jp.Wait()
	}
	policy, err := st.Egress.policy()
	if err != nil {
		closeFiles(files[st.JailFiles:])
		kill()
		return fail(err)
	}
	opts := Options{Limits: st.Limits, Network: st.Network, Egress: policy, EgressLookup: o.EgressLookup, EgressCache: o.EgressCache,
		Env: st.Env, ExecTimeout: st.ExecTimeout, MaxOutputBytes: o.MaxOutputBytes, Keeper: o.Keeper, Logger: o.Logger,
		Checkpoints: st.Checkpoints, AutoCheckpoints: o.AutoCheckpoints, MaxCheckpoints: o.MaxCheckpoints, CheckpointMemory: o.CheckpointMemory,
		Template: o.Template}
	s := &Session{id: st.ID, opts: opts, turn: make(chan struct{}, 1), done: make(chan struct{}), workspace: st.Workspace,
		keptExtra: st.Extra, proc: proc}
	s.log = opts.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("session", s.id)
	if o.Keeper != nil {
		s.keeperPid.Store(int64(o.Keeper.Pid()))
	}
	if st.Disk > 0 {
		s.quota = jail.AdoptQuotaDir(st.Workspace, st.Disk, st.Files, st.Enforced)
	}
	// A session paused when the server died is running again.
	_ = proc.Thaw()
	if policy != nil {
		ln := jp.Listener()
		if ln == nil {
			closeFiles(files[st.JailFiles:])
			kill()
			return fail(errors.New("its egress listener is missing"))
		}
		s.gate = egress.New(&egress.Options{Policy: *policy, LookupIP: o.EgressLookup, Cache: o.EgressCache, Logger: s.log})
		s.gate.Serve(ln)
	}
	s.launch = s.launcher()
	attached := make(chan struct{}) // s.k is set
	resync := st.ExecTimeout
	if o.ExecTimeout > 0 {
		resync = o.ExecTimeout
	}
	k, err := kernel.Attach(proc, st.Kernel, files[st.JailFiles:], &kernel.Options{
		InterruptGrace: opts.InterruptGrace, MaxOutputBytes: opts.MaxOutputBytes, ResyncTimeout: resync, Logger: s.log,
	}, func(r kernel.Resynced, err error) {
		if len(r.Checkpoints) > 0 {
			// Their files were in the server before's temporary store:
			// the kernel's copies go too.
			go func() {
				<-attached
				s.dropCheckpoints(r.Checkpoints)
			}()
		}
		switch {
		case err != nil:
			s.log.Warn("reattach: the kernel did not resync", "err", err)
		case r.Finished != "":
			s.log.Info("reattach: the cell running when the server stopped has ended", "status", r.Finished, "execution_count", r.ExecutionCount)
		}
	})
	if err != nil {
		close(attached)
		if s.gate != nil {
			s.gate.Close()
		}
		kill()
		return fail(err)
	}
	s.k = k
	s.watchKernel(k)
	close(attached)
	removeStaleUploads(st.Workspace)
	return s, st.Extra, nil
}

// dropCheckpoints drops the kernel's checkpoints a server before took.
func (s *Session) dropCheckpoints(ids []int) {
	k, err := s.kernel()
	if err != nil || k == nil {
		return
	}
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := k.DropCheckpoint(ctx, id)
		cancel()
		if err != nil {
			s.log.Warn("reattach: drop a checkpoint of the server before", "checkpoint", id, "err", err)
		}
	}
}

// removeStaleUploads removes the temporary files of uploads cut off by
// the server's death (package workspace writes to .sandloop-upload-*
// and renames).
func removeStaleUploads(root string) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() && strings.HasPrefix(d.Name(), ".sandloop-upload-") {
			os.Remove(p)
		}
		return nil
	})
}
