package store

import (
	"archive/zip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"
)

// ExportRun writes the run as a zip archive to w:
//
//	run.json       the run, report included
//	steps.json     every step, in order, with full tool results
//	events.jsonl   the event log, one event per line
//	files/PATH     the run's final files, with their permissions
//
// Everything comes from one read snapshot, so a run still being written exports
// consistently. Nothing is written to w if reading fails before the zip starts.
func (s *Store) ExportRun(ctx context.Context, id string, w io.Writer) error {
	return exportRun(ctx, id, w, s.inSnapshot(ctx))
}

// exportRun is ExportRun reading in the snapshot that inSnapshot gives.
func exportRun(ctx context.Context, id string, w io.Writer, inSnapshot txFunc) error {
	var (
		run    *Run
		steps  []Step
		events []Event
		files  []Artifact
	)
	err := inSnapshot(func(tx db) error {
		var err error
		if run, err = selectRun(ctx, tx, id, false); err != nil {
			return err
		}
		if steps, err = listSteps(ctx, tx, id); err != nil {
			return err
		}
		if events, err = listEvents(ctx, tx, id, 0, 0); err != nil {
			return err
		}
		files, err = listArtifacts(ctx, tx, id, true)
		return err
	})
	if err != nil {
		return fmt.Errorf("export run %s: %w", id, err)
	}
	if err := writeExport(w, run, steps, events, files); err != nil {
		return fmt.Errorf("export run %s: %w", id, err)
	}
	return nil
}

// writeExport writes the zip ExportRun describes; both backends share it.
func writeExport(w io.Writer, run *Run, steps []Step, events []Event, files []Artifact) error {
	zw := zip.NewWriter(w)
	modified := run.UpdatedAt
	addJSON := func(name string, v any, indent bool) error {
		f, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: modified})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(f)
		if indent {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(v)
	}
	if err := addJSON("run.json", run, true); err != nil {
		return err
	}
	if err := addJSON("steps.json", steps, true); err != nil {
		return err
	}
	ev, err := zw.CreateHeader(&zip.FileHeader{Name: "events.jsonl", Method: zip.Deflate, Modified: modified})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(ev)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	for _, f := range files {
		h := &zip.FileHeader{Name: path.Join("files", f.Path), Method: zip.Deflate, Modified: modified}
		h.SetMode(f.Mode.Perm()) // a regular file with the stored permissions
		fw, err := zw.CreateHeader(h)
		if err != nil {
			return err
		}
		if _, err := fw.Write(f.Data); err != nil {
			return err
		}
	}
	return zw.Close()
}
