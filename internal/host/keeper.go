package host

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/keeper"
	"github.com/sandloop/sandloop/internal/session"
)

// keeperLink is the host's connection to its keeper (Config.KeepSessions),
// reconnected (a new keeper started) when the keeper has died: sessions
// created from then on are held by the new one. It is a session.Keeper.
//
// Its keeper's death is learned at once (keeper.Client.Dead): died is
// called with the dead keeper's PID, so the sessions it held are put to
// sleep on their snapshots without waiting for a restart of the server.
type keeperLink struct {
	dir, exe string

	mu     sync.Mutex
	c      *keeper.Client
	closed bool
	died   func(pid int) // under mu; nil: not told
	wg     sync.WaitGroup
}

func openKeeper(cfg *Config) (*keeperLink, error) {
	if cfg.DataDir == "" {
		return nil, &ArgumentError{"keep-sessions", errors.New("needs a data directory (--data-dir) for the keeper")}
	}
	if os.Geteuid() != 0 {
		return nil, &ArgumentError{"keep-sessions", errors.New("needs root: kept sessions' workspaces are host directories")}
	}
	exe := cfg.KeeperExe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	l := &keeperLink{dir: filepath.Join(cfg.DataDir, "keeper"), exe: exe}
	if _, err := l.client(); err != nil {
		return nil, err
	}
	return l, nil
}

// client is the connection, made again if the keeper has died.
func (l *keeperLink) client() (*keeper.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		select {
		case <-l.c.Dead():
			l.c.Close()
			l.c = nil
		default:
			return l.c, nil
		}
	}
	if l.closed {
		return nil, errors.New("keeper: the server is shutting down")
	}
	c, err := keeper.Connect(l.dir, l.exe)
	if err != nil {
		return nil, err
	}
	l.c = c
	l.wg.Go(func() { l.watch(c) })
	return c, nil
}

// watch waits for c's keeper to die and says so (died), unless the link
// closed c itself.
func (l *keeperLink) watch(c *keeper.Client) {
	<-c.Dead()
	l.mu.Lock()
	died := l.died
	if l.closed {
		died = nil
	}
	l.mu.Unlock()
	if died != nil {
		died(c.Pid())
	}
}

// onDeath sets what the link calls when its keeper dies.
func (l *keeperLink) onDeath(f func(pid int)) {
	l.mu.Lock()
	l.died = f
	l.mu.Unlock()
}

// alive says whether the keeper the host holds sessions in still runs.
func (l *keeperLink) alive() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return false
	}
	select {
	case <-l.c.Dead():
		return false
	default:
		return true
	}
}

func (l *keeperLink) close() {
	l.mu.Lock()
	l.closed = true
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	l.wg.Wait()
}

func (l *keeperLink) Spawn(cmd *exec.Cmd) (int, *os.File, error) {
	pid, fd, _, err := l.SpawnIn(cmd)
	return pid, fd, err
}

// SpawnIn is Spawn, also saying which keeper holds the process (the
// link's Pid may be a newer one's by the time the caller asks).
func (l *keeperLink) SpawnIn(cmd *exec.Cmd) (int, *os.File, int, error) {
	c, err := l.client()
	if err != nil {
		return 0, nil, 0, err
	}
	pid, fd, err := c.Spawn(cmd)
	return pid, fd, c.Pid(), err
}

func (l *keeperLink) Keep(id string, pid int, meta []byte, files []*os.File) error {
	c, err := l.client()
	if err != nil {
		return err
	}
	return c.Keep(id, pid, meta, files)
}

func (l *keeperLink) Drop(id string) error {
	if !l.alive() {
		// The keeper that held it is gone, and its record with it (a
		// new keeper moves them to lost/): nothing to drop, and no new
		// keeper to start for it (a shutdown after the keeper died).
		return nil
	}
	c, err := l.client()
	if err != nil {
		return err
	}
	return c.Drop(id)
}

func (l *keeperLink) Pid() int {
	c, err := l.client()
	if err != nil {
		return 0
	}
	return c.Pid()
}

// keptSessions lists the sessions the keeper holds for us, and removes
// the keeper's workspaces no record names: of sessions that died while no
// server held them, or were still starting when the server before was
// killed. A workspace the session records in records name stays: the
// manager's Restore takes its files (its session died while no server
// held it). It runs before this server makes any workspace.
func (h *Host) keptSessions(records string) []session.KeptRecord {
	c, err := h.keeper.client()
	if err != nil {
		h.log.Error("keeper: no sessions taken over", "err", err)
		return nil
	}
	recs, err := c.List()
	if err != nil {
		h.log.Error("keeper: no sessions taken over", "err", err)
		return nil
	}
	kept := make([]session.KeptRecord, len(recs))
	workspaces := map[string]bool{}
	if records != "" {
		workspaces = session.RecordedWorkspaces(records)
	}
	for i, r := range recs {
		kept[i] = session.KeptRecord{ID: r.ID, Meta: r.Meta, Files: r.Files}
		var m struct{ Workspace string }
		if json.Unmarshal(r.Meta, &m) == nil && m.Workspace != "" {
			workspaces[m.Workspace] = true
		}
	}
	if n := jail.SweepWorkspacesOf(c.Pid(), workspaces); n > 0 {
		h.log.Info("keeper: workspaces of sessions that died meanwhile removed", "workspaces", n)
	}
	return kept
}

// keeperDied puts to sleep, on their latest snapshots, the sessions the
// dead keeper pid held (session.Manager.KeeperDied): each wakes at its
// first use, in a new keeper.
func (h *Host) keeperDied(pid int) {
	h.log.Warn("keeper: it died; the sessions it held go to sleep on their latest snapshots and wake at their next use", "keeper", pid)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := h.mgr.KeeperDied(ctx, pid)
	h.log.Info("keeper: sessions of the dead keeper asleep on their snapshots", "sessions", n)
	if err != nil {
		h.log.Warn("keeper: some sessions of the dead keeper cannot come back", "err", err)
	}
}

// reattach takes over the kept sessions.
func (h *Host) reattach(ctx context.Context, kept []session.KeptRecord) {
	start := time.Now()
	n, err := h.mgr.Reattach(ctx, kept)
	if len(kept) > 0 || err != nil {
		h.log.Info("keeper: sessions taken over", "sessions", n, "of", len(kept), "took", time.Since(start).Round(time.Millisecond))
	}
	if err != nil {
		h.log.Warn("keeper: some sessions could not be taken over (killed)", "err", err)
	}
}
