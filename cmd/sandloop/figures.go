package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/store"
)

// figure is a PNG one of a run's executions produced, written to a file.
type figure struct {
	Step int
	Row  int // the index of its tool result among the run's stored steps
	Path string
}

// figureDir is where a run's figures are written: DATA/figures/RUNID.
func figureDir(dataDir, runID string) string {
	return filepath.Join(dataDir, "figures", runID)
}

// writeFigures writes the PNG images of the run's executions (plots, displayed
// images), kept in its history, to dir as step-N-K.png, and returns them in
// order. A file already there with the same bytes is left as it is, so
// `runs show` may call it again.
func writeFigures(ctx context.Context, st store.History, runID, dir string) ([]figure, error) {
	steps, err := st.ListSteps(ctx, runID)
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	var out []figure
	perStep := map[int]int{} // images so far in each step (a step may run several tools)
	for row, s := range steps {
		if s.Kind != "tool" {
			continue
		}
		var e agent.Event
		if json.Unmarshal(s.Data, &e) != nil || e.Result == nil {
			continue
		}
		for _, b64 := range agent.PNGs(e.Result) {
			png, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			perStep[e.Step]++
			p := filepath.Join(dir, fmt.Sprintf("step-%d-%d.png", e.Step, perStep[e.Step]))
			if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, png) {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return out, err
				}
				if err := os.WriteFile(p, png, 0o644); err != nil {
					return out, err
				}
			}
			out = append(out, figure{Step: e.Step, Row: row, Path: p})
		}
	}
	return out, nil
}

// sayFigures writes the run's figures under the data dir and says where.
func sayFigures(ctx context.Context, w io.Writer, st store.History, runID, dataDir string) {
	figs, err := writeFigures(ctx, st, runID, figureDir(dataDir, runID))
	if err != nil {
		fmt.Fprintf(w, "sandloop: the run's figures could not be written: %v\n", err)
	}
	if len(figs) == 0 {
		return
	}
	fmt.Fprintf(w, "sandloop: figures of the run's executions, written to %s:\n", filepath.Dir(figs[0].Path))
	for _, f := range figs {
		fmt.Fprintf(w, "  %s (step %d)\n", filepath.Base(f.Path), f.Step)
	}
}
