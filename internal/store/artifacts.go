package store

import (
	"context"
	"fmt"
	"io/fs"
)

// Artifact is a final file of a run.
type Artifact struct {
	// Path is slash-separated and relative to the workspace ("src/app.py").
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"` // permission bits; if zero, 0o644
	Size int64       `json:"size"`
	// Data is the content. ListArtifacts leaves it nil.
	Data []byte `json:"-"`
}

// PutArtifacts replaces the run's files with files, in one transaction. Paths must be
// clean relative paths (fs.ValidPath): the export writes them into a zip, and a ".."
// there would write outside the directory a user unpacks it into.
func (s *Store) PutArtifacts(ctx context.Context, runID string, files []Artifact) error {
	return putArtifacts(ctx, runID, files, s.inTx(ctx))
}

// ListArtifacts returns the run's files, by path, without their content.
func (s *Store) ListArtifacts(ctx context.Context, runID string) ([]Artifact, error) {
	return artifactsOf(ctx, s.inSnapshot(ctx), runID)
}

// Artifact returns one file of the run, with its content.
func (s *Store) Artifact(ctx context.Context, runID, path string) (*Artifact, error) {
	return getArtifact(ctx, sqlDB{s.r}, runID, path)
}

// putArtifacts is PutArtifacts in a write transaction that inTx runs.
func putArtifacts(ctx context.Context, runID string, files []Artifact, inTx txFunc) error {
	if err := checkArtifacts(files); err != nil {
		return err
	}
	err := inTx(func(tx db) error {
		if err := runExists(ctx, tx, runID, true); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `DELETE FROM artifacts WHERE run_id = ?`, runID); err != nil {
			return err
		}
		for _, f := range files {
			data, mode := artifactRow(f)
			if _, err := tx.exec(ctx, `INSERT INTO artifacts (run_id, path, mode, size, data) VALUES (?,?,?,?,?)`,
				runID, f.Path, int64(mode), len(data), data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("put artifacts of run %s: %w", runID, err)
	}
	return nil
}

func getArtifact(ctx context.Context, d db, runID, path string) (*Artifact, error) {
	a := Artifact{Path: path}
	var mode int64
	err := d.queryRow(ctx, `SELECT mode, size, data FROM artifacts WHERE run_id = ? AND path = ?`, runID, path).
		Scan(&mode, &a.Size, &a.Data)
	if isNoRows(err) {
		return nil, fmt.Errorf("run %s: file %s: %w", runID, path, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: file %s: %w", runID, path, err)
	}
	a.Mode = fs.FileMode(mode)
	return &a, nil
}

// artifactsOf is ListArtifacts in the snapshot that inSnapshot gives.
func artifactsOf(ctx context.Context, inSnapshot txFunc, runID string) ([]Artifact, error) {
	var out []Artifact
	err := inSnapshot(func(tx db) error {
		var err error
		out, err = listArtifacts(ctx, tx, runID, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list artifacts of run %s: %w", runID, err)
	}
	return out, nil
}

func listArtifacts(ctx context.Context, d db, runID string, withData bool) ([]Artifact, error) {
	if err := runExists(ctx, d, runID, false); err != nil {
		return nil, err
	}
	cols := "path, mode, size"
	if withData {
		cols += ", data"
	}
	rs, err := d.query(ctx, `SELECT `+cols+` FROM artifacts WHERE run_id = ? ORDER BY path`, runID)
	if err != nil {
		return nil, err
	}
	return collect(rs, func(row scanner) (Artifact, error) {
		var (
			a    Artifact
			mode int64
		)
		dest := []any{&a.Path, &mode, &a.Size}
		if withData {
			dest = append(dest, &a.Data)
		}
		err := row.Scan(dest...)
		a.Mode = fs.FileMode(mode)
		return a, err
	})
}

// checkArtifacts refuses paths that are not clean relative paths, or given twice.
func checkArtifacts(files []Artifact) error {
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		if !fs.ValidPath(f.Path) || f.Path == "." {
			return fmt.Errorf("store: artifact path %q is not a clean relative path", f.Path)
		}
		if seen[f.Path] {
			return fmt.Errorf("store: artifact path %q given twice", f.Path)
		}
		seen[f.Path] = true
	}
	return nil
}

// artifactRow is what both backends store of a file: its content, never
// nil (the column is NOT NULL; an empty file is still a file), and its
// permissions, 0o644 if none.
func artifactRow(f Artifact) ([]byte, fs.FileMode) {
	data := f.Data
	if data == nil {
		data = []byte{}
	}
	mode := f.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	return data, mode
}
