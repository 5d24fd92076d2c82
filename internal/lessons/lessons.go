// Package lessons makes the agent learn from what the sandbox showed it: a
// mistake a run made and fixed (or a fact about the sandbox it ran into)
// becomes a short lesson in the history database, recalled at the start
// of later runs on similar tasks or files, and appended to a failing tool
// result whose error matches ("seen before: ...").
//
// Policy. Each run counts, per lesson shown: shown, recurred (its error
// came back after it was shown) and helped (it mattered — the error came
// and was answered with it, or the run did what it says — and the run
// finished without the error coming back). A lesson is demoted — no longer recalled — once it
// recurred at least twice and more often than it helped; a later run that
// fixes the error again replaces it with a fresh lesson. Lessons never
// found helpful and not used for PruneAfter (90 days) are deleted.
package lessons

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/store"
)

// Store is what lessons need of the history database.
type Store interface {
	PutLesson(ctx context.Context, l store.Lesson) (*store.Lesson, error)
	ListLessons(ctx context.Context, q store.LessonQuery) ([]store.LessonHit, error)
	DeleteLesson(ctx context.Context, owner, id string) error
	CountLessonUse(ctx context.Context, owner string, uses []store.LessonUse) error
	PruneLessons(ctx context.Context, before time.Time) (int, error)
}

// Options configure a run's lessons.
type Options struct {
	Store Store
	// Owner is the run's owner: it sees and makes only its own lessons.
	Owner string
	// RunID is recorded as the lessons' evidence.
	RunID string
	// PromptTokens caps the lessons recalled at the start (estimated at 4
	// bytes a token). If zero, 400.
	PromptTokens int
	// MaxRecall caps how many are recalled at the start. If zero, 5.
	MaxRecall int
	// PruneAfter is how long an unhelpful lesson lives unused. If zero, 90 days.
	PruneAfter time.Duration
	Logger     *slog.Logger
}

// Run is one run's lessons: it implements agent.Lessons.
type Run struct {
	opts    Options
	log     *slog.Logger
	task    string
	keyword string
	cap     capture
	// shown are the lessons shown, by id; recurred those whose error came
	// back after they were shown.
	shown    map[string]*store.Lesson
	recurred map[string]bool
	notes    map[string]int // seen-before notes given, by lesson id
	// code is what the run executed (cells and commands), and files reads
	// its workspace's text files: where a lesson shown is looked for, to
	// tell one that mattered from one merely shown.
	code  strings.Builder
	files func() map[string]string
}

var _ agent.Lessons = (*Run)(nil)

// NewRun returns the lessons of one run.
func NewRun(o *Options) *Run {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.PromptTokens == 0 {
		opts.PromptTokens = 400
	}
	if opts.MaxRecall == 0 {
		opts.MaxRecall = 5
	}
	if opts.PruneAfter == 0 {
		opts.PruneAfter = 90 * 24 * time.Hour
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Run{opts: opts, log: log, shown: map[string]*store.Lesson{}, recurred: map[string]bool{}, notes: map[string]int{}}
}

// FileKey names an input file by name and content: "name#sha256-prefix".
func FileKey(name string, content []byte) string {
	h := sha256.Sum256(content)
	return name + "#" + hex.EncodeToString(h[:8])
}

// Demoted says whether a lesson is no longer recalled (see the package doc).
func Demoted(l *store.Lesson) bool { return l.Recurred >= 2 && l.Recurred > l.Helped }

// Recall implements agent.Lessons.
func (r *Run) Recall(ctx context.Context, task string, mode agent.Mode, files map[string][]byte) (string, []agent.LessonRef) {
	r.task = task
	r.keyword = strings.Join(taskWords(task), " ")
	r.cap.inputs = map[string]string{}
	var keys []string
	for name, b := range files {
		k := FileKey(name, b)
		r.cap.inputs[name] = k
		keys = append(keys, k)
	}
	sort.Strings(keys)
	picked, err := recall(ctx, r.opts.Store, r.opts.Owner, task, keys, r.opts.MaxRecall, r.opts.PromptTokens)
	if err != nil {
		r.log.Warn("recall lessons", "err", err)
		return "", nil
	}
	if len(picked) == 0 {
		return "", nil
	}
	var b strings.Builder
	b.WriteString("Lessons from earlier runs in this sandbox (follow them):")
	refs := make([]agent.LessonRef, 0, len(picked))
	for i := range picked {
		l := &picked[i]
		fmt.Fprintf(&b, "\n- %s", l.Text)
		r.shown[l.ID] = l
		refs = append(refs, ref(l))
	}
	return b.String(), refs
}

func ref(l *store.Lesson) agent.LessonRef {
	return agent.LessonRef{ID: l.ID, Scope: l.Scope, Text: l.Text}
}

// Executed implements agent.Lessons.
func (r *Run) Executed(ctx context.Context, x agent.Execution) (string, []agent.LessonRef) {
	sig, failed := SignatureOf(x.Tool, x.Result)
	r.cap.executed(x, sig, failed)
	if r.code.Len() < 1<<20 {
		r.code.WriteString(x.Code + "\n")
	}
	if x.Files != nil {
		r.files = x.Files
	}
	if !failed {
		return "", nil
	}
	for id, l := range r.shown {
		if matches(l, sig) {
			r.recurred[id] = true
		}
	}
	hits, err := r.opts.Store.ListLessons(ctx, store.LessonQuery{Owner: r.opts.Owner, Signature: sig.Text, Limit: 20})
	if err != nil {
		r.log.Warn("look up lessons", "err", err)
		return "", nil
	}
	var best *store.Lesson
	for i := range hits {
		l := &hits[i].Lesson
		if !matches(l, sig) || Demoted(l) || r.notes[l.ID] >= 2 {
			continue
		}
		if best == nil || l.Helped-l.Recurred > best.Helped-best.Recurred {
			best = l
		}
	}
	if best == nil {
		return "", nil
	}
	r.notes[best.ID]++
	if _, ok := r.shown[best.ID]; !ok {
		r.shown[best.ID] = best
	}
	delete(r.recurred, best.ID) // it counts from now: does the error come back after this note?
	return "seen before: " + best.Text, []agent.LessonRef{ref(best)}
}

// matches says whether a failure is the one lesson l was made for: same
// signature, and the same identifiers when l has any.
func matches(l *store.Lesson, s Sig) bool {
	if l.Signature == "" || l.Signature != s.Text {
		return false
	}
	if l.Detail == "" || s.Detail == "" {
		return true
	}
	return l.Detail == s.Detail
}

// Learn implements agent.Lessons.
func (r *Run) Learn(ctx context.Context, p llm.Provider, rep *agent.Report) ([]agent.LessonRef, llm.Usage) {
	r.countUse(ctx, rep)
	if _, err := r.opts.Store.PruneLessons(ctx, time.Now().Add(-r.opts.PruneAfter)); err != nil {
		r.log.Warn("prune lessons", "err", err)
	}
	// A known lesson that held is not learned again; one that did not
	// prevent its error is replaced by what this run learned.
	var cands []Candidate
	var replace []string
	for _, c := range r.cap.learned() {
		if old := r.existing(ctx, c); old != nil {
			if !r.recurred[old.ID] && !Demoted(old) {
				continue
			}
			replace = append(replace, old.ID)
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		return nil, llm.Usage{}
	}
	var texts map[int]string
	var usage llm.Usage
	source := "fallback"
	if p != nil {
		t, u, err := distil(ctx, p, r.task, cands)
		usage = u
		if err != nil {
			r.log.Warn("distil lessons; using the fallback", "err", err)
		} else {
			texts, source = t, "model"
		}
	}
	for _, id := range replace {
		if err := r.opts.Store.DeleteLesson(ctx, r.opts.Owner, id); err != nil {
			r.log.Warn("replace lesson", "err", err)
		}
	}
	var out []agent.LessonRef
	for i, c := range cands {
		text, ok := texts[i]
		if texts != nil && !ok {
			continue // the model found nothing reusable in it
		}
		src := source
		if text == "" {
			text, src = fallback(c), "fallback"
		}
		stored, err := r.opts.Store.PutLesson(ctx, store.Lesson{
			Owner: r.opts.Owner, Scope: c.Scope, Text: StripSecrets(text), Source: src,
			Signature: c.Sig.Text, Detail: c.Sig.Detail, Keywords: r.keyword,
			Files: strings.Join(c.Files, " "), Packages: strings.Join(c.Packages, " "),
			Fix: StripSecrets(c.Fix), RunID: r.opts.RunID, Step: c.Step,
		})
		if err != nil {
			r.log.Warn("store lesson", "err", err)
			continue
		}
		out = append(out, ref(stored))
	}
	return out, usage
}

// existing returns the stored lesson for a candidate's error, if any.
func (r *Run) existing(ctx context.Context, c Candidate) *store.Lesson {
	hits, err := r.opts.Store.ListLessons(ctx, store.LessonQuery{Owner: r.opts.Owner, Signature: c.Sig.Text, Limit: 20})
	if err != nil {
		return nil
	}
	for i := range hits {
		if l := &hits[i].Lesson; matches(l, c.Sig) && l.Scope == c.Scope && (c.Scope != "files" || l.Files == strings.Join(c.Files, " ")) {
			return l
		}
	}
	return nil
}

// countUse records what the run did with the lessons it was shown, and
// names in the report those that mattered (rep.LessonsUsed). A lesson
// helped only when its error would have come back and did not: it was
// given as "seen before" after the error and the error did not return, or
// the run did what it says (its fix is in the code the run ran or wrote,
// or the identifiers of its error are). Merely shown, it counts as shown.
func (r *Run) countUse(ctx context.Context, rep *agent.Report) {
	if len(r.shown) == 0 {
		return
	}
	var uses []store.LessonUse
	var words map[string]bool
	corpus := ""
	for id, l := range r.shown {
		u := store.LessonUse{ID: id, Shown: 1}
		if words == nil {
			corpus = r.corpus()
			words = tokens(corpus)
		}
		mattered := r.notes[id] > 0 || followed(l, corpus, words)
		switch {
		case r.recurred[id]:
			u.Recurred = 1
		case mattered && rep.Status == agent.StatusDone:
			u.Helped = 1
		}
		if mattered {
			rep.LessonsUsed = append(rep.LessonsUsed, ref(l))
		}
		uses = append(uses, u)
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].ID < uses[j].ID })
	sort.Slice(rep.LessonsUsed, func(i, j int) bool { return rep.LessonsUsed[i].ID < rep.LessonsUsed[j].ID })
	if err := r.opts.Store.CountLessonUse(ctx, r.opts.Owner, uses); err != nil {
		r.log.Warn("count lesson use", "err", err)
	}
}

// corpus is what the run did, to look lessons up in: its task, the code it
// executed and its workspace's text files at the end.
func (r *Run) corpus() string {
	var b strings.Builder
	b.WriteString(r.task + "\n" + r.code.String())
	if r.files != nil {
		names := []string{}
		files := r.files()
		for n := range files {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if b.Len() > 4<<20 {
				break
			}
			b.WriteString(files[n] + "\n")
		}
	}
	return b.String()
}

// followed says whether a run did what lesson l says: a line its fix
// added is in the corpus, or every identifier of its error is (the run
// used what the error was about, so it would have hit the error).
func followed(l *store.Lesson, corpus string, words map[string]bool) bool {
	flat := squash(corpus)
	for _, line := range strings.Split(l.Fix, "\n") {
		if added, ok := strings.CutPrefix(line, "+"); ok {
			if a := squash(added); len(a) >= 6 && strings.Contains(flat, a) {
				return true
			}
		}
	}
	detail := strings.Fields(l.Detail)
	if len(detail) == 0 {
		return false
	}
	for _, d := range detail {
		if !words[d] && (reToken.MatchString(d) && reToken.FindString(d) == d || !strings.Contains(corpus, d)) {
			return false // an identifier must be a whole token; a name such as sales.csv anywhere
		}
	}
	return true
}

// squash drops whitespace, so code matches however it is spaced.
func squash(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\n' || r == '\r' {
			return -1
		}
		return r
	}, s)
}
