package store

import (
	"errors"
	"testing"
	"time"
)

func init() {
	shared = append(shared, struct {
		name string
		test func(t *testing.T, b backend)
	}{"Lessons", testLessons})
}

// testLessons: ownership, full-text search, counts, updates, pruning.
func testLessons(t *testing.T, b backend) {
	c := newClock()
	s := b.open(t, b.fresh(t), c).(LessonStore)
	ctx := t.Context()
	put := func(l Lesson) *Lesson {
		t.Helper()
		out, err := s.PutLesson(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a := put(Lesson{Owner: "alice", Scope: "global", Text: "seaborn is not installed: plot with matplotlib", Signature: "ModuleNotFoundError: No module named <q>", Detail: "seaborn", Packages: "seaborn"})
	c.advance(time.Second)
	fl := put(Lesson{Owner: "alice", Scope: "files", Text: "sales.csv's date column is day", Files: "sales.csv#0011223344556677", Keywords: "monthly totals"})
	bob := put(Lesson{Owner: "bob", Scope: "task", Text: "plot with matplotlib, not seaborn"})

	if _, err := s.GetLesson(ctx, "bob", a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob reads alice's lesson: %v", err)
	}
	if err := s.DeleteLesson(ctx, "bob", a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob deletes alice's lesson: %v", err)
	}
	// Bob cannot take over alice's id by putting a lesson with it.
	if l := put(Lesson{ID: a.ID, Owner: "bob", Scope: "global", Text: "mine now"}); l.ID == a.ID {
		t.Error("bob's put reused alice's id")
	}
	if l, _ := s.GetLesson(ctx, "alice", a.ID); l.Text != a.Text {
		t.Errorf("alice's lesson changed: %+v", l)
	}

	hits, err := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: "plot a heatmap with seaborn"})
	if err != nil || len(hits) != 1 || hits[0].ID != a.ID || hits[0].Rank >= 0 {
		t.Errorf("search seaborn: %+v %v", hits, err)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: "0011223344556677"}); len(hits) != 1 || hits[0].ID != fl.ID {
		t.Errorf("search by file hash: %+v", hits)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: `"); DROP TABLE lessons; --`}); len(hits) != 0 {
		t.Errorf("punctuation matched: %+v", hits)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Signature: "ModuleNotFoundError: No module named <q>"}); len(hits) != 1 || hits[0].ID != a.ID {
		t.Errorf("by signature: %+v", hits)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice"}); len(hits) != 2 || hits[0].ID != fl.ID {
		t.Errorf("list: %+v", hits)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "bob", Match: "seaborn"}); len(hits) != 1 || hits[0].ID != bob.ID {
		t.Errorf("bob's search: %+v", hits)
	}

	c.advance(time.Minute)
	if err := s.CountLessonUse(ctx, "alice", []LessonUse{{ID: a.ID, Shown: 1, Helped: 1}, {ID: fl.ID, Shown: 1, Recurred: 1}, {ID: bob.ID, Shown: 5}}); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.GetLesson(ctx, "alice", a.ID); l.Shown != 1 || l.Helped != 1 || !l.LastUsedAt.Equal(c.now()) {
		t.Errorf("counts: %+v", l)
	}
	if l, _ := s.GetLesson(ctx, "bob", bob.ID); l.Shown != 0 {
		t.Errorf("alice's use counted on bob's lesson: %+v", l)
	}
	// An update keeps the counts and the creation time.
	upd := *a
	upd.Text = "seaborn is missing here: use matplotlib"
	if l := put(upd); l.Shown != 1 || l.Helped != 1 || !l.CreatedAt.Equal(a.CreatedAt) {
		t.Errorf("update lost counts: %+v", l)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: "missing"}); len(hits) != 1 {
		t.Errorf("the index did not follow the update: %+v", hits)
	}

	// Pruning: unused for long and never helpful goes; helpful stays.
	c.advance(100 * 24 * time.Hour)
	n, err := s.PruneLessons(ctx, c.now().Add(-90*24*time.Hour))
	if err != nil || n != 3 { // b (recurred, never helped), bob's two
		t.Errorf("pruned %d, %v", n, err)
	}
	if _, err := s.GetLesson(ctx, "alice", a.ID); err != nil {
		t.Errorf("a helpful lesson was pruned: %v", err)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: "sales"}); len(hits) != 0 {
		t.Errorf("a pruned lesson is still found: %+v", hits)
	}
	if err := s.DeleteLesson(ctx, "alice", a.ID); err != nil {
		t.Fatal(err)
	}
	if hits, _ := s.ListLessons(ctx, LessonQuery{Owner: "alice", Match: "matplotlib"}); len(hits) != 0 {
		t.Errorf("a deleted lesson is still found: %+v", hits)
	}
	if _, err := s.PutLesson(ctx, Lesson{Scope: "everywhere", Text: "x"}); err == nil {
		t.Error("a bad scope was stored")
	}
}
