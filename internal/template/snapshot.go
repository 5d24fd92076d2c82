package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/workspace"
)

// KindSnapshot is a template built from a durable snapshot of a session
// whose session used no template: the sandbox's own Python, plus the
// snapshot's files and variables (Manifest.Snapshot). A snapshot of a
// session of template T makes a template of T's kind and environment
// (same tree, same zygote) with the snapshot's part added.
const KindSnapshot = "snapshot"

// FromSnapshot is what a template built from a snapshot gives each of its
// sessions before it is handed out.
type FromSnapshot struct {
	// ID is the snapshot's id, and Session the session it was taken of.
	ID      string `json:"id"`
	Session string `json:"session,omitempty"`
	// Base is the template of that session ("" for none): this template
	// has its environment.
	Base string `json:"base,omitempty"`
	// Files is the id of the tree of the workspace's files (trees/<id>,
	// read-only), FileCount its files and links, FileBytes their size.
	Files     string `json:"files"`
	FileCount int    `json:"file_count"`
	FileBytes int64  `json:"file_bytes"`
	// State is the sha256 of the kernel's serialized variables
	// (states/<sha256>; "" if the snapshot has none), StateBytes its size.
	State      string `json:"state,omitempty"`
	StateBytes int64  `json:"state_bytes,omitempty"`
	// Variables are the names it holds; NotSaved, "name: reason", the
	// variables the snapshot could not carry.
	Variables []string `json:"variables,omitempty"`
	NotSaved  []string `json:"not_saved,omitempty"`
}

// SnapshotSource is where BuildFromSnapshot reads: a snapshot store and
// the owner of the snapshot (only that owner's snapshots are visible).
type SnapshotSource struct {
	Store *snapshot.Store
	Owner string
}

// SnapshotBuildOptions configure BuildFromSnapshot.
type SnapshotBuildOptions struct {
	// Preload and Env as in Spec (a template based on another keeps that
	// one's unless set).
	Preload []string
	Env     map[string]string
}

// statePath is where the store keeps a template's variables.
func (s *Store) statePath(sum string) string {
	return filepath.Join(s.dir, "states", sum)
}

// BuildFromSnapshot makes the template name of snapshot id of src: its
// files frozen read-only in the store (content-addressed), its variables
// kept as one read-only file, every piece verified against the
// snapshot's checksums (a corrupted snapshot is refused with its
// *snapshot.CorruptError; an unknown one, or another owner's, is
// snapshot.ErrNotFound). If the snapshot was taken in a session of a
// template, the new template is based on that one, which must still be
// in the store.
func (s *Store) BuildFromSnapshot(ctx context.Context, name string, src SnapshotSource, id string, o *SnapshotBuildOptions) (*Template, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if src.Store == nil {
		return nil, &ArgumentError{"snapshot", errors.New("no snapshot store")}
	}
	if o == nil {
		o = &SnapshotBuildOptions{}
	}
	spec := Spec{Preload: o.Preload, Env: o.Env}
	for _, m := range spec.Preload {
		if !moduleRE.MatchString(m) {
			return nil, &ArgumentError{"preload", fmt.Errorf("%q is not a module name", m)}
		}
	}
	sm, err := src.Store.Get(ctx, src.Owner, id)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Name: name, Kind: KindSnapshot, Python: session.SystemPythonVersion(), Packages: []Package{}, Preload: o.Preload, Env: o.Env, Created: time.Now().UTC()}
	if sm.Template != "" {
		base, err := s.Get(sm.Template)
		if errors.Is(err, ErrNotFound) {
			return nil, &ArgumentError{"snapshot", fmt.Errorf("%s was taken in a session of template %s, which this store does not have (build or copy that template first)", id, sm.Template)}
		}
		if err != nil {
			return nil, err
		}
		if base.Snapshot != nil {
			// A session of a snapshot template: its seed is in the
			// snapshot already; the environment is the base's own.
			m.Kind = base.Kind
		}
		bm := base.Manifest
		bm.Name, bm.Created, bm.Snapshot = name, m.Created, nil
		if o.Preload != nil {
			bm.Preload = o.Preload
		}
		if o.Env != nil {
			bm.Env = o.Env
		}
		m = &bm
	}

	tmp, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "snapshot-")
	if err != nil {
		return nil, err
	}
	defer removeTree(tmp)
	files := filepath.Join(tmp, "files")
	if err := os.Mkdir(files, 0o755); err != nil {
		return nil, err
	}
	ws, err := workspace.Open(files, &workspace.Options{})
	if err != nil {
		return nil, err
	}
	_, _, err = src.Store.Restore(ctx, src.Owner, id, ws)
	ws.Close()
	if err != nil {
		return nil, err
	}
	tree := filepath.Join(tmp, "tree")
	filesID, size, count, err := freeze(files, tree)
	if err != nil {
		return nil, err
	}
	fs := &FromSnapshot{ID: sm.ID, Session: sm.Session, Base: sm.Template, Files: filesID, FileBytes: size}
	for _, f := range sm.Files {
		if f.Type != "dir" {
			fs.FileCount++
		}
	}

	var stateTmp string
	if sm.State != nil {
		stateTmp = filepath.Join(tmp, "state")
		sum, n, err := copyState(ctx, src, id, stateTmp)
		if err != nil {
			return nil, err
		}
		fs.State, fs.StateBytes = sum, n
		var km struct {
			Variables []string `json:"variables"`
			NotSaved  []struct {
				Name   string `json:"name"`
				Reason string `json:"reason"`
			} `json:"not_saved"`
		}
		if len(sm.State.Manifest) > 0 {
			if err := json.Unmarshal(sm.State.Manifest, &km); err != nil {
				return nil, &snapshot.CorruptError{Snapshot: id, Object: "manifest", Of: "kernel state", Reason: "its account of the variables does not parse: " + err.Error()}
			}
		}
		fs.Variables = km.Variables
		for _, ns := range km.NotSaved {
			fs.NotSaved = append(fs.NotSaved, ns.Name+": "+ns.Reason)
		}
	}
	m.Snapshot = fs
	if m.Kind == KindSnapshot {
		m.ID, m.Size, m.Files = filesID, size, count
	}
	return s.installSnapshot(m, tree, stateTmp)
}

// copyState copies the snapshot's state stream (verified chunk by chunk)
// to path, read-only, and returns its sha256 and size.
func copyState(ctx context.Context, src SnapshotSource, id, path string) (string, int64, error) {
	rc, _, err := src.Store.OpenState(ctx, src.Owner, id)
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	return writeHashed(rc, path, 0o444)
}

// installSnapshot moves a snapshot template's files tree and state into
// the store, then records its manifest (install).
func (s *Store) installSnapshot(m *Manifest, tree, state string) (*Template, error) {
	s.mu.Lock()
	if n := s.inUse[m.Name]; n > 0 {
		s.mu.Unlock()
		return nil, &InUseError{Name: m.Name, Sessions: n}
	}
	final := filepath.Join(s.dir, "trees", m.Snapshot.Files)
	if _, err := os.Stat(final); err != nil {
		if err := os.Rename(tree, final); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	if state != "" {
		if err := os.MkdirAll(filepath.Join(s.dir, "states"), 0o755); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if err := os.Rename(state, s.statePath(m.Snapshot.State)); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	s.mu.Unlock()
	return s.install(m, "")
}

// sweepLocked removes the trees and the state of t (a template just
// removed or replaced) that no template of the store refers to any more.
func (s *Store) sweepLocked(t *Template) {
	trees := map[string]bool{t.ID: true}
	state := ""
	if t.Snapshot != nil {
		trees[t.Snapshot.Files] = true
		state = t.Snapshot.State
	}
	for _, o := range s.listLocked() {
		delete(trees, o.ID)
		if o.Snapshot != nil {
			delete(trees, o.Snapshot.Files)
			if o.Snapshot.State == state {
				state = ""
			}
		}
	}
	for id := range trees {
		removeTree(filepath.Join(s.dir, "trees", id))
	}
	if state != "" {
		os.Remove(s.statePath(state))
	}
}

// SeedFiles is the host directory of a snapshot template's files.
func (t *Template) SeedFiles(s *Store) string {
	if t.Snapshot == nil {
		return ""
	}
	return filepath.Join(s.dir, "trees", t.Snapshot.Files)
}
