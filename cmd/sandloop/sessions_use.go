package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/spf13/cobra"
)

// The verbs that make, use and end a server's sessions from the shell:
// new, exec and rm. With them a session, and the sessions a fork makes,
// can be driven from a terminal or a script without an HTTP client.

func sessionUseCmds(f *sessionsFlags) []*cobra.Command {
	var opts client.CreateOptions
	var memory int64
	var timeout time.Duration
	var env []string
	newCmd := &cobra.Command{
		Use:   "new",
		Short: "Create a session and print its id",
		Long: `Create a session on the server and print its id on stdout (ID=$(sandloop sessions new)).
Limits not given take the server's defaults; values above its maxima are refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch opts.Checkpoints {
			case "", "auto", "off":
			default:
				return usagef("--checkpoints is auto or off, not %q", opts.Checkpoints)
			}
			if memory != 0 {
				if memory < 16<<20 {
					return usagef("--memory must be at least 16M")
				}
				opts.MemoryMB = memory >> 20
			}
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			opts.TimeoutS = timeout.Seconds()
			if len(env) > 0 {
				opts.Env = map[string]string{}
				for _, kv := range env {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return usagef("--env takes K=V, not %q", kv)
					}
					opts.Env[k] = v
				}
			}
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				s, err := c.CreateSession(ctx, &opts)
				if err == nil && !f.json {
					fmt.Fprintln(cmd.OutOrStdout(), s.ID)
				}
				return s, err
			})
		},
	}
	fl := newCmd.Flags()
	fl.StringVar(&opts.Checkpoints, "checkpoints", "", "auto: a checkpoint before every execution, so `sessions undo` reverts the last one; off: none unless asked (default: the server's)")
	fl.Var(sizeValue{n: &memory}, "memory", "memory limit, e.g. 1G (default: the server's)")
	fl.Float64Var(&opts.CPUs, "cpus", 0, "CPU quota in cores, e.g. 0.5 (default: the server's)")
	fl.IntVar(&opts.Pids, "pids", 0, "maximum processes and threads (default: the server's)")
	fl.DurationVar(&timeout, "timeout", 0, "the default timeout of its executions, e.g. 2m (default: the server's)")
	fl.StringArrayVar(&env, "env", nil, "environment variable K=V of its kernel (repeatable)")

	var code, imagesDir string
	var execTimeout time.Duration
	execCmd := &cobra.Command{
		Use:   "exec ID [-c CODE]",
		Short: "Run Python code (inline or on stdin) in a session, keeping its state",
		Long: `Run Python code in a session of the server, as the next cell of its notebook: variables and
imports stay for the next exec. Output streams as it comes (stdout to stdout, stderr and a
traceback to stderr); the value of a last expression is printed as the REPL would, an image
the code shows is written to a file (--images DIR) and named. Exit code:
0, 1 if the code raised, 124 if it timed out, 130 if interrupted (Ctrl-C interrupts it; the
session keeps its state), 137 if the kernel died (sandloop sessions restart ID starts a new one).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := codeOrStdin(cmd, code)
			if err != nil {
				return err
			}
			if execTimeout < 0 {
				return usagef("--timeout must not be negative")
			}
			var eo *client.ExecuteOptions
			if execTimeout > 0 {
				eo = &client.ExecuteOptions{TimeoutS: execTimeout.Seconds()}
			}
			var res *client.Result
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cmd.SetContext(ctx)
			err = withClientFor(cmd, f, 0, func(ctx context.Context, c *client.Client) (any, error) {
				var err error
				if f.json {
					res, err = c.Execute(ctx, args[0], src, eo)
				} else {
					images := &imageSaver{Dir: imagesDir, Prefix: "sandloop-exec-"}
					res, err = c.ExecuteStream(ctx, args[0], src, eo, func(e client.Event) {
						showEvent(cmd.OutOrStdout(), cmd.ErrOrStderr(), e, images)
					})
				}
				return res, err
			})
			if err != nil {
				if ctx.Err() != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "[interrupted; the session keeps its state]")
					return &exitError{130}
				}
				return err
			}
			if status := execExitCode(res.Status); status != 0 {
				return &exitError{status}
			}
			return nil
		},
	}
	execCmd.Flags().StringVarP(&code, "code", "c", "", "the code to run (default: read stdin)")
	execCmd.Flags().DurationVar(&execTimeout, "timeout", 0, "interrupt the code after this long, e.g. 30s (default: the session's)")
	execCmd.Flags().StringVar(&imagesDir, "images", "", "directory for images the code shows, named on stdout (default: a new temporary directory)")

	rmCmd := &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"remove", "delete"},
		Short:   "Close sessions: their processes end and their files are deleted",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				var done []string
				for _, id := range args {
					if err := c.DeleteSession(ctx, id); err != nil {
						return map[string]any{"deleted": done}, err
					}
					done = append(done, id)
					if !f.json {
						fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", id)
					}
				}
				return map[string]any{"deleted": done}, nil
			})
		},
	}
	return []*cobra.Command{newCmd, execCmd, rmCmd}
}

// execExitCode is the exit code of `sessions exec` for an execution's
// status.
func execExitCode(s client.Status) int {
	switch s {
	case client.StatusOK:
		return 0
	case client.StatusTimeout:
		return 124
	case client.StatusInterrupted:
		return 130
	case client.StatusKilled:
		return 137
	}
	return 1
}

// showEvent prints one event of an execution as the REPL does: output as
// it comes, a displayed value's text (or the kinds of data it has), the
// traceback, and a line for an end that is not a plain one.
func showEvent(out, errw io.Writer, e client.Event, images *imageSaver) {
	switch e.Type {
	case client.EventStdout:
		io.WriteString(out, e.Text)
	case client.EventStderr:
		io.WriteString(errw, e.Text)
	case client.EventResult:
		showData(out, errw, e.Data, images)
	case client.EventRestored:
		fmt.Fprintf(errw, "sandloop: the session was asleep and woke for this: restored %s\n", e.Text)
	case client.EventError:
		tb := e.Traceback
		if tb == "" {
			tb = e.Name + ": " + e.Value + "\n"
		}
		io.WriteString(errw, tb)
	case client.EventEnd:
		switch e.Status {
		case client.StatusTimeout:
			fmt.Fprintln(errw, "[timed out; the session keeps its state]")
		case client.StatusInterrupted:
			fmt.Fprintln(errw, "[interrupted; the session keeps its state]")
		case client.StatusKilled:
			fmt.Fprintln(errw, "[the kernel was killed: restart the session]")
		}
	}
}
