package server

import (
	"net/http"
	"time"

	"github.com/sandloop/sandloop/internal/template"
)

// templateJSON is a template as the API shows it.
type templateJSON struct {
	Name     string             `json:"name"`
	ID       string             `json:"id"`
	Python   string             `json:"python"`
	Packages []template.Package `json:"packages"`
	Preload  []string           `json:"preload"`
	SizeMB   float64            `json:"size_mb"`
	Files    int                `json:"files"`
	Created  time.Time          `json:"created_at"`
	Sessions int                `json:"sessions"`
	Warm     bool               `json:"warm"`
	// FromSnapshot: what a template built from a snapshot gives each
	// session (not the snapshot's or its session's id: those are its
	// owner's).
	FromSnapshot *templateSeedJSON `json:"from_snapshot,omitempty"`
}

type templateSeedJSON struct {
	Base      string   `json:"base,omitempty"`
	Files     int      `json:"files"`
	FilesMB   float64  `json:"files_mb"`
	Variables []string `json:"variables"`
	NotSaved  []string `json:"not_saved,omitempty"`
}

func (s *Server) templateJSON(t *template.Template, warm map[string]bool) templateJSON {
	var seed *templateSeedJSON
	if fs := t.Snapshot; fs != nil {
		seed = &templateSeedJSON{Base: fs.Base, Files: fs.FileCount, FilesMB: float64(fs.FileBytes*10>>20) / 10, Variables: fs.Variables, NotSaved: fs.NotSaved}
		if seed.Variables == nil {
			seed.Variables = []string{}
		}
	}
	return templateJSON{
		FromSnapshot: seed,
		Name:         t.Name, ID: t.ID, Python: t.Python, Packages: t.Packages, Preload: t.Preload,
		SizeMB: float64(t.Size*10>>20) / 10, Files: t.Files, Created: t.Created, Sessions: s.opts.Templates.Store().InUse(t.Name), Warm: warm[t.Name],
	}
}

func (s *Server) warmTemplates() map[string]bool {
	warm := map[string]bool{}
	for _, n := range s.opts.Templates.WarmNames() {
		warm[n] = true
	}
	return warm
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	out := []templateJSON{}
	if s.opts.Templates != nil {
		ts, err := s.opts.Templates.Store().List()
		if err != nil {
			writeError(w, err)
			return
		}
		warm := s.warmTemplates()
		for _, t := range ts {
			out = append(out, s.templateJSON(t, warm))
		}
	}
	WriteJSON(w, http.StatusOK, map[string]any{"templates": out})
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	if s.opts.Templates == nil {
		writeError(w, template.ErrNotFound)
		return
	}
	t, err := s.opts.Templates.Store().Get(r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, s.templateJSON(t, s.warmTemplates()))
}

// deleteTemplate removes a template; 409 while sessions use it.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if s.opts.Templates == nil {
		writeError(w, template.ErrNotFound)
		return
	}
	if err := s.opts.Templates.Remove(r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
