package lessons

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sandloop/sandloop/internal/store"
)

// ArgumentError is a lesson given by a user (added, imported, posted)
// that cannot be stored; it says which field and what to fix.
type ArgumentError struct {
	Name string
	Err  error
}

func (e *ArgumentError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// MaxTextBytes caps a lesson's text: lessons go into every matching
// prompt, so they must stay short.
const MaxTextBytes = 500

// Check readies a lesson given by a user for storing: it trims and checks
// the fields, fills in defaults (scope: files when files are named, else
// global; source: user) and strips secrets.
func Check(l *store.Lesson) error {
	l.Text = strings.TrimSpace(l.Text)
	switch {
	case l.Text == "":
		return &ArgumentError{"text", errors.New("a lesson needs a text, e.g. \"seaborn is not installed: plot with matplotlib\"")}
	case len(l.Text) > MaxTextBytes:
		return &ArgumentError{"text", fmt.Errorf("is %d bytes; keep a lesson under %d (one short imperative sentence)", len(l.Text), MaxTextBytes)}
	case l.Shown < 0 || l.Recurred < 0 || l.Helped < 0:
		return &ArgumentError{"shown", errors.New("counts must not be negative")}
	}
	if l.Scope == "" {
		l.Scope = "global"
		if strings.TrimSpace(l.Files) != "" {
			l.Scope = "files"
		}
	}
	switch l.Scope {
	case "global", "task", "files":
	default:
		return &ArgumentError{"scope", fmt.Errorf("%q is not global, files or task", l.Scope)}
	}
	if l.Scope == "files" && strings.TrimSpace(l.Files) == "" {
		return &ArgumentError{"files", errors.New("a lesson of scope files names the files it is about (\"sales.csv\", or \"sales.csv#hash\" for one version)")}
	}
	if l.Source == "" {
		l.Source = "user"
	}
	if l.Signature != "" {
		l.Signature = strings.TrimSpace(l.Signature)
		if name, msg, ok := strings.Cut(l.Signature, ": "); ok && !strings.Contains(msg, "<") {
			// A raw error ("KeyError: 'date'") is normalized like the agent's.
			s := makeSig(name, msg)
			l.Signature, l.Detail = s.Text, s.Detail
		}
	}
	l.Text, l.Fix, l.Keywords = StripSecrets(l.Text), StripSecrets(l.Fix), StripSecrets(l.Keywords)
	return nil
}

// Export is the JSON form of a set of lessons (`sandloop lessons export`,
// GET /v1/lessons).
type Export struct {
	Lessons []store.Lesson `json:"lessons"`
}

// ReadExport reads an export (or a bare JSON array of lessons) and checks
// every lesson in it.
func ReadExport(r io.Reader) ([]store.Lesson, error) {
	b, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return nil, err
	}
	var e Export
	if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "[") {
		err = json.Unmarshal(b, &e.Lessons)
	} else {
		err = json.Unmarshal(b, &e)
	}
	if err != nil {
		return nil, &ArgumentError{"lessons", fmt.Errorf("not a lessons export (JSON {\"lessons\":[...]} or an array): %w", err)}
	}
	for i := range e.Lessons {
		if err := Check(&e.Lessons[i]); err != nil {
			ae := err.(*ArgumentError)
			return nil, &ArgumentError{fmt.Sprintf("lessons[%d].%s", i, ae.Name), ae.Err}
		}
	}
	return e.Lessons, nil
}
