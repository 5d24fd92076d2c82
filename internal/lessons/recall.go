package lessons

import (
	"context"
	"sort"
	"strings"
	"unicode"

	"github.com/sandloop/sandloop/internal/store"
)

// stopwords are left out of recall queries: they match every lesson.
var stopwords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a an and are as at be by for from has have in into is it its of on or
		that the this to was were will with use using make write read each every all then than them they
		their there these those what when which who why how do does done not no yes can could should would
		please file files data print show give get put new one two into over per via your you we our i me my
		py python code script run result results output`) {
		stopwords[w] = true
	}
}

// modeWords are the agent's modes: every run has one, so a mode shared
// with a lesson (lessons learned before keep it among their keywords) says
// nothing about relevance.
var modeWords = map[string]bool{"generate": true, "debug": true, "refactor": true, "app": true}

// keywords are the words of a task worth matching on.
func keywords(s string) []string {
	var out []string
	seen := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' }) {
		if len(w) < 2 || stopwords[w] || seen[w] {
			continue
		}
		seen[w] = true
		out = append(out, w)
	}
	return out
}

// recall picks the lessons for a run's start: full-text matches of the
// task and the input files' names, ranked by BM25, with lessons about
// these very files (same name and content) first and those about files of
// the same name next; at most max lessons in budget tokens. A lesson must
// share at least two words with the query (the mode is not one: every
// run has one), or be about one of the files, so unrelated lessons stay out.
func recall(ctx context.Context, st Store, owner, task string, fileKeys []string, max, budget int) ([]store.Lesson, error) {
	words := taskWords(task)
	var names []string
	for _, k := range fileKeys {
		name, hash, _ := strings.Cut(k, "#")
		names = append(names, name)
		words = append(words, hash)
	}
	words = append(words, keywords(strings.Join(names, " "))...)
	if len(words) == 0 {
		return nil, nil
	}
	hits, err := st.ListLessons(ctx, store.LessonQuery{Owner: owner, Match: strings.Join(words, " "), Limit: 60})
	if err != nil {
		return nil, err
	}
	query := map[string]bool{}
	for _, w := range words {
		query[w] = true
	}
	type scored struct {
		l     store.Lesson
		score float64
	}
	var list []scored
	for _, h := range hits {
		if Demoted(&h.Lesson) {
			continue
		}
		s := -h.Rank // BM25: lower is better
		fileMatch := false
		for _, lk := range strings.Fields(h.Files) {
			for _, k := range fileKeys {
				switch {
				case lk == k:
					s += 20
					fileMatch = true
				case strings.SplitN(lk, "#", 2)[0] == strings.SplitN(k, "#", 2)[0]:
					s += 5
					fileMatch = true
				}
			}
		}
		common := 0
		for _, w := range keywords(strings.Join([]string{h.Text, h.Keywords, h.Packages, h.Signature, h.Detail}, " ")) {
			if query[w] && !modeWords[w] {
				common++
			}
		}
		if common < 2 && !fileMatch {
			continue
		}
		s += float64(h.Helped-h.Recurred) * 0.5
		list = append(list, scored{h.Lesson, s})
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].score > list[j].score })
	var out []store.Lesson
	used := 0
	for _, x := range list {
		if len(out) == max {
			break
		}
		cost := (len(x.l.Text) + 3 + 3) / 4
		if used+cost > budget {
			continue
		}
		used += cost
		out = append(out, x.l)
	}
	return out, nil
}

// taskWords are a task's keywords without the mode words.
func taskWords(task string) []string {
	var out []string
	for _, w := range keywords(task) {
		if !modeWords[w] {
			out = append(out, w)
		}
	}
	return out
}
