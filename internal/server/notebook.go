package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A session's notebook is the web UI's cells (code, outputs, execution
// counts), kept by the server so that a reload, a second tab or another
// browser shows the notebook as it is. It lives in the server's memory,
// beside the session and never in its workspace, so code in the sandbox
// cannot read or forge it; it goes when the session does. Where sessions
// outlive their server, it is kept in Options.NotebookDir too (a host
// directory, as the memory), and the next server shows it.

// DefaultMaxNotebookBytes caps one notebook (its JSON or .ipynb), when
// Options leave MaxNotebookBytes zero.
const DefaultMaxNotebookBytes = 16 << 20

// Notebook is a session's cells, as GET and PUT /v1/sessions/{id}/notebook
// carry them.
type Notebook struct {
	Cells []NotebookCell `json:"cells"`
	// Revision counts the notebook's saves; a PUT that names the revision
	// it was based on is refused (409) if another save came in between.
	Revision  int64      `json:"revision"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// NotebookCell is one cell.
type NotebookCell struct {
	// ID is unique in the notebook ([A-Za-z0-9_-], at most 64); the server
	// gives one to a cell that has none.
	ID string `json:"id"`
	// Type is "code" (if empty), "markdown" or "raw".
	Type   string `json:"type,omitempty"`
	Source string `json:"source"`
	// ExecutionCount is the kernel's count of the cell's last execution;
	// null if it was not run.
	ExecutionCount *int `json:"execution_count"`
	// The end of its last execution: the status (ok, error, timeout, …),
	// how long it took and its peak memory.
	Status          string       `json:"status,omitempty"`
	DurationMS      float64      `json:"duration_ms,omitempty"`
	MemoryPeakBytes int64        `json:"memory_peak_bytes,omitempty"`
	Outputs         []CellOutput `json:"outputs"`
}

// CellOutput is one output of a cell, in the shape of the execute stream's
// events: stdout and stderr text, a result's MIME bundle, an error.
type CellOutput struct {
	Type         string            `json:"type"` // stdout | stderr | result | error
	Text         string            `json:"text,omitempty"`
	IsMainResult bool              `json:"is_main_result,omitempty"`
	Data         map[string]string `json:"data,omitempty"` // MIME type → text; base64 for images
	Name         string            `json:"name,omitempty"`
	Value        string            `json:"value,omitempty"`
	Traceback    string            `json:"traceback,omitempty"`
}

type putNotebookRequest struct {
	Cells []NotebookCell `json:"cells"`
	// Revision, if set, is the revision this notebook was based on.
	Revision *int64 `json:"revision"`
}

// notebooks holds every session's notebook, by session id. The zero value
// is ready.
type notebooks struct {
	mu sync.Mutex
	m  map[string]*storedNotebook
}

type storedNotebook struct {
	owner string
	nb    Notebook
}

func (s *Server) maxNotebookBytes() int64 {
	if s.opts.MaxNotebookBytes > 0 {
		return s.opts.MaxNotebookBytes
	}
	return DefaultMaxNotebookBytes
}

// notebookOf is a copy of the session's notebook (no cells if none was
// saved), from NotebookDir if this server has not seen it yet.
func (s *Server) notebookOf(id string) Notebook {
	s.notebooks.mu.Lock()
	defer s.notebooks.mu.Unlock()
	if e := s.notebooks.m[id]; e != nil {
		return e.nb
	}
	if e := s.loadNotebook(id); e != nil {
		if s.notebooks.m == nil {
			s.notebooks.m = map[string]*storedNotebook{}
		}
		s.notebooks.m[id] = e
		return e.nb
	}
	return Notebook{Cells: []NotebookCell{}}
}

// notebookFile is where NotebookDir keeps session id's notebook.
func (s *Server) notebookFile(id string) string {
	return filepath.Join(s.opts.NotebookDir, id+".json")
}

// notebookRecord is a notebook's file in NotebookDir.
type notebookRecord struct {
	Owner    string   `json:"owner"`
	Notebook Notebook `json:"notebook"`
}

// loadNotebook reads session id's notebook from NotebookDir, if it keeps
// one; the caller holds s.notebooks.mu.
func (s *Server) loadNotebook(id string) *storedNotebook {
	if s.opts.NotebookDir == "" {
		return nil
	}
	b, err := os.ReadFile(s.notebookFile(id))
	if err != nil {
		return nil
	}
	var rec notebookRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		s.log.Warn("a session's kept notebook is unreadable: it starts empty", "session", id, "err", err)
		return nil
	}
	if rec.Notebook.Cells == nil {
		rec.Notebook.Cells = []NotebookCell{}
	}
	return &storedNotebook{owner: rec.Owner, nb: rec.Notebook}
}

// keepNotebook writes e, session id's notebook, to NotebookDir (a failure
// is logged: the notebook is still served from memory); the caller holds
// s.notebooks.mu.
func (s *Server) keepNotebook(id string, e *storedNotebook) {
	if s.opts.NotebookDir == "" {
		return
	}
	b, err := json.Marshal(notebookRecord{Owner: e.owner, Notebook: e.nb})
	if err == nil {
		err = os.MkdirAll(s.opts.NotebookDir, 0o700)
	}
	if err == nil {
		tmp := s.notebookFile(id) + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, s.notebookFile(id))
		}
	}
	if err != nil {
		s.log.Warn("keep a session's notebook for the next server", "session", id, "err", err)
	}
}

// sweepNotebooks removes from NotebookDir the notebooks of sessions the
// manager does not hold (closed while no server ran, or not restored).
func (s *Server) sweepNotebooks() {
	if s.opts.NotebookDir == "" {
		return
	}
	paths, _ := filepath.Glob(filepath.Join(s.opts.NotebookDir, "*.json"))
	for _, p := range paths {
		id := strings.TrimSuffix(filepath.Base(p), ".json")
		b, err := os.ReadFile(p)
		var rec notebookRecord
		if err == nil && json.Unmarshal(b, &rec) == nil {
			if _, err := s.opts.Manager.Get(rec.Owner, id); err == nil {
				continue
			}
		}
		os.Remove(p)
	}
}

// saveNotebook replaces the session's cells, unless base names a revision
// that is no longer the current one.
func (s *Server) saveNotebook(owner, id string, cells []NotebookCell, base *int64) (Notebook, error) {
	s.notebooks.mu.Lock()
	defer s.notebooks.mu.Unlock()
	if s.notebooks.m == nil {
		s.notebooks.m = map[string]*storedNotebook{}
	}
	// Forget the notebooks of sessions that have ended, so memory is held
	// only for live sessions (each within the size cap).
	for sid, e := range s.notebooks.m {
		if _, err := s.opts.Manager.Get(e.owner, sid); err != nil {
			delete(s.notebooks.m, sid)
			if s.opts.NotebookDir != "" {
				os.Remove(s.notebookFile(sid))
			}
		}
	}
	e := s.notebooks.m[id]
	if e == nil {
		e = s.loadNotebook(id) // its revisions go on from the server before
	}
	if e == nil || e.owner != owner {
		e = &storedNotebook{owner: owner, nb: Notebook{}}
	}
	s.notebooks.m[id] = e
	if base != nil && *base != e.nb.Revision {
		return Notebook{}, &apiError{http.StatusConflict, "notebook_changed",
			fmt.Sprintf("the notebook was saved elsewhere since revision %d (it is at revision %d): GET it again, or PUT without revision to overwrite it", *base, e.nb.Revision), 0}
	}
	now := time.Now().UTC()
	e.nb = Notebook{Cells: cells, Revision: e.nb.Revision + 1, UpdatedAt: &now}
	s.keepNotebook(id, e)
	return e.nb, nil
}

var cellIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// checkCells validates cells and gives an id to those without one.
func checkCells(cells []NotebookCell) error {
	seen := map[string]bool{}
	for i := range cells {
		c := &cells[i]
		if c.ID == "" {
			c.ID = "cell-" + strconv.Itoa(i+1)
			for n := 2; seen[c.ID]; n++ {
				c.ID = "cell-" + strconv.Itoa(i+1) + "-" + strconv.Itoa(n)
			}
		}
		if !cellIDPattern.MatchString(c.ID) {
			return badRequest("cells[%d].id %q: use 1 to 64 letters, digits, _ or -", i, c.ID)
		}
		if seen[c.ID] {
			return badRequest("cells[%d].id %q is used by an earlier cell: ids must be unique", i, c.ID)
		}
		seen[c.ID] = true
		switch c.Type {
		case "", "code":
			c.Type = "code"
		case "markdown", "raw":
			if c.ExecutionCount != nil || len(c.Outputs) > 0 {
				return badRequest("cells[%d] is a %s cell: it has no execution_count or outputs", i, c.Type)
			}
		default:
			return badRequest(`cells[%d].type %q: use "code", "markdown" or "raw"`, i, c.Type)
		}
		if c.Outputs == nil {
			c.Outputs = []CellOutput{}
		}
		for j, o := range c.Outputs {
			switch o.Type {
			case "stdout", "stderr", "result", "error":
			default:
				return badRequest(`cells[%d].outputs[%d].type %q: use "stdout", "stderr", "result" or "error"`, i, j, o.Type)
			}
		}
	}
	return nil
}

// errNotebookTooLarge says what to do about a notebook over the cap.
func (s *Server) errNotebookTooLarge() error {
	return &apiError{http.StatusRequestEntityTooLarge, "notebook_too_large",
		fmt.Sprintf("the notebook is larger than %d MiB: clear the outputs of cells with large output (plots, long prints) or split the notebook", s.maxNotebookBytes()>>20), 0}
}

// readNotebookBody reads a request body within the notebook's cap.
func (s *Server) readNotebookBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.maxNotebookBytes()))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, s.errNotebookTooLarge()
	}
	if err != nil {
		return nil, err
	}
	if buf.Len() == 0 {
		return nil, badRequest("empty body: send the notebook")
	}
	return buf.Bytes(), nil
}

func (s *Server) getNotebook(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	WriteJSON(w, http.StatusOK, s.notebookOf(ms.ID()))
}

func (s *Server) putNotebook(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	body, err := s.readNotebookBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req putNotebookRequest
	if err := decodeJSONBytes(body, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Cells == nil {
		writeError(w, badRequest(`field "cells" is required (an empty list clears the notebook)`))
		return
	}
	if err := checkCells(req.Cells); err != nil {
		writeError(w, err)
		return
	}
	nb, err := s.saveNotebook(owner(r.Context()), ms.ID(), req.Cells, req.Revision)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, nb)
}

// getNotebookIpynb serves the notebook as a Jupyter notebook (nbformat 4.5).
func (s *Server) getNotebookIpynb(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	b, err := toIpynb(s.notebookOf(ms.ID()))
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ipynb+json")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": "notebook-" + ms.ID() + ".ipynb"}))
	w.Write(b)
}

// putNotebookIpynb replaces the notebook's cells with a Jupyter
// notebook's (nbformat 4).
func (s *Server) putNotebookIpynb(w http.ResponseWriter, r *http.Request) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return
	}
	body, err := s.readNotebookBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	cells, err := fromIpynb(body)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := checkCells(cells); err != nil {
		writeError(w, err)
		return
	}
	nb, err := s.saveNotebook(owner(r.Context()), ms.ID(), cells, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, nb)
}

// decodeJSONBytes is decodeJSON over a body already read.
func decodeJSONBytes(b []byte, v any) error {
	r, _ := http.NewRequest("PUT", "/", bytes.NewReader(b))
	return decodeJSON(r, v)
}
