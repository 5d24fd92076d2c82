package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/spf13/cobra"
)

// scriptRun is one program run in a fresh sandbox by `run` or `exec`.
type scriptRun struct {
	lf         limitFlags
	with       []string
	out        string
	force      bool
	keepCaches bool
	stats      bool
	maxOutput  int64
	tmpl       templateChoice
	// stdin, if set, is forwarded to the program's standard input.
	stdin io.Reader
}

func (s *scriptRun) register(cmd *cobra.Command) {
	s.lf.register(cmd.Flags())
	s.tmpl.register(cmd.Flags())
	cmd.Flags().StringVar(&s.out, "out", "", "copy the workspace to DIR after the run (never over existing files unless --force; without caches unless --keep-caches)")
	cmd.Flags().BoolVar(&s.force, "force", false, "let --out overwrite files that exist in DIR")
	cmd.Flags().BoolVar(&s.keepCaches, "keep-caches", false, "let --out copy caches too (.cache, .config, __pycache__, ...)")
	cmd.Flags().BoolVar(&s.stats, "stats", false, "print duration, CPU time and peak memory to stderr")
	s.maxOutput = 16 << 20
	cmd.Flags().Var(sizeValue{n: &s.maxOutput}, "max-output", "pass on at most this much stdout and stderr together, then only their last 64K each, with a note of what was dropped")
}

func newRunCmd() *cobra.Command {
	var s scriptRun
	cmd := &cobra.Command{
		Use:   "run FILE [ARGS...]",
		Short: "Run a Python script in a fresh sandbox; the exit code mirrors the script's",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("give the script: sandloop run FILE [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			file := args[0]
			data, err := os.ReadFile(file)
			if err != nil {
				return usagef("cannot read %s: %v", file, unwrapPathError(err))
			}
			name := filepath.Base(file)
			argv := append([]string{"python3", name}, args[1:]...)
			s.stdin = cmd.InOrStdin()
			return s.run(cmd, argv, func(ws string) error {
				// Like python3 FILE, the script imports its sibling
				// modules: the script's directory's Python files and
				// packages are copied (not its other files: data goes in
				// with --with).
				if note := copyModules(filepath.Dir(file), ws); note != "" {
					fmt.Fprintln(cmd.ErrOrStderr(), "sandloop: note: "+note)
				}
				for _, p := range s.with {
					if err := copyInto(p, ws); err != nil {
						return usagef("--with %s: %v", p, unwrapPathError(err))
					}
				}
				return os.WriteFile(filepath.Join(ws, name), data, 0o644)
			})
		},
	}
	cmd.Flags().SetInterspersed(false) // flags after FILE belong to the script
	s.register(cmd)
	cmd.Flags().StringArrayVar(&s.with, "with", nil, "copy a file or directory into the workspace too, at the same relative path (data/sales.csv stays data/sales.csv; repeatable)")
	return cmd
}

func newExecCmd() *cobra.Command {
	var s scriptRun
	var code string
	cmd := &cobra.Command{
		Use:   "exec [-c CODE]",
		Short: "Run Python code given inline or on stdin in a fresh sandbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("code") {
				s.stdin = cmd.InOrStdin()
			}
			code, err := codeOrStdin(cmd, code)
			if err != nil {
				return err
			}
			return s.run(cmd, []string{"python3", "-c", code}, nil)
		},
	}
	cmd.Flags().StringVarP(&code, "code", "c", "", "the code to run (default: read stdin)")
	s.register(cmd)
	return cmd
}

// codeOrStdin is code if the command's --code flag was given, else all of
// its stdin.
func codeOrStdin(cmd *cobra.Command, code string) (string, error) {
	if cmd.Flags().Changed("code") {
		return code, nil
	}
	b, err := io.ReadAll(cmd.InOrStdin())
	if err != nil {
		return "", fmt.Errorf("read code from stdin: %w", err)
	}
	return string(b), nil
}

// run prepares a workspace, runs argv in a jail streaming its output, and
// turns the outcome into the command's exit code.
func (s *scriptRun) run(cmd *cobra.Command, argv []string, prepare func(ws string) error) error {
	limits, err := s.lf.limits()
	if err != nil {
		return err
	}
	pol, err := s.lf.egressPolicy()
	if err != nil {
		return err
	}
	tmpl, err := s.tmpl.use(cmd.Context())
	if err != nil {
		return err
	}
	python, mounts := jail.DefaultPython, []jail.Mount(nil)
	if tmpl != nil {
		defer tmpl.Release()
		python, mounts = tmpl.Python, tmpl.Mounts
	}
	s.lf.sayNotes(cmd.ErrOrStderr())
	if s.out != "" {
		if fi, err := os.Stat(s.out); err == nil && !fi.IsDir() {
			return usagef("--out %s is not a directory", s.out)
		}
	}
	quota, err := jail.NewQuotaDir(limits.Disk, limits.Files)
	if err != nil {
		return err
	}
	defer quota.Remove()
	ws := quota.Path
	if tmpl != nil && tmpl.Seed != nil {
		// A template from a snapshot: its files; its variables need a
		// kernel (repl, mcp, agent, serve's sessions).
		if _, err := session.CopyTemplateFiles(cmd.Context(), ws, tmpl); err != nil {
			return err
		}
		if len(tmpl.Seed.Variables) > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: template %s's variables (%s) are loaded in sessions with a kernel (repl, serve); a script gets its files only\n", tmpl.Name, strings.Join(tmpl.Seed.Variables, ", "))
		}
	}
	if prepare != nil {
		if err := prepare(ws); err != nil {
			return err
		}
	}
	var inputs map[string]fileStamp // what the workspace held before the run (without --out)
	if s.out == "" {
		if inputs, err = stampFiles(ws); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := []string{"PYTHONUNBUFFERED=1"}
	if tmpl != nil {
		env = append(env, tmpl.Env...)
	}
	env = append(env, s.lf.env...)
	if s.maxOutput < 1<<10 {
		return usagef("--max-output must be at least 1K")
	}
	output := newOutputLimit(s.maxOutput, cmd.OutOrStdout(), cmd.ErrOrStderr())
	var stdin *os.File
	if s.stdin != nil {
		// Through a pipe of our own, which the jail takes as it is: the
		// run ends when the program does, not when our stdin (a terminal
		// nobody types into) next has data.
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		defer pr.Close()
		go func() {
			_, _ = io.Copy(pw, s.stdin)
			pw.Close()
		}()
		stdin = pr
	}
	res, netLog, err := runJail(ctx, &jail.Config{
		Stdin:     readerOrNil(stdin),
		Path:      python,
		Args:      argv,
		Mounts:    mounts,
		Env:       env,
		Workspace: ws,
		Limits:    limits,
		Network:   s.lf.networkMode(),
		Stdout:    output.Stdout(),
		Stderr:    output.Stderr(),
	}, pol)
	output.Finish()
	var ae *jail.ArgumentError
	if errors.As(err, &ae) {
		return usagef("%v", err)
	}
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "sandloop: warning: "+w)
	}
	if s.out != "" {
		if err := s.copyOut(ws, stderr); err != nil {
			return err
		}
	} else if made := madeFiles(ws, inputs); len(made) > 0 {
		// They go with the sandbox: say so, rather than lose them unsaid.
		fmt.Fprintf(stderr, "sandloop: note: the program wrote %s, discarded with its sandbox; to keep them, run again with --out DIR\n", fileList(made))
	}
	if s.stats {
		printNetworkLog(stderr, netLog)
		fmt.Fprintf(stderr, "sandloop: duration %s, cpu %s, peak memory %.1f MiB (%s)\n",
			res.Duration.Round(time.Millisecond), res.CPUTime.Round(time.Millisecond), float64(res.MemoryPeak)/(1<<20), res.Enforcement)
	}
	code := res.ExitCode
	switch {
	case ctx.Err() != nil && !res.TimedOut:
		fmt.Fprintln(stderr, "sandloop: interrupted")
		code = 130
	case res.TimedOut:
		fmt.Fprintf(stderr, "sandloop: timed out after %s; every process of the sandbox was killed\n", limits.Timeout)
		code = 124
	case res.OOMKilled:
		fmt.Fprintf(stderr, "sandloop: out of memory: the sandbox's memory limit (%s) was reached and the kernel killed the program\n", formatSize(limits.WithDefaults().Memory))
	}
	if code != 0 {
		return &exitError{code}
	}
	return nil
}

func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dM", n>>20)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// copyTree copies regular files and directories from src into dst
// (created if missing). Symlinks are copied as links, never followed, so a
// workspace cannot point the copy at host files.
func copyTree(src, dst string) error { return copyTreeSkip(src, dst, nil) }

// copyTreeSkip is copyTree leaving out the entries skip names (and what is
// under them).
func copyTreeSkip(src, dst string, skip func(fs.DirEntry) bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if skip != nil && path != src && skip(d) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			_ = os.Remove(target)
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(path, target)
		}
		return nil // devices, sockets and fifos are skipped
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm()|0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
