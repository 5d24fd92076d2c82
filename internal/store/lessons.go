package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// lessonsSchema is migration 3: lessons the agent learned, and a full-text
// index over them.
//
// The index is a standalone FTS5 table (not an external-content one) kept
// in step by the same write transactions that change lessons: no triggers
// to get wrong, and the text is short. modernc's SQLite is built with FTS5.
const lessonsSchema = `
CREATE TABLE lessons (
	id           TEXT PRIMARY KEY,
	owner        TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	last_used_at INTEGER NOT NULL DEFAULT 0,
	scope        TEXT NOT NULL CHECK (scope IN ('global', 'files', 'task')),
	text         TEXT NOT NULL,
	signature    TEXT NOT NULL DEFAULT '',
	detail       TEXT NOT NULL DEFAULT '',
	keywords     TEXT NOT NULL DEFAULT '',
	files        TEXT NOT NULL DEFAULT '',
	packages     TEXT NOT NULL DEFAULT '',
	fix          TEXT NOT NULL DEFAULT '',
	source       TEXT NOT NULL DEFAULT '',
	run_id       TEXT NOT NULL DEFAULT '',
	step         INTEGER NOT NULL DEFAULT 0,
	shown        INTEGER NOT NULL DEFAULT 0,
	recurred     INTEGER NOT NULL DEFAULT 0,
	helped       INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX lessons_by_owner ON lessons (owner, updated_at DESC);
CREATE INDEX lessons_by_signature ON lessons (owner, signature);
CREATE VIRTUAL TABLE lessons_fts USING fts5 (id UNINDEXED, text, signature, keywords, files, packages);
`

// LessonStore keeps lessons. Both backends implement it (Postgres in
// postgres_lessons.go).
type LessonStore interface {
	PutLesson(ctx context.Context, l Lesson) (*Lesson, error)
	GetLesson(ctx context.Context, owner, id string) (*Lesson, error)
	DeleteLesson(ctx context.Context, owner, id string) error
	ListLessons(ctx context.Context, q LessonQuery) ([]LessonHit, error)
	CountLessonUse(ctx context.Context, owner string, uses []LessonUse) error
	PruneLessons(ctx context.Context, before time.Time) (int, error)
}

var _ LessonStore = (*Store)(nil)

// Lesson is one thing the agent learned: a short imperative text, where it
// applies and the evidence for it.
type Lesson struct {
	ID         string    `json:"id"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
	// Scope is "global" (sandbox and environment facts), "files" (about
	// input files, see Files) or "task".
	Scope string `json:"scope"`
	Text  string `json:"text"`
	// Signature is the normalized error the lesson prevents ("" for a
	// lesson added by hand); Detail the identifiers the normalization took
	// out of it ("DataFrame append"), to tell apart lessons of one shape.
	Signature string `json:"signature,omitempty"`
	Detail    string `json:"detail,omitempty"`
	// Keywords are words of the task that taught it; Files the input files
	// as "name#sha256-prefix"; Packages the modules involved. Each is
	// space-separated.
	Keywords string `json:"keywords,omitempty"`
	Files    string `json:"files,omitempty"`
	Packages string `json:"packages,omitempty"`
	// Fix is the change that fixed the error (a short diff).
	Fix string `json:"fix,omitempty"`
	// Source is how the text was made: "model", "fallback" or "user".
	Source string `json:"source,omitempty"`
	// RunID and Step are the evidence: where it was learned.
	RunID string `json:"run_id,omitempty"`
	Step  int    `json:"step,omitempty"`
	// Shown counts the runs it was shown to; Recurred the times its error
	// came back after it was shown; Helped the runs that finished after it
	// was shown without the error coming back.
	Shown    int `json:"shown"`
	Recurred int `json:"recurred"`
	Helped   int `json:"helped"`
	// Owner is who it belongs to, like Run.Owner.
	Owner string `json:"-"`
}

// LessonQuery selects lessons of one owner.
type LessonQuery struct {
	Owner string
	// Match, if set, is a full-text search: the lessons holding any of its
	// words, best first (by BM25 over text, signature, keywords, files and
	// packages).
	Match string
	// Signature, if set, keeps the lessons with exactly this signature.
	Signature string
	// Limit caps the list. If zero, 100.
	Limit int
}

// LessonHit is a lesson found by a query, with its full-text rank (lower
// is better; 0 when the query had no Match).
type LessonHit struct {
	Lesson
	Rank float64 `json:"rank"`
}

const lessonColumns = `id, owner, created_at, updated_at, last_used_at, scope, text, signature, detail, keywords, files, packages, fix, source, run_id, step, shown, recurred, helped`

func scanLesson(row scanner, extra ...any) (*Lesson, error) {
	var (
		l                    Lesson
		created, upd, usedAt int64
	)
	dest := append([]any{&l.ID, &l.Owner, &created, &upd, &usedAt, &l.Scope, &l.Text, &l.Signature, &l.Detail,
		&l.Keywords, &l.Files, &l.Packages, &l.Fix, &l.Source, &l.RunID, &l.Step, &l.Shown, &l.Recurred, &l.Helped}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	l.CreatedAt, l.UpdatedAt, l.LastUsedAt = fromMillis(created), fromMillis(upd), fromMillis(usedAt)
	return &l, nil
}

// PutLesson stores l: a new lesson if l.ID is empty or unknown to its
// owner, else an update of the lesson with that id (its owner, creation
// time and counts are kept). It returns the lesson as stored.
func (s *Store) PutLesson(ctx context.Context, l Lesson) (*Lesson, error) {
	return putLesson(ctx, s.inTx(ctx), l, s.nowMillis())
}

// putLesson is PutLesson in a write transaction that inTx runs.
func putLesson(ctx context.Context, inTx txFunc, l Lesson, at time.Time) (*Lesson, error) {
	if err := checkLesson(l); err != nil {
		return nil, err
	}
	now := toMillis(at)
	var out *Lesson
	err := inTx(func(tx db) error {
		if l.ID != "" {
			old, err := scanLesson(tx.queryRow(ctx, `SELECT `+lessonColumns+` FROM lessons WHERE id = ?`+tx.dialect().lock, l.ID))
			switch {
			case err == nil && old.Owner == l.Owner:
				_, err = tx.exec(ctx, `UPDATE lessons SET updated_at = ?, scope = ?, text = ?, signature = ?, detail = ?, keywords = ?, files = ?, packages = ?, fix = ?, source = ?, run_id = ?, step = ? WHERE id = ?`,
					now, l.Scope, l.Text, l.Signature, l.Detail, l.Keywords, l.Files, l.Packages, l.Fix, l.Source, l.RunID, l.Step, l.ID)
				if err == nil {
					err = indexLesson(ctx, tx, l)
				}
				if err != nil {
					return err
				}
				l.CreatedAt, l.LastUsedAt, l.Shown, l.Recurred, l.Helped = old.CreatedAt, old.LastUsedAt, old.Shown, old.Recurred, old.Helped
				l.UpdatedAt = fromMillis(now)
				out = &l
				return nil
			case err == nil:
				l.ID = "" // another owner's id is never reused: it would reveal the lesson exists
			case !isNoRows(err):
				return err
			}
		}
		if l.ID == "" {
			l.ID = newID()
		}
		created := now
		if !l.CreatedAt.IsZero() {
			created = toMillis(l.CreatedAt) // an imported lesson keeps its age
		}
		_, err := tx.exec(ctx, `INSERT INTO lessons (`+lessonColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			l.ID, l.Owner, created, now, toMillis(l.LastUsedAt), l.Scope, l.Text, l.Signature, l.Detail, l.Keywords, l.Files, l.Packages, l.Fix, l.Source, l.RunID, l.Step, l.Shown, l.Recurred, l.Helped)
		if err != nil {
			return err
		}
		if err := indexLesson(ctx, tx, l); err != nil {
			return err
		}
		l.CreatedAt, l.UpdatedAt = fromMillis(created), fromMillis(now)
		out = &l
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("put lesson: %w", err)
	}
	return out, nil
}

// checkLesson refuses what no backend may store.
func checkLesson(l Lesson) error {
	switch l.Scope {
	case "global", "files", "task":
	default:
		return fmt.Errorf("store: lesson scope %q is not global, files or task", l.Scope)
	}
	if strings.TrimSpace(l.Text) == "" {
		return errors.New("store: a lesson needs a text")
	}
	return nil
}

// indexLesson brings l into the dialect's separate full-text table, if it has one.
func indexLesson(ctx context.Context, tx db, l Lesson) error {
	fts := tx.dialect().lessonsFTS
	if fts == "" {
		return nil
	}
	if _, err := tx.exec(ctx, `DELETE FROM `+fts+` WHERE id = ?`, l.ID); err != nil {
		return err
	}
	_, err := tx.exec(ctx, `INSERT INTO `+fts+` (id, text, signature, keywords, files, packages) VALUES (?, ?, ?, ?, ?, ?)`,
		l.ID, l.Text, l.Signature+" "+l.Detail, l.Keywords, l.Files, l.Packages)
	return err
}

// GetLesson returns the owner's lesson id, or ErrNotFound (also for
// another owner's lesson).
func (s *Store) GetLesson(ctx context.Context, owner, id string) (*Lesson, error) {
	return getLesson(ctx, sqlDB{s.r}, owner, id)
}

func getLesson(ctx context.Context, d db, owner, id string) (*Lesson, error) {
	l, err := scanLesson(d.queryRow(ctx, `SELECT `+lessonColumns+` FROM lessons WHERE id = ? AND owner = ?`, id, owner))
	if isNoRows(err) {
		return nil, fmt.Errorf("lesson %s: %w", id, ErrNotFound)
	}
	return l, err
}

// DeleteLesson deletes the owner's lesson id, or returns ErrNotFound.
func (s *Store) DeleteLesson(ctx context.Context, owner, id string) error {
	return deleteLesson(ctx, s.inTx(ctx), owner, id)
}

func deleteLesson(ctx context.Context, inTx txFunc, owner, id string) error {
	return inTx(func(tx db) error {
		n, err := tx.exec(ctx, `DELETE FROM lessons WHERE id = ? AND owner = ?`, id, owner)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("lesson %s: %w", id, ErrNotFound)
		}
		if fts := tx.dialect().lessonsFTS; fts != "" {
			_, err = tx.exec(ctx, `DELETE FROM `+fts+` WHERE id = ?`, id)
		}
		return err
	})
}

// ListLessons returns the owner's lessons: the best full-text matches of
// q.Match, or else the most recently updated.
func (s *Store) ListLessons(ctx context.Context, q LessonQuery) ([]LessonHit, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	where, args := []string{"l.owner = ?"}, []any{q.Owner}
	if q.Signature != "" {
		where, args = append(where, "l.signature = ?"), append(args, q.Signature)
	}
	query := `SELECT ` + prefixed("l.", lessonColumns) + `, 0 FROM lessons l WHERE ` + strings.Join(where, " AND ") + ` ORDER BY l.updated_at DESC, l.id LIMIT ?`
	if m := ftsQuery(q.Match); m != "" {
		query = `SELECT ` + prefixed("l.", lessonColumns) + `, bm25(lessons_fts) FROM lessons_fts JOIN lessons l ON l.id = lessons_fts.id
			WHERE lessons_fts MATCH ? AND ` + strings.Join(where, " AND ") + ` ORDER BY bm25(lessons_fts), l.id LIMIT ?`
		args = append([]any{m}, args...)
	} else if strings.TrimSpace(q.Match) != "" {
		return nil, nil // only punctuation: nothing can match
	}
	return lessonHits(sqlDB{s.r}.query(ctx, query, append(args, q.Limit)...))
}

// lessonHits collects the rows of a lessons query whose last column is the rank.
func lessonHits(rs rows, err error) ([]LessonHit, error) {
	if err != nil {
		return nil, fmt.Errorf("list lessons: %w", err)
	}
	hits, err := collect(rs, func(row scanner) (LessonHit, error) {
		var rank float64
		l, err := scanLesson(row, &rank)
		if err != nil {
			return LessonHit{}, err
		}
		return LessonHit{Lesson: *l, Rank: rank}, nil
	})
	if err != nil || len(hits) == 0 {
		return nil, err // none: nil, as before the shared code
	}
	return hits, nil
}

// LessonUse is what one run did with a lesson, added to its counts.
type LessonUse struct {
	ID                      string
	Shown, Recurred, Helped int
}

// CountLessonUse adds uses to the owner's lessons' counts and sets their
// time of last use to now. Unknown ids are skipped (deleted meanwhile).
func (s *Store) CountLessonUse(ctx context.Context, owner string, uses []LessonUse) error {
	return countLessonUse(ctx, s.inTx(ctx), owner, uses, s.nowMillis())
}

func countLessonUse(ctx context.Context, inTx txFunc, owner string, uses []LessonUse, at time.Time) error {
	now := toMillis(at)
	return inTx(func(tx db) error {
		for _, u := range uses {
			if _, err := tx.exec(ctx, `UPDATE lessons SET shown = shown + ?, recurred = recurred + ?, helped = helped + ?, last_used_at = ? WHERE id = ? AND owner = ?`,
				u.Shown, u.Recurred, u.Helped, now, u.ID, owner); err != nil {
				return fmt.Errorf("count lesson use: %w", err)
			}
		}
		return nil
	})
}

// PruneLessons deletes the lessons (of every owner) not used since before
// and never found helpful; it returns how many.
func (s *Store) PruneLessons(ctx context.Context, before time.Time) (int, error) {
	return pruneLessons(ctx, s.inTx(ctx), before)
}

func pruneLessons(ctx context.Context, inTx txFunc, before time.Time) (int, error) {
	var n int64
	err := inTx(func(tx db) error {
		stale := `helped = 0 AND ` + tx.dialect().greatest + `(last_used_at, created_at) < ?`
		cut := toMillis(before)
		if fts := tx.dialect().lessonsFTS; fts != "" {
			if _, err := tx.exec(ctx, `DELETE FROM `+fts+` WHERE id IN (SELECT id FROM lessons WHERE `+stale+`)`, cut); err != nil {
				return err
			}
		}
		var err error
		n, err = tx.exec(ctx, `DELETE FROM lessons WHERE `+stale, cut)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune lessons: %w", err)
	}
	return int(n), nil
}

func prefixed(p, columns string) string {
	cols := strings.Split(columns, ", ")
	for i, c := range cols {
		cols[i] = p + c
	}
	return strings.Join(cols, ", ")
}

// ftsQuery turns free text into an FTS5 query matching any of its words:
// each word quoted (so no word is read as FTS syntax), joined with OR.
func ftsQuery(s string) string {
	words := strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_'
	})
	seen := map[string]bool{}
	var terms []string
	for _, w := range words {
		if seen[w] || len(terms) >= 64 {
			continue
		}
		seen[w] = true
		terms = append(terms, `"`+w+`"`)
	}
	return strings.Join(terms, " OR ")
}
