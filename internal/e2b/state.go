package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// Sandboxes that outlive their server (serve --keep-sessions): the keeper
// keeps a sandbox's session (its kernel, files and limits, on the same
// id) across a restart of the server, and this file keeps what E2B adds
// to it, one record per sandbox in Options.StateDir: its access tokens,
// template, metadata, envs, time to live, lifecycle, pause state and
// network configuration. A new Handler adopts every record whose session
// the manager holds (re-attached from the keeper, or, if the keeper died
// too, brought back asleep on its latest snapshot by Manager.Restore, which
// runs first), so Sandbox.connect(id) and runCode go on on the same id
// with the same tokens; records of sessions that did not come back are
// removed. What does not survive: the sandbox's commands and
// terminals (their processes are the old server's: a restarted server
// reports none, and their ids are unknown to it), extra code contexts
// (kernels of their own, not kept: only the default context is), file
// watchers, and the egress byte counts of getMetrics and the network log
// (a new gate counts from zero).

// record is a sandbox's file in StateDir.
type record struct {
	ID           string            `json:"id"`
	Owner        string            `json:"owner"`
	TemplateID   string            `json:"template_id"`
	EnvdToken    string            `json:"envd_token"`
	TrafficToken string            `json:"traffic_token"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	EnvVars      map[string]string `json:"env_vars,omitempty"`
	Started      time.Time         `json:"started"`
	EndAt        time.Time         `json:"end_at"`
	TTL          time.Duration     `json:"ttl"`
	AutoPause    bool              `json:"auto_pause,omitempty"`
	AutoResume   bool              `json:"auto_resume,omitempty"`
	PauseMemory  bool              `json:"pause_memory,omitempty"`
	Paused       bool              `json:"paused,omitempty"`
	ColdResume   bool              `json:"cold_resume,omitempty"`
	Network      networkJSON       `json:"network"`
	Internet     bool              `json:"internet"`
	// NetworkSet: the network was changed after create (updateNetwork),
	// which the kept session's record does not know: adoption applies it.
	NetworkSet bool `json:"network_set,omitempty"`
}

// saved writes sb's record if the handler keeps records; a failure is
// logged (the sandbox works; it is not adopted after a restart).
func (sb *sandbox) saved() {
	if sb.persist != nil {
		sb.persist()
	}
}

// recordPath is sandbox id's record file.
func (h *Handler) recordPath(id string) string {
	return filepath.Join(h.opts.StateDir, id+".json")
}

// persistFunc returns what writes sb's record (nil without StateDir).
func (h *Handler) persistFunc(sb *sandbox) func() {
	if h.opts.StateDir == "" {
		return nil
	}
	var writing sync.Mutex // two saves in turn: an older record never renamed over a newer one
	return func() {
		writing.Lock()
		defer writing.Unlock()
		sb.mu.Lock()
		rec := record{ID: sb.id, Owner: sb.owner, TemplateID: sb.templateID, EnvdToken: sb.envdToken, TrafficToken: sb.trafficToken,
			Metadata: sb.metadata, EnvVars: sb.envVars, Started: sb.started, EndAt: sb.endAt, TTL: sb.ttl,
			AutoPause: sb.lc.autoPause, AutoResume: sb.lc.autoResume, PauseMemory: sb.lc.pauseMemory,
			Paused: sb.paused, ColdResume: sb.coldResume, Network: sb.network.cfg, Internet: sb.network.access, NetworkSet: sb.networkSet}
		done := sb.done
		sb.mu.Unlock()
		if done {
			return // killed: its record is gone, or going
		}
		if err := writeRecord(h.recordPath(rec.ID), &rec); err != nil {
			h.log.Warn("e2b: the sandbox's record is not written: it will not be adopted after a restart", "sandbox", rec.ID, "err", err)
		}
	}
}

// writeRecord replaces path atomically (a crash leaves the old record or
// the new one). 0600: it holds the sandbox's access tokens.
func writeRecord(path string, rec *record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".rec-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// forget removes sandbox id's record.
func (h *Handler) forget(id string) {
	if h.opts.StateDir == "" {
		return
	}
	if err := os.Remove(h.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.log.Warn("e2b: remove the sandbox's record", "sandbox", id, "err", err)
	}
}

// adopt takes over the sandboxes recorded in StateDir whose sessions the
// manager holds (re-attached from the keeper, or restored asleep), and
// removes the records of the others. It returns how many it adopted.
func (h *Handler) adopt() (int, error) {
	if err := os.MkdirAll(h.opts.StateDir, 0o700); err != nil {
		return 0, fmt.Errorf("e2b: state directory: %w", err)
	}
	ents, err := os.ReadDir(h.opts.StateDir)
	if err != nil {
		return 0, fmt.Errorf("e2b: state directory: %w", err)
	}
	n := 0
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".rec-") {
			os.Remove(filepath.Join(h.opts.StateDir, name)) // a write cut short
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(h.opts.StateDir, name)
		var rec record
		b, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.ID+".json" != name {
			h.log.Warn("e2b: an unreadable sandbox record is removed", "file", name, "err", err)
			os.Remove(path)
			continue
		}
		ms, err := h.opts.Manager.Get(rec.Owner, rec.ID)
		if err != nil {
			h.log.Info("e2b: sandbox not adopted: its session did not survive the restart", "sandbox", rec.ID)
			os.Remove(path)
			continue
		}
		if err := h.adoptOne(&rec, ms); err != nil {
			h.log.Warn("e2b: sandbox not adopted", "sandbox", rec.ID, "err", err)
			continue
		}
		n++
	}
	return n, nil
}

// adoptOne makes rec's sandbox over session ms.
func (h *Handler) adoptOne(rec *record, ms *session.Managed) error {
	ms.Pin() // the sandbox's time to live governs it, as at create
	sb := &sandbox{id: rec.ID, owner: rec.Owner, templateID: rec.TemplateID, ms: ms, envdToken: rec.EnvdToken, trafficToken: rec.TrafficToken,
		metadata: rec.Metadata, envVars: rec.EnvVars, started: rec.Started, endAt: rec.EndAt, ttl: rec.TTL,
		lc:      lifecycle{autoPause: rec.AutoPause, autoResume: rec.AutoResume, pauseMemory: rec.PauseMemory},
		network: networkState{cfg: rec.Network, access: rec.Internet}, networkSet: rec.NetworkSet}
	sb.procs, sb.contexts = map[uint32]*process{}, map[string]*codeContext{}
	sb.contexts[defaultContextID] = &codeContext{id: defaultContextID, cwd: homeDir, s: ms.Session}
	if rec.NetworkSet {
		al, _, err := h.resolveNetwork(rec.Network, &rec.Internet)
		if err == nil {
			err = sb.setAllowlist(al)
		}
		if err != nil {
			h.log.Warn("e2b: an adopted sandbox's network could not be set again", "sandbox", rec.ID, "err", err)
		}
	}
	if rec.Paused {
		// The re-attached session was thawed: a paused sandbox stays paused
		// (no CPU) until connect or an auto-resume.
		if err := ms.Pause(); err != nil {
			h.log.Warn("e2b: an adopted paused sandbox could not be paused again: it runs", "sandbox", rec.ID, "err", err)
		} else {
			sb.paused, sb.coldResume = true, rec.ColdResume
		}
	}
	sb.persist = h.persistFunc(sb)
	h.mu.Lock()
	h.sandboxes[sb.id] = sb
	h.mu.Unlock()
	h.log.Info("e2b: sandbox adopted after a restart", "sandbox", sb.id, "paused", sb.paused, "end_at", sb.endAt)
	return nil
}

// Detach stops the handler as Close does, but leaves the sandboxes'
// sessions and records for the next server (serve --keep-sessions, whose
// keeper holds the sessions): their commands, terminals and extra code
// contexts end, as they would with this process.
func (h *Handler) Detach() error {
	all, ok := h.stopAll(true)
	if !ok {
		return nil
	}
	for _, sb := range all {
		h.killing.Go(sb.shutdown)
	}
	h.killing.Wait()
	return nil
}
