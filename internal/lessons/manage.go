package lessons

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/sandloop/sandloop/internal/store"
)

// InputError is a lesson given by a user (added, imported, posted) that
// cannot be stored; it says what to fix.
type InputError struct {
	Field string
	Msg   string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Msg }

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
		return &InputError{"text", "a lesson needs a text, e.g. \"seaborn is not installed: plot with matplotlib\""}
	case len(l.Text) > MaxTextBytes:
		return &InputError{"text", fmt.Sprintf("is %d bytes; keep a lesson under %d (one short imperative sentence)", len(l.Text), MaxTextBytes)}
	case l.Shown < 0 || l.Recurred < 0 || l.Helped < 0:
		return &InputError{"shown", "counts must not be negative"}
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
		return &InputError{"scope", fmt.Sprintf("%q is not global, files or task", l.Scope)}
	}
	if l.Scope == "files" && strings.TrimSpace(l.Files) == "" {
		return &InputError{"files", "a lesson of scope files names the files it is about (\"sales.csv\", or \"sales.csv#hash\" for one version)"}
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
		return nil, &InputError{"lessons", "not a lessons export (JSON {\"lessons\":[...]} or an array): " + err.Error()}
	}
	for i := range e.Lessons {
		if err := Check(&e.Lessons[i]); err != nil {
			ie := err.(*InputError)
			return nil, &InputError{fmt.Sprintf("lessons[%d].%s", i, ie.Field), ie.Msg}
		}
	}
	return e.Lessons, nil
}
