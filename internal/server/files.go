package server

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"path"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/workspace"
)

// files opens the directory of the session's sandbox that the request's
// dir parameter names for one request: the workspace (no dir, or
// /workspace or /home/user, its other name) or the sandbox's /tmp (the
// kernel's and its commands', reached through the sandbox's own root).
func (s *Server) files(w http.ResponseWriter, r *http.Request) (*workspace.Workspace, bool) {
	ms, ok := s.lookup(w, r)
	if !ok {
		return nil, false
	}
	opts := workspace.Options{MaxFileBytes: s.opts.MaxFileBytes, MaxTotalBytes: s.opts.MaxWorkspaceBytes}
	var ws *workspace.Workspace
	var err error
	switch dir := r.URL.Query().Get("dir"); dir {
	case "", jail.WorkspaceDir, jail.HomeDir:
		ws, err = ms.Files(opts)
	case "/tmp":
		ws, err = ms.TmpFiles(opts)
	default:
		err = badRequest("dir %q: the files API serves the workspace (%s, also %s; the default) and /tmp", dir, jail.WorkspaceDir, jail.HomeDir)
	}
	if err != nil {
		writeError(w, err)
		return nil, false
	}
	return ws, true
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	ws, ok := s.files(w, r)
	if !ok {
		return
	}
	defer ws.Close()
	p := r.URL.Query().Get("path")
	list, err := ws.List(p)
	if err != nil {
		writeError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, map[string]any{"path": cleanOrDot(p), "files": list})
}

func cleanOrDot(p string) string {
	c, err := workspace.Clean(p)
	if err != nil {
		return p
	}
	return c
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	ws, ok := s.files(w, r)
	if !ok {
		return
	}
	defer ws.Close()
	f, e, err := ws.Open(r.PathValue("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	ct := mime.TypeByExtension(path.Ext(e.Name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Served as an attachment: a workspace file is the sandbox's, not ours
	// to render on the server's origin.
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": e.Name}))
	w.Header().Set("Content-Security-Policy", "sandbox")
	http.ServeContent(w, r, e.Name, e.ModTime, f)
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	ws, ok := s.files(w, r)
	if !ok {
		return
	}
	defer ws.Close()
	if r.ContentLength > s.opts.MaxFileBytes {
		writeError(w, &workspace.LimitError{What: "file", Limit: s.opts.MaxFileBytes})
		return
	}
	n, err := ws.Write(r.PathValue("path"), r.Body)
	if err != nil {
		writeError(w, err)
		return
	}
	e, _ := ws.Stat(r.PathValue("path"))
	e.Size = n
	WriteJSON(w, http.StatusCreated, e)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	ws, ok := s.files(w, r)
	if !ok {
		return
	}
	defer ws.Close()
	if err := ws.Remove(r.PathValue("path")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) archive(w http.ResponseWriter, r *http.Request) {
	ws, ok := s.files(w, r)
	if !ok {
		return
	}
	defer ws.Close()
	format := r.URL.Query().Get("format")
	if format == "" {
		format = workspace.FormatTarGz
	}
	if format != workspace.FormatTarGz && format != workspace.FormatZip {
		writeError(w, badRequest("format %q: use tar.gz or zip", format))
		return
	}
	sub := r.URL.Query().Get("path")
	if _, err := workspace.Clean(sub); err != nil {
		writeError(w, err)
		return
	}
	ms, _ := s.opts.Manager.Get(owner(r.Context()), r.PathValue("id"))
	name := "workspace-" + ms.ID() + "." + format
	ct := "application/gzip"
	if format == workspace.FormatZip {
		ct = "application/zip"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	if err := ws.Archive(r.Context(), w, format, sub); err != nil {
		// Headers are gone; cut the stream so the client sees a broken archive.
		s.log.Warn("archive", "session", ms.ID(), "err", err)
		if errors.Is(err, io.ErrShortWrite) {
			return
		}
		panic(http.ErrAbortHandler)
	}
}
