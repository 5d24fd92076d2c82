package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/sandloop/sandloop/internal/lessons"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/spf13/cobra"
)

func newLessonsCmd() *cobra.Command {
	var dataDir, database string
	cmd := &cobra.Command{
		Use:   "lessons [ls|show ID|rm ID|add TEXT|export|import FILE]",
		Short: "What the agent learned from earlier runs (recalled in later ones)",
		Long: `Lessons are short rules the agent learned when a run hit an error and fixed it
("pandas here is 1.5.3: use pd.concat, not DataFrame.append"), or facts about the
sandbox it ran into. They are recalled at the start of later runs on similar tasks or
the same files, and shown again when the same error comes back. Runs with
--no-lessons neither recall nor learn them.`,
		Args: cobra.NoArgs,
	}
	at := func() where { return where{dataDir, database} }
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return listLessons(cmd, at(), "", 50) }
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "where run history is kept")
	cmd.PersistentFlags().StringVar(&database, "database", "", databaseHelp)
	var limit int
	var query string
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List lessons (the best matches of -q first)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return listLessons(cmd, at(), query, limit) },
	}
	ls.Flags().IntVarP(&limit, "limit", "n", 50, "how many lessons")
	ls.Flags().StringVarP(&query, "query", "q", "", "full-text search over text, error signatures, files and packages")
	show := &cobra.Command{
		Use: "show ID", Short: "Show a lesson with its evidence and counts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return showLesson(cmd, at(), args[0]) },
	}
	rm := &cobra.Command{
		Use: "rm ID...", Aliases: []string{"remove", "delete"}, Short: "Delete lessons", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return removeLessons(cmd, at(), args) },
	}
	var add store.Lesson
	var addFiles []string
	addCmd := &cobra.Command{
		Use: `add "TEXT"`, Short: "Teach a lesson by hand", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			add.Text, add.Files = args[0], strings.Join(addFiles, " ")
			return addLessons(cmd, at(), []store.Lesson{add}, "added")
		},
	}
	addCmd.Flags().StringVar(&add.Scope, "scope", "", "global (the sandbox, default), files (with --file) or task")
	addCmd.Flags().StringArrayVar(&addFiles, "file", nil, "an input file's name the lesson is about (repeatable)")
	addCmd.Flags().StringVar(&add.Signature, "error", "", `the error it prevents, e.g. "KeyError: 'date'" (then it is also shown when that error happens)`)
	addCmd.Flags().StringVar(&add.Keywords, "keywords", "", "words of the tasks it is for")
	var out string
	export := &cobra.Command{
		Use: "export", Short: "Write every lesson as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return exportLessons(cmd, at(), out) },
	}
	export.Flags().StringVarP(&out, "output", "o", "-", "where to write (- for stdout)")
	imp := &cobra.Command{
		Use: "import FILE", Short: "Add the lessons of an export (- for stdin); ids already present are updated", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return usagef("%s: %v", args[0], unwrapPathError(err))
				}
				defer f.Close()
				r = f
			}
			list, err := lessons.ReadExport(r)
			if err != nil {
				return usagef("%s: %v", args[0], err)
			}
			return addLessons(cmd, at(), list, "imported")
		},
	}
	cmd.AddCommand(ls, show, rm, addCmd, export, imp)
	return cmd
}

// where names the history: --data-dir and --database.
type where struct{ dataDir, database string }

// lessonHistory is a run history that keeps lessons.
type lessonHistory interface {
	store.History
	store.LessonStore
}

// openLessons opens the history holding the lessons; create says a new
// SQLite history may be made (to add lessons before any run).
func openLessons(cmd *cobra.Command, at where, create bool) (lessonHistory, error) {
	var h store.History
	var err error
	if create {
		h, err = openStore(cmd.Context(), at.dataDir, at.database)
	} else {
		h, err = openHistory(cmd, at.dataDir, at.database)
	}
	if err != nil {
		return nil, err
	}
	lh, ok := h.(lessonHistory)
	if !ok {
		h.Close()
		return nil, usagef("this run history keeps no lessons")
	}
	return lh, nil
}

// The CLI's lessons are the owner "" (like its runs): those of a server
// without tokens, never those of a token.
const cliOwner = ""

func listLessons(cmd *cobra.Command, at where, query string, limit int) error {
	st, err := openLessons(cmd, at, false)
	if err != nil {
		return err
	}
	defer st.Close()
	list, err := st.ListLessons(cmd.Context(), store.LessonQuery{Owner: cliOwner, Match: query, Limit: limit})
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintln(cmd.ErrOrStderr(), "sandloop: no lessons yet (runs learn them when they fix an error)")
		return nil
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSCOPE\tSHOWN\tHELPED\tRECURRED\tTEXT")
	for _, h := range list {
		text := strings.ReplaceAll(h.Text, "\n", " ")
		if len(text) > 90 {
			text = text[:87] + "..."
		}
		if lessons.Demoted(&h.Lesson) {
			text = "(demoted) " + text
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", h.ID, h.Scope, h.Shown, h.Helped, h.Recurred, text)
	}
	return tw.Flush()
}

// findLesson resolves an id or a unique prefix of one.
func findLesson(cmd *cobra.Command, st lessonHistory, prefix string) (*store.Lesson, error) {
	if l, err := st.GetLesson(cmd.Context(), cliOwner, prefix); err == nil {
		return l, nil
	}
	all, err := st.ListLessons(cmd.Context(), store.LessonQuery{Owner: cliOwner, Limit: 1 << 20})
	if err != nil {
		return nil, err
	}
	var found []store.Lesson
	for _, h := range all {
		if prefix != "" && strings.HasPrefix(h.ID, prefix) {
			found = append(found, h.Lesson)
		}
	}
	switch len(found) {
	case 0:
		return nil, usagef("no lesson %q (see sandloop lessons ls)", prefix)
	case 1:
		return &found[0], nil
	}
	return nil, usagef("%q matches %d lessons: give more of the id", prefix, len(found))
}

func showLesson(cmd *cobra.Command, at where, prefix string) error {
	st, err := openLessons(cmd, at, false)
	if err != nil {
		return err
	}
	defer st.Close()
	l, err := findLesson(cmd, st, prefix)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "lesson %s · %s · from %s\n%s\n\n", l.ID, l.Scope, l.Source, l.Text)
	for _, kv := range [][2]string{{"error", l.Signature}, {"names", l.Detail}, {"files", l.Files}, {"packages", l.Packages}, {"task words", l.Keywords}} {
		if kv[1] != "" {
			fmt.Fprintf(w, "%-11s %s\n", kv[0]+":", kv[1])
		}
	}
	if l.RunID != "" {
		fmt.Fprintf(w, "%-11s run %s, step %d\n", "learned in:", l.RunID, l.Step)
	}
	used := "never"
	if !l.LastUsedAt.IsZero() {
		used = l.LastUsedAt.Local().Format("2006-01-02 15:04")
	}
	fmt.Fprintf(w, "%-11s shown %d, helped %d, recurred %d; last used %s; created %s\n", "counts:", l.Shown, l.Helped, l.Recurred, used, l.CreatedAt.Local().Format("2006-01-02 15:04"))
	if lessons.Demoted(l) {
		fmt.Fprintln(w, "demoted: its error recurred more often than it helped, so it is no longer recalled")
	}
	if l.Fix != "" {
		fmt.Fprintf(w, "\nfix:\n%s\n", l.Fix)
	}
	return nil
}

func removeLessons(cmd *cobra.Command, at where, ids []string) error {
	st, err := openLessons(cmd, at, false)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, p := range ids {
		l, err := findLesson(cmd, st, p)
		if err != nil {
			return err
		}
		if err := st.DeleteLesson(cmd.Context(), cliOwner, l.ID); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "sandloop: lesson %s deleted\n", l.ID)
	}
	return nil
}

func addLessons(cmd *cobra.Command, at where, list []store.Lesson, verb string) error {
	st, err := openLessons(cmd, at, true)
	if err != nil {
		return err
	}
	defer st.Close()
	for i := range list {
		l := list[i]
		if err := lessons.Check(&l); err != nil {
			var ie *lessons.ArgumentError
			if errors.As(err, &ie) {
				return usagef("%v", err)
			}
			return err
		}
		l.Owner = cliOwner
		stored, err := st.PutLesson(cmd.Context(), l)
		if err != nil {
			return err
		}
		if len(list) == 1 {
			fmt.Fprintln(cmd.OutOrStdout(), stored.ID)
		}
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "sandloop: %d lesson(s) %s\n", len(list), verb)
	return nil
}

func exportLessons(cmd *cobra.Command, at where, out string) error {
	st, err := openLessons(cmd, at, false)
	if err != nil {
		return err
	}
	defer st.Close()
	hits, err := st.ListLessons(cmd.Context(), store.LessonQuery{Owner: cliOwner, Limit: 1 << 20})
	if err != nil {
		return err
	}
	e := lessons.Export{Lessons: make([]store.Lesson, 0, len(hits))}
	for _, h := range hits {
		e.Lessons = append(e.Lessons, h.Lesson)
	}
	var w io.Writer = cmd.OutOrStdout()
	if out != "-" {
		f, err := os.Create(out)
		if err != nil {
			return usagef("--output %s: %v", out, unwrapPathError(err))
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(e); err != nil {
		return err
	}
	if out != "-" {
		fmt.Fprintf(cmd.ErrOrStderr(), "sandloop: %d lesson(s) exported to %s\n", len(e.Lessons), out)
	}
	return nil
}
