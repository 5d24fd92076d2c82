package store

import (
	"context"
	"strings"
	"time"
	"unicode"
)

// pgLessonsSchema is PostgreSQL migration 3: lessons (lessons.go), with a
// full-text index. Text is split on anything but letters and digits before
// to_tsvector, as SQLite's FTS5 splits it, so "sales.csv#ab12" is found by
// "sales", "csv" and "ab12" (PostgreSQL's parser would keep it whole).
const pgLessonsSchema = `
CREATE TABLE lessons (
	id           TEXT PRIMARY KEY,
	owner        TEXT NOT NULL DEFAULT '',
	created_at   BIGINT NOT NULL,
	updated_at   BIGINT NOT NULL,
	last_used_at BIGINT NOT NULL DEFAULT 0,
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
	helped       INTEGER NOT NULL DEFAULT 0,
	tsv          TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple', regexp_replace(lower(
		text || ' ' || signature || ' ' || detail || ' ' || keywords || ' ' || files || ' ' || packages), '[^[:alnum:]]+', ' ', 'g'))) STORED
);
CREATE INDEX lessons_by_owner ON lessons (owner, updated_at DESC);
CREATE INDEX lessons_by_signature ON lessons (owner, signature);
CREATE INDEX lessons_fts ON lessons USING GIN (tsv);
`

var _ LessonStore = (*Postgres)(nil)

// PutLesson is Store.PutLesson.
func (p *Postgres) PutLesson(ctx context.Context, l Lesson) (*Lesson, error) {
	return putLesson(ctx, p.inTx(ctx), l, p.nowMillis())
}

// GetLesson is Store.GetLesson.
func (p *Postgres) GetLesson(ctx context.Context, owner, id string) (*Lesson, error) {
	return getLesson(ctx, pgDB{p.pool}, owner, id)
}

// DeleteLesson is Store.DeleteLesson.
func (p *Postgres) DeleteLesson(ctx context.Context, owner, id string) error {
	return deleteLesson(ctx, p.inTx(ctx), owner, id)
}

// ListLessons is Store.ListLessons; Rank is minus ts_rank, so that lower
// is better as with SQLite's BM25.
func (p *Postgres) ListLessons(ctx context.Context, q LessonQuery) ([]LessonHit, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	where, args := []string{"owner = ?"}, []any{q.Owner}
	if q.Signature != "" {
		where, args = append(where, "signature = ?"), append(args, q.Signature)
	}
	order, rank := "updated_at DESC, id", "0::float8"
	if strings.TrimSpace(q.Match) != "" {
		words := strings.FieldsFunc(strings.ToLower(q.Match), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
		if len(words) == 0 {
			return nil, nil // only punctuation: nothing can match
		}
		if len(words) > 64 {
			words = words[:64]
		}
		// The words are bound three times, in the order the ?s appear:
		// the rank (before the WHERE), the match, the order.
		tsq := strings.Join(words, " | ") // only letters and digits: no tsquery syntax
		where = append(where, "tsv @@ to_tsquery('simple', ?)")
		rank = "-ts_rank(tsv, to_tsquery('simple', ?))::float8"
		order = "ts_rank(tsv, to_tsquery('simple', ?)) DESC, id"
		args = append(append([]any{tsq}, args...), tsq, tsq)
	}
	args = append(args, q.Limit)
	return lessonHits(pgDB{p.pool}.query(ctx, `SELECT `+lessonColumns+`, `+rank+` FROM lessons WHERE `+strings.Join(where, " AND ")+` ORDER BY `+order+` LIMIT ?`, args...))
}

// CountLessonUse is Store.CountLessonUse.
func (p *Postgres) CountLessonUse(ctx context.Context, owner string, uses []LessonUse) error {
	return countLessonUse(ctx, p.inTx(ctx), owner, uses, p.nowMillis())
}

// PruneLessons is Store.PruneLessons.
func (p *Postgres) PruneLessons(ctx context.Context, before time.Time) (int, error) {
	return pruneLessons(ctx, p.inTx(ctx), before)
}
