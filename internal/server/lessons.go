package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/sandloop/sandloop/internal/lessons"
	"github.com/sandloop/sandloop/internal/store"
)

// lessonsEnabled answers 501 when the server keeps no lessons.
func (s *Server) lessonsEnabled(w http.ResponseWriter) bool {
	if s.opts.Lessons == nil {
		writeError(w, &apiError{http.StatusNotImplemented, "lessons_disabled", "this server keeps no lessons (it runs no agent)", 0})
		return false
	}
	return true
}

// lessonError maps the lesson store's and the checker's errors.
func lessonError(err error) error {
	var ie *lessons.ArgumentError
	switch {
	case errors.As(err, &ie):
		return badRequest("%v", err)
	case errors.Is(err, store.ErrNotFound):
		return &apiError{http.StatusNotFound, "not_found", "no such lesson", 0}
	}
	return err
}

// listLessons answers the caller's lessons: the best matches of ?q= (full
// text over text, error signatures, files and packages), else the newest.
func (s *Server) listLessons(w http.ResponseWriter, r *http.Request) {
	if !s.lessonsEnabled(w) {
		return
	}
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit < 0 || limit > 1000 {
		writeError(w, badRequest("limit is between 1 and 1000"))
		return
	}
	hits, err := s.opts.Lessons.ListLessons(r.Context(), store.LessonQuery{Owner: owner(r.Context()), Match: q.Get("q"), Limit: limit})
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]store.Lesson, 0, len(hits))
	for _, h := range hits {
		out = append(out, h.Lesson)
	}
	WriteJSON(w, http.StatusOK, lessons.Export{Lessons: out})
}

func (s *Server) getLesson(w http.ResponseWriter, r *http.Request) {
	if !s.lessonsEnabled(w) {
		return
	}
	l, err := s.opts.Lessons.GetLesson(r.Context(), owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, lessonError(err))
		return
	}
	WriteJSON(w, http.StatusOK, l)
}

// postLesson adds one lesson, or imports an export ({"lessons":[...]}):
// ids the caller already has are updated, others are added.
func (s *Server) postLesson(w http.ResponseWriter, r *http.Request) {
	if !s.lessonsEnabled(w) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var body struct {
		store.Lesson
		Lessons []store.Lesson `json:"lessons"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, err)
		return
	}
	list := body.Lessons
	if list == nil {
		list = []store.Lesson{body.Lesson}
	} else if body.Text != "" {
		writeError(w, badRequest("send one lesson, or {\"lessons\": [...]}, not both"))
		return
	}
	for i := range list {
		if err := lessons.Check(&list[i]); err != nil {
			writeError(w, lessonError(err))
			return
		}
		list[i].Owner = owner(r.Context())
	}
	out := make([]store.Lesson, 0, len(list))
	for _, l := range list {
		stored, err := s.opts.Lessons.PutLesson(r.Context(), l)
		if err != nil {
			writeError(w, lessonError(err))
			return
		}
		out = append(out, *stored)
	}
	if body.Lessons == nil {
		WriteJSON(w, http.StatusCreated, out[0])
		return
	}
	WriteJSON(w, http.StatusCreated, lessons.Export{Lessons: out})
}

func (s *Server) deleteLesson(w http.ResponseWriter, r *http.Request) {
	if !s.lessonsEnabled(w) {
		return
	}
	if err := s.opts.Lessons.DeleteLesson(r.Context(), owner(r.Context()), r.PathValue("id")); err != nil {
		writeError(w, lessonError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
