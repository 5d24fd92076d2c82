package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/workspace"
	"github.com/spf13/cobra"
)

func newReplCmd() *cobra.Command {
	var lf limitFlags
	var images, history string
	var keep replKeep
	var tc templateChoice
	cmd := &cobra.Command{
		Use:   "repl",
		Short: "Interactive Python session in a sandbox",
		Long: `An interactive Python session in a sandbox, like python3's own prompt:
state persists between inputs, the last value is printed, images are saved to
files whose paths are printed, lines starting with ! run shell commands, and
Ctrl-C interrupts the running code without losing state. Ctrl-D, exit(),
quit() or sys.exit(N) quit (N is the exit status). On a terminal, lines are
edited with the arrow keys, Ctrl-R searches the history, which is kept in
--history.
--timeout limits each input's run time.

--with copies files or directories in (at the same relative path, as for
run). On exit the workspace is deleted, which is said with what it held;
--out DIR copies it to DIR first (never over existing files unless --force:
where they clash, it goes to a new directory beside DIR instead, so that
nothing is lost).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			limits, err := lf.limits()
			if err != nil {
				return err
			}
			pol, err := lf.egressPolicy()
			if err != nil {
				return err
			}
			tmpl, err := tc.use(c.Context())
			if err != nil {
				return err
			}
			lf.sayNotes(c.ErrOrStderr())
			if keep.out != "" {
				if fi, err := os.Stat(keep.out); err == nil && !fi.IsDir() {
					return usagef("--out %s is not a directory", keep.out)
				}
			}
			for _, p := range keep.with {
				if _, err := os.Stat(p); err != nil {
					return usagef("--with %s: %v", p, unwrapPathError(err))
				}
			}
			env := map[string]string{}
			for _, kv := range lf.env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
			execTimeout := lf.timeout
			if execTimeout == 0 {
				execTimeout = -1 // Ctrl-C is the limit
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt)
			defer signal.Stop(sigs)
			return runRepl(c.Context(), replConfig{
				In: c.InOrStdin(), Out: c.OutOrStdout(), Err: c.ErrOrStderr(),
				Interrupts: sigs,
				Images:     images,
				History:    history,
				Keep:       keep,
				Options: session.Options{
					Limits: limits, Network: lf.networkMode(), Egress: pol, Env: env, ExecTimeout: execTimeout, Template: tmpl,
				},
			})
		},
	}
	lf.register(cmd.Flags())
	tc.register(cmd.Flags())
	cmd.Flags().StringVar(&history, "history", filepath.Join(defaultDataDir(), "repl_history"), "file keeping the input history on a terminal (empty: none)")
	cmd.Flags().StringVar(&images, "images", "", "directory for images the code shows (default: a new temporary directory)")
	cmd.Flags().StringArrayVar(&keep.with, "with", nil, "copy a file or directory into the workspace at the start, at the same relative path (repeatable)")
	cmd.Flags().StringVar(&keep.out, "out", "", "copy the workspace to DIR on exit (never over existing files unless --force; without caches unless --keep-caches)")
	cmd.Flags().BoolVar(&keep.force, "force", false, "let --out overwrite files that exist in DIR")
	cmd.Flags().BoolVar(&keep.keepCaches, "keep-caches", false, "let --out copy caches too (.cache, .config, __pycache__, ...)")
	return cmd
}

// replKeep is what goes into a REPL's workspace and what is kept of it.
type replKeep struct {
	with              []string
	out               string
	force, keepCaches bool
}

// replConfig is what runRepl needs; tests drive it through pipes.
type replConfig struct {
	In         io.Reader
	Out, Err   io.Writer
	Interrupts <-chan os.Signal // Ctrl-C
	Images     string           // if empty, a temporary directory made on first use
	History    string           // the history file on a terminal; if empty, none is kept
	Keep       replKeep
	Options    session.Options
}

// repl is one interactive session.
type repl struct {
	replConfig
	s      *session.Session
	images imageSaver
}

func runRepl(ctx context.Context, cfg replConfig) error {
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := session.New(ctx, &cfg.Options)
	if err != nil {
		return err
	}
	defer s.Close()
	r := &repl{replConfig: cfg, s: s, images: imageSaver{Dir: cfg.Images, Prefix: "sandloop-repl-"}}
	for _, p := range cfg.Keep.with {
		if err := r.copyIn(p); err != nil {
			return usagef("--with %s: %v", p, unwrapPathError(err))
		}
	}
	defer r.leave() // before Close deletes the workspace
	where := "workspace " + s.Workspace()
	if strings.HasPrefix(s.Workspace(), "/proc/self/") {
		// Made in a user namespace: its path is valid in this process only.
		where = "a workspace held by this process"
	}
	fmt.Fprintf(r.Err, "sandloop: Python in a sandbox; %s (mounted at /workspace). Ctrl-D quits.\n", where)

	var src lineSource
	if f, ok := r.In.(*os.File); ok && isTerminal(f) && isTerminal(r.Out) {
		t := newTermLines(cfg.History)
		defer t.close()
		src = t
	} else {
		src = newPipeLines(ctx, r.In, r.Out, r.Interrupts)
	}

	var cell strings.Builder
	for {
		prompt := ">>> "
		if cell.Len() > 0 {
			prompt = "... "
		}
		line, err := src.line(ctx, prompt)
		switch {
		case errors.Is(err, errInterrupted):
			fmt.Fprintln(r.Out, "\nKeyboardInterrupt")
			cell.Reset()
			continue
		case err != nil: // end of input, or the context ended
			fmt.Fprintln(r.Out)
			if cell.Len() > 0 && ctx.Err() == nil {
				if code, quit := r.execute(ctx, cell.String()); quit {
					return exitWith(code)
				}
			}
			return nil
		}
		if cell.Len() == 0 && strings.TrimSpace(line) == "" {
			continue
		}
		cell.WriteString(line)
		cell.WriteByte('\n')
		status, err := s.CheckComplete(ctx, cell.String())
		if err != nil {
			status = "complete" // let the execution report what is wrong
		}
		if status == "incomplete" {
			continue
		}
		src.remember(strings.TrimRight(cell.String(), "\n"))
		code, quit := r.execute(ctx, cell.String())
		if quit {
			return exitWith(code)
		}
		cell.Reset()
	}
}

// copyIn copies the file or directory p into the workspace at the same
// relative path (as run --with does), owned by the sandbox user.
func (r *repl) copyIn(p string) error {
	w, err := r.s.Files(workspace.Options{})
	if err != nil {
		return err
	}
	defer w.Close()
	rel := filepath.Clean(p)
	if !filepath.IsLocal(rel) {
		rel = filepath.Base(rel)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return writeInto(w, p, filepath.ToSlash(rel))
	}
	return walkFiles(p, func(fs.DirEntry) bool { return false }, func(sub string, _ fs.FileInfo) {
		if err == nil {
			err = writeInto(w, filepath.Join(p, sub), filepath.ToSlash(filepath.Join(rel, sub)))
		}
	})
}

func writeInto(w *workspace.Workspace, src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = w.Write(dst, f)
	return err
}

// leave says what becomes of the workspace as the REPL ends: copied to
// --out (or beside it, where files would be overwritten), or deleted, with
// what it held.
func (r *repl) leave() {
	ws := r.s.Workspace()
	var files []string
	var size int64
	_ = walkFiles(ws, cacheSkip(r.Keep.keepCaches), func(rel string, fi fs.FileInfo) {
		files = append(files, rel)
		size += fi.Size()
	})
	if len(files) == 0 {
		fmt.Fprintln(r.Err, "sandloop: the workspace held no files; it is deleted")
		return
	}
	held := fmt.Sprintf("%d file(s), %s: %s", len(files), formatSize(size), strings.Join(files[:min(len(files), 5)], ", "))
	if len(files) > 5 {
		held += fmt.Sprintf(" and %d more", len(files)-5)
	}
	out := r.Keep.out
	if out == "" {
		fmt.Fprintf(r.Err, "sandloop: deleting the workspace (%s); keep it next time with --out DIR\n", held)
		return
	}
	clash, err := copyWorkspace(ws, out, r.Keep.force, r.Keep.keepCaches)
	if len(clash) > 0 {
		// Never lose the session's files to a name clash: keep them beside DIR.
		beside, merr := os.MkdirTemp(filepath.Dir(filepath.Clean(out)), filepath.Base(filepath.Clean(out))+".repl-")
		if merr != nil {
			fmt.Fprintf(r.Err, "sandloop: --out %s would overwrite %s, and no directory could be made beside it (%v): the workspace is lost\n", out, clashList(clash), merr)
			return
		}
		if _, err = copyWorkspace(ws, beside, true, r.Keep.keepCaches); err == nil {
			fmt.Fprintf(r.Err, "sandloop: --out %s would overwrite %s: the workspace (%s) was copied to %s instead (--force overwrites)\n", out, clashList(clash), held, beside)
			return
		}
	}
	if err != nil {
		fmt.Fprintf(r.Err, "sandloop: %v\n", err)
		return
	}
	fmt.Fprintf(r.Err, "sandloop: copied the workspace (%s) to %s\n", held, out)
}

// exitWith is the command's result for a REPL left with exit status code.
func exitWith(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code}
}

// quitCall matches a cell that only leaves: exit(), quit(), sys.exit(N),
// raise SystemExit(N), and bare exit or quit as IPython takes them.
var quitCall = regexp.MustCompile(`^\s*(?:(?:exit|quit)(?:\(\s*\))?|(?:sys\.exit|exit|quit|raise\s+SystemExit)\(\s*(-?\d+)?\s*\)|raise\s+SystemExit)\s*;?\s*$`)

// exitStatus reads a SystemExit's value as Python does: none or a number
// is the status, anything else is printed and means 1.
func exitStatus(value string) (int, string) {
	switch v := strings.TrimSpace(value); v {
	case "", "None":
		return 0, ""
	default:
		if n, err := strconv.Atoi(v); err == nil {
			return n & 0xff, ""
		}
		return 1, v
	}
}

// execute runs one cell, printing its events as they come; Ctrl-C
// interrupts it. quit reports that the cell left the REPL (exit(),
// quit(), sys.exit(n)), with status as its exit status.
func (r *repl) execute(ctx context.Context, code string) (status int, quit bool) {
	if m := quitCall.FindStringSubmatch(code); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n & 0xff, true
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-r.Interrupts:
				r.s.Interrupt()
			case <-done:
				return
			}
		}
	}()
	res, err := r.s.Execute(ctx, kernel.Request{Code: code}, r.show)
	if errors.Is(err, session.ErrRestartRequired) {
		err = r.restart(ctx)
		if err == nil {
			res, err = r.s.Execute(ctx, kernel.Request{Code: code}, r.show)
		}
	}
	if err != nil {
		fmt.Fprintln(r.Err, "sandloop:", err)
		return 0, false
	}
	if res.Error != nil && res.Error.Name == "SystemExit" {
		n, msg := exitStatus(res.Error.Value)
		if msg != "" {
			fmt.Fprintln(r.Err, msg)
		}
		return n, true
	}
	if res.Status == kernel.StatusKilled {
		if err := r.restart(ctx); err != nil {
			fmt.Fprintln(r.Err, "sandloop:", err)
		}
	}
	return 0, false
}

func (r *repl) restart(ctx context.Context) error {
	fmt.Fprintln(r.Err, "sandloop: restarting the kernel: Python state is lost, the workspace is kept")
	return r.s.Restart(ctx)
}

// show prints one event.
func (r *repl) show(e kernel.Event) {
	switch e.Type {
	case kernel.EventStdout:
		io.WriteString(r.Out, e.Text)
	case kernel.EventStderr:
		io.WriteString(r.Err, e.Text)
	case kernel.EventResult:
		r.showResult(e.Data)
	case kernel.EventError:
		if e.Name == "SystemExit" {
			return // the REPL leaves, as python3's does, without a traceback
		}
		tb := e.Traceback
		if tb == "" {
			tb = e.Name + ": " + e.Value + "\n"
		}
		io.WriteString(r.Err, tb)
	case kernel.EventEnd:
		switch e.Status {
		case kernel.StatusTimeout:
			fmt.Fprintln(r.Err, "[timed out; state kept]")
		case kernel.StatusInterrupted:
			fmt.Fprintln(r.Err, "[interrupted; state kept]")
		case kernel.StatusKilled:
			fmt.Fprintln(r.Err, "[the kernel was killed]")
		}
	}
}

func (r *repl) showResult(data map[string]string) { showData(r.Out, r.Err, data, &r.images) }
