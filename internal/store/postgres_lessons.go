package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
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
	if err := checkLesson(l); err != nil {
		return nil, err
	}
	now := toMillis(p.nowMillis())
	var out *Lesson
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if l.ID != "" {
			old, err := scanLesson(tx.QueryRow(ctx, `SELECT `+lessonColumns+` FROM lessons WHERE id = $1 FOR UPDATE`, l.ID))
			switch {
			case err == nil && old.Owner == l.Owner:
				if _, err := tx.Exec(ctx, `UPDATE lessons SET updated_at = $1, scope = $2, text = $3, signature = $4, detail = $5, keywords = $6, files = $7, packages = $8, fix = $9, source = $10, run_id = $11, step = $12 WHERE id = $13`,
					now, l.Scope, l.Text, l.Signature, l.Detail, l.Keywords, l.Files, l.Packages, l.Fix, l.Source, l.RunID, l.Step, l.ID); err != nil {
					return err
				}
				l.CreatedAt, l.LastUsedAt, l.Shown, l.Recurred, l.Helped = old.CreatedAt, old.LastUsedAt, old.Shown, old.Recurred, old.Helped
				l.UpdatedAt = fromMillis(now)
				out = &l
				return nil
			case err == nil:
				l.ID = "" // another owner's id is never reused: it would reveal the lesson exists
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
		}
		if l.ID == "" {
			l.ID = newID()
		}
		created := now
		if !l.CreatedAt.IsZero() {
			created = toMillis(l.CreatedAt)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO lessons (`+lessonColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
			l.ID, l.Owner, created, now, toMillis(l.LastUsedAt), l.Scope, l.Text, l.Signature, l.Detail, l.Keywords, l.Files, l.Packages, l.Fix, l.Source, l.RunID, l.Step, l.Shown, l.Recurred, l.Helped); err != nil {
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

// GetLesson is Store.GetLesson.
func (p *Postgres) GetLesson(ctx context.Context, owner, id string) (*Lesson, error) {
	l, err := scanLesson(p.pool.QueryRow(ctx, `SELECT `+lessonColumns+` FROM lessons WHERE id = $1 AND owner = $2`, id, owner))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("lesson %s: %w", id, ErrNotFound)
	}
	return l, err
}

// DeleteLesson is Store.DeleteLesson.
func (p *Postgres) DeleteLesson(ctx context.Context, owner, id string) error {
	tag, err := p.pool.Exec(ctx, `DELETE FROM lessons WHERE id = $1 AND owner = $2`, id, owner)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("lesson %s: %w", id, ErrNotFound)
	}
	return nil
}

// ListLessons is Store.ListLessons; Rank is minus ts_rank, so that lower
// is better as with SQLite's BM25.
func (p *Postgres) ListLessons(ctx context.Context, q LessonQuery) ([]LessonHit, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	where, args := []string{"owner = $1"}, []any{q.Owner}
	if q.Signature != "" {
		args = append(args, q.Signature)
		where = append(where, fmt.Sprintf("signature = $%d", len(args)))
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
		args = append(args, strings.Join(words, " | ")) // only letters and digits: no tsquery syntax
		n := len(args)
		where = append(where, fmt.Sprintf("tsv @@ to_tsquery('simple', $%d)", n))
		rank = fmt.Sprintf("-ts_rank(tsv, to_tsquery('simple', $%d))::float8", n)
		order = fmt.Sprintf("ts_rank(tsv, to_tsquery('simple', $%d)) DESC, id", n)
	}
	args = append(args, q.Limit)
	rows, err := p.pool.Query(ctx, `SELECT `+lessonColumns+`, `+rank+` FROM lessons WHERE `+strings.Join(where, " AND ")+` ORDER BY `+order+fmt.Sprintf(` LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list lessons: %w", err)
	}
	defer rows.Close()
	var out []LessonHit
	for rows.Next() {
		var r float64
		l, err := scanLesson(rows, &r)
		if err != nil {
			return nil, fmt.Errorf("list lessons: %w", err)
		}
		out = append(out, LessonHit{Lesson: *l, Rank: r})
	}
	return out, rows.Err()
}

// CountLessonUse is Store.CountLessonUse.
func (p *Postgres) CountLessonUse(ctx context.Context, owner string, uses []LessonUse) error {
	now := toMillis(p.nowMillis())
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		for _, u := range uses {
			if _, err := tx.Exec(ctx, `UPDATE lessons SET shown = shown + $1, recurred = recurred + $2, helped = helped + $3, last_used_at = $4 WHERE id = $5 AND owner = $6`,
				u.Shown, u.Recurred, u.Helped, now, u.ID, owner); err != nil {
				return fmt.Errorf("count lesson use: %w", err)
			}
		}
		return nil
	})
}

// PruneLessons is Store.PruneLessons.
func (p *Postgres) PruneLessons(ctx context.Context, before time.Time) (int, error) {
	tag, err := p.pool.Exec(ctx, `DELETE FROM lessons WHERE helped = 0 AND GREATEST(last_used_at, created_at) < $1`, toMillis(before))
	if err != nil {
		return 0, fmt.Errorf("prune lessons: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
