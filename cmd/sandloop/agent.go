package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// agentFlags are the agent's options.
type agentFlags struct {
	files      []string
	mode       string
	model      string
	out        string
	force      bool
	jsonOut    bool
	confirm    bool
	verbose    bool
	maxSteps   int
	maxCost    float64
	maxTokens  int64
	timeout    time.Duration
	entry      string
	checks     []string
	dataDir    string
	database   string
	pricesFile string
	noLessons  bool
	previewFor time.Duration
	lf         limitFlags
	zygote     zygoteMode
	tmpl       templateChoice
}

func newAgentCmd() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   `agent ["TASK"] [-f FILE]... [--mode generate|debug|refactor|app] [--model PROVIDER/MODEL] [--out DIR]`,
		Short: "Let a model write, run and fix Python in a sandbox until the task is done",
		Long: `Give a task in plain words. The model writes Python, sandloop runs it in a sandbox,
shows the model what happened, and the model fixes and reruns until the work is done
and verified.

Modes (--mode):
  generate  (default) do the TASK: write and run code until it works
  debug     fix the crashing program given with -f: it is run first, and the run
            ends only when the fixed program runs without that failure (no TASK needed)
  refactor  improve the code given with -f without changing its behaviour: outputs,
            tests (-f test_*.py) and --check commands must stay the same (no TASK needed)
  app       build a small multi-file project with tests, requirements.txt and a README`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			task := ""
			if len(args) == 1 {
				task = args[0]
			}
			return runAgent(cmd, task, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.files, "file", "f", nil, "a file (or directory) to put into the workspace (repeatable)")
	fl.StringVar(&f.mode, "mode", "generate", "generate, debug, refactor or app")
	fl.StringVar(&f.model, "model", "", "PROVIDER/MODEL, e.g. openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, ollama/qwen2.5-coder (default: SANDLOOP_MODEL, then whatever is configured)")
	fl.StringVar(&f.out, "out", "", "write the final workspace files to DIR (never over existing files unless --force)")
	fl.BoolVar(&f.force, "force", false, "let --out overwrite files that exist in DIR")
	fl.BoolVar(&f.jsonOut, "json", false, "stream the run's events as NDJSON on stdout")
	fl.BoolVar(&f.confirm, "confirm", false, "ask before each execution")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log details, such as the zygote's start, to stderr")
	fl.IntVar(&f.maxSteps, "max-steps", 25, "step limit")
	fl.Float64Var(&f.maxCost, "max-cost", 0, "cost budget in US dollars (0 = none)")
	fl.Int64Var(&f.maxTokens, "max-tokens", 0, "token budget (0 = none)")
	fl.DurationVar(&f.timeout, "run-timeout", 30*time.Minute, "wall-clock limit of the whole run")
	fl.StringVar(&f.entry, "entry", "", "debug and refactor modes: the program to run (default: the only .py file given)")
	fl.StringArrayVar(&f.checks, "check", nil, "refactor mode: a command whose output must not change, e.g. 'python3 report.py data.csv' (repeatable)")
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "where run history is kept")
	fl.BoolVar(&f.noLessons, "no-lessons", false, "neither recall lessons of earlier runs nor learn new ones (see sandloop lessons)")
	fl.StringVar(&f.database, "database", "", databaseHelp)
	fl.StringVar(&f.pricesFile, "prices", "", "JSON file overriding the model price table")
	fl.DurationVar(&f.previewFor, "preview-for", runs.DefaultPreviewFor, "app mode: when the agent leaves a server running, keep the sandbox this long after the run and serve its preview URL (Enter or Ctrl-C ends it sooner; 0: never). Without a terminal only when given")
	f.lf.register(fl)
	registerZygote(fl, &f.zygote)
	f.tmpl.dataDir = &f.dataDir
	f.tmpl.register(fl)
	return cmd
}

// readInputFiles reads -f arguments: files by base name, directories with
// their relative paths.
func readInputFiles(args []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil {
			return nil, usagef("-f %s: %v", a, unwrapPathError(err))
		}
		if !fi.IsDir() {
			b, err := os.ReadFile(a)
			if err != nil {
				return nil, usagef("-f %s: %v", a, unwrapPathError(err))
			}
			out[filepath.Base(a)] = b
			continue
		}
		err = filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !d.Type().IsRegular() {
				return err
			}
			rel, _ := filepath.Rel(a, p)
			b, err := os.ReadFile(p)
			if err == nil {
				out[filepath.ToSlash(rel)] = b
			}
			return err
		})
		if err != nil {
			return nil, usagef("-f %s: %v", a, unwrapPathError(err))
		}
	}
	return out, nil
}

// openStore opens the run history: the PostgreSQL database or SQLite file
// database names (--database, else SANDLOOP_DATABASE_URL), else
// runs.db in dataDir.
func openStore(ctx context.Context, dataDir, database string) (store.History, error) {
	if database = cmp.Or(database, os.Getenv("SANDLOOP_DATABASE_URL")); database != "" {
		return store.OpenHistory(ctx, database, nil)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, usagef("--data-dir %s: %v", dataDir, unwrapPathError(err))
	}
	return store.Open(ctx, filepath.Join(dataDir, "runs.db"), nil)
}

// lessonStore returns the lessons of history h, or nil (with a note)
// when h keeps none.
func lessonStore(h store.History, errOut io.Writer, off bool) store.LessonStore {
	if ls, ok := h.(store.LessonStore); ok {
		return ls
	}
	if !off && errOut != nil {
		fmt.Fprintln(errOut, "sandloop: this run history keeps no lessons: running without")
	}
	return nil
}

// databaseHelp documents --database wherever it is offered.
const databaseHelp = "run history database: postgres://USER:PASSWORD@HOST/DB or a SQLite file (default: runs.db in --data-dir; also SANDLOOP_DATABASE_URL)"

func runAgent(cmd *cobra.Command, task string, f *agentFlags) error {
	mode, err := agent.ParseMode(f.mode)
	if err != nil {
		return usagef("--mode: %v", err)
	}
	if task == "" && agent.NeedsTask(mode) {
		return usagef(`give the task in quotes: sandloop agent "parse data.csv and plot the monthly totals"`)
	}
	if f.maxSteps <= 0 || f.maxCost < 0 || f.maxTokens < 0 {
		return usagef("--max-steps must be positive; --max-cost and --max-tokens must not be negative")
	}
	if f.confirm && !isTerminal(cmd.InOrStdin()) {
		return usagef("--confirm asks before each step and needs a terminal to ask on: stdin is not one")
	}
	limits, err := f.lf.limits()
	if err != nil {
		return err
	}
	pol, err := f.lf.egressPolicy()
	if err != nil {
		return err
	}
	if tmpl, err := f.tmpl.use(cmd.Context()); err != nil { // said before the model is asked anything
		return err
	} else if tmpl != nil {
		tmpl.Release()
		f.zygote = zygoteMode{"off"} // the template's session starts cold
	}
	f.lf.sayNotes(cmd.ErrOrStderr())
	files, err := readInputFiles(f.files)
	if err != nil {
		return err
	}
	if err := checkOutDir(f.out); err != nil {
		return err
	}
	if mode == agent.ModeDebug && len(files) == 0 {
		return usagef("debug mode needs the crashing program: -f program.py")
	}
	if mode == agent.ModeRefactor && len(files) == 0 {
		return usagef("refactor mode needs the code to improve: -f FILE (and its tests, or --check CMD)")
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := openStore(ctx, f.dataDir, f.database)
	if err != nil {
		return err
	}
	defer st.Close()
	env := map[string]string{}
	for _, kv := range f.lf.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if err := f.zygote.check(); err != nil {
		return err
	}
	// The model is resolved before anything starts, so a configuration error is
	// said at once rather than after the zygote's start.
	prov, err := llm.Resolve(ctx, llm.Config{Model: f.model, PricesFile: f.pricesFile})
	var nm *llm.NoModelError
	var ce *llm.ConfigError
	switch {
	case errors.As(err, &nm), errors.As(err, &ce):
		return usagef("%v", err)
	case err != nil:
		return err
	}
	// The zygote starts while the model thinks about its first step.
	zl, err := startZygoteLater(ctx, f.zygote, cliLogger(cmd.ErrOrStderr(), f.verbose))
	if err != nil {
		return err
	}
	defer zl.Close()
	// App runs' previews: kept after the run while this command waits, on
	// a terminal or when --preview-for says so (a script is not held up).
	previewFor := f.previewFor
	if !cmd.Flags().Changed("preview-for") && !(isTerminal(cmd.InOrStdin()) && isTerminal(cmd.OutOrStdout())) {
		previewFor = 0
	}
	var previews *previewServer
	var previewURL func(string, int, time.Time) string
	if mode == agent.ModeApp && previewFor > 0 {
		previews = newPreviewServer()
		defer previews.close()
		previewURL = previews.url
	}
	svc := runs.New(&runs.Options{
		PreviewURL: previewURL, PreviewFor: previewFor,
		Store:    st,
		Lessons:  lessonStore(st, cmd.ErrOrStderr(), f.noLessons),
		Provider: func(context.Context, string) (llm.Provider, error) { return prov, nil },
		NewSession: func(ctx context.Context) (runs.Session, error) {
			zy, err := zl.Get(ctx)
			if err != nil {
				return nil, err
			}
			tmpl, err := f.tmpl.use(ctx)
			if err != nil {
				return nil, err
			}
			s, err := session.New(ctx, &session.Options{Limits: limits, Env: env, Network: f.lf.networkMode(), Egress: pol, Zygote: zy, Template: tmpl})
			if err != nil && tmpl != nil {
				tmpl.Release()
			}
			if err == nil && previews != nil {
				previews.add(s.ID(), s)
			}
			return s, err
		},
	})
	defer svc.Close() // the sandbox a run keeps for its previews

	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	var view func(agent.Event)
	if f.jsonOut {
		enc := json.NewEncoder(out)
		var mu sync.Mutex
		view = func(e agent.Event) { mu.Lock(); enc.Encode(e); mu.Unlock() }
	} else {
		tv := newTerminalView(out, isTerminal(out))
		if isTerminal(errOut) {
			tv.showWaiting(errOut, true)
		}
		defer tv.close()
		view = tv.event
	}
	var confirm func(ctx context.Context, tool, code string) bool
	if f.confirm {
		in := bufio.NewReader(cmd.InOrStdin())
		confirm = func(ctx context.Context, tool, code string) bool {
			fmt.Fprintf(errOut, "run this %s? [y/N] ", tool)
			line, err := in.ReadString('\n')
			if err != nil && !strings.HasSuffix(line, "\n") {
				fmt.Fprintln(errOut) // Ctrl-D: end the prompt's line
			}
			return strings.HasPrefix(strings.ToLower(strings.TrimSpace(line)), "y")
		}
	}
	run, rep, err := svc.Run(ctx, runs.Request{
		Task: task, Mode: mode, Model: f.model, Files: files, Entry: f.entry, Checks: f.checks, Network: f.lf.network, Allow: pol.AllowEntries(),
		MaxSteps: f.maxSteps, MaxCost: f.maxCost, MaxTokens: f.maxTokens, Timeout: f.timeout,
		ExecTimeout: limits.Timeout, // --timeout bounds each execution, as for run, exec and repl
		NoLessons:   f.noLessons, Confirm: confirm, OnEvent: view,
	})
	var ae *agent.ArgumentError
	switch {
	case errors.As(err, &nm), errors.As(err, &ce), errors.As(err, &ae):
		return usagef("%v", err)
	case err != nil:
		return err
	}
	sayFigures(context.WithoutCancel(ctx), errOut, st, run.ID, f.dataDir)
	if f.out != "" {
		n, err := writeArtifacts(context.WithoutCancel(ctx), st, run.ID, f.out, f.force)
		var clash *clashError
		switch {
		case errors.As(err, &clash):
			return usagef("--out %s: the run's final files would overwrite %d existing file(s) (%s); nothing was written: rerun with --force to overwrite, or get them with sandloop runs export %s", f.out, len(clash.paths), clash.list(), run.ID)
		case err != nil:
			return fmt.Errorf("--out: %w", err)
		case n == 0:
			fmt.Fprintf(errOut, "sandloop: no final files changed: nothing written to %s\n", f.out)
		default:
			fmt.Fprintf(errOut, "sandloop: %d final file(s) written to %s\n", n, f.out)
		}
	}
	if f.out == "" {
		if files, err := st.ListArtifacts(context.WithoutCancel(ctx), run.ID); err == nil && len(files) == 0 {
			fmt.Fprintln(errOut, "sandloop: the run left no files")
		} else {
			fmt.Fprintf(errOut, "sandloop: the run's final files are kept in its history (%s): get them with sandloop runs export %s, or rerun with --out DIR\n", f.dataDir, run.ID)
		}
	}
	fmt.Fprintf(errOut, "sandloop: run %s %s (sandloop runs show %s)\n", run.ID, rep.Status, run.ID)
	if len(rep.Previews) > 0 && svc.PreviewsKept(run.ID) {
		fmt.Fprintln(errOut, previewNote(rep.Previews[0].ExpiresAt))
		waitPreviews(ctx, cmd.InOrStdin(), rep.Previews[0].ExpiresAt)
		svc.Cancel(run.ID) // closes the kept sandbox
	}
	switch rep.Status {
	case agent.StatusDone:
		return nil
	case agent.StatusCancelled:
		return &exitError{130}
	}
	return &exitError{1}
}

// checkOutDir checks --out before the run, so a run that costs money
// does not end in an error about where its files go: DIR is a directory,
// or one that can be made in an existing directory.
func checkOutDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return usagef("--out %s is not a directory", dir)
	case err == nil:
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return usagef("--out %s: %v", dir, unwrapPathError(err))
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if pi, err := os.Stat(parent); err != nil || !pi.IsDir() {
		return usagef("--out %s: %s is not a directory to make it in", dir, parent)
	}
	return nil
}

// clashError lists the files --out would overwrite.
type clashError struct{ paths []string }

func (e *clashError) Error() string { return "would overwrite " + e.list() }

func (e *clashError) list() string {
	list := strings.Join(e.paths[:min(len(e.paths), 5)], ", ")
	if len(e.paths) > 5 {
		list += fmt.Sprintf(" and %d more", len(e.paths)-5)
	}
	return list
}

// writeArtifacts writes a run's final files under dir and returns how many
// it wrote. Files already there with the same content (inputs the run did
// not change) are left alone; others there are overwritten only with
// force, else nothing is written and a *clashError lists them, as run
// --out does.
func writeArtifacts(ctx context.Context, st store.History, id, dir string, force bool) (int, error) {
	list, err := st.ListArtifacts(ctx, id)
	if err != nil {
		return 0, err
	}
	type file struct {
		path string
		data []byte
		mode os.FileMode
	}
	var todo []file
	var clash []string
	for _, a := range list {
		rel := filepath.FromSlash(a.Path)
		if !filepath.IsLocal(rel) {
			return 0, fmt.Errorf("artifact path %q leaves %s", a.Path, dir)
		}
		full, err := st.Artifact(ctx, id, a.Path)
		if err != nil {
			return 0, err
		}
		p := filepath.Join(dir, rel)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, full.Data) {
			continue
		} else if _, err := os.Lstat(p); err == nil && !force {
			clash = append(clash, a.Path)
		}
		mode := a.Mode.Perm()
		if mode == 0 {
			mode = 0o644
		}
		todo = append(todo, file{p, full.Data, mode})
	}
	if len(clash) > 0 {
		return 0, &clashError{clash}
	}
	for _, f := range todo {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return 0, err
		}
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return 0, err
		}
	}
	return len(todo), nil
}

// isTerminal reports whether w (an io.Writer or io.Reader) is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}
