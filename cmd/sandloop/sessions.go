package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/spf13/cobra"
)

// sessionsFlags are how the sessions verbs reach a running server.
type sessionsFlags struct {
	url, token string
	json       bool
}

func newSessionsCmd() *cobra.Command {
	var f sessionsFlags
	cmd := &cobra.Command{
		Use:   "sessions [ls|new|exec|rm|files|put|get|archive|checkpoint|checkpoints|restore|undo|fork|pause|resume|restart|snapshot|snapshots|drop-snapshot|hibernate|events] ID ...",
		Short: "The sessions of a running server: create, run code, files in and out, checkpoints, undo, fork, pause and resume, snapshots, hibernation, events",
		Long: `The sessions of a running sandloop server (sandloop serve), through its HTTP API.
The server is --url (or SANDLOOP_URL; default http://127.0.0.1:8080) and the token
--token (or SANDLOOP_TOKEN), the same token the sessions were created with: another
token's sessions are not found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return listSessions(cmd, &f) },
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.url, "url", cmp.Or(os.Getenv("SANDLOOP_URL"), "http://127.0.0.1:8080"), "the server's address (SANDLOOP_URL)")
	pf.StringVar(&f.token, "token", "", "the API token (default SANDLOOP_TOKEN)")
	pf.BoolVar(&f.json, "json", false, "print the server's answer as JSON")

	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List the token's sessions and their state", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return listSessions(cmd, &f) },
	}
	var name string
	checkpoint := &cobra.Command{
		Use: "checkpoint ID", Short: "Take a checkpoint of a session's exact state (variables and files)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				cp, err := c.Checkpoint(ctx, args[0], name)
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s taken at execution %d: %s of memory of its own, %s (%s)\n",
						cp.ID, cp.ExecutionCount, sizeText(cp.MemoryBytes), files(cp.Files), sizeText(cp.FileBytes))
					printNotCarried(cmd.OutOrStdout(), cp.NotCarried)
				}
				return cp, err
			})
		},
	}
	checkpoint.Flags().StringVar(&name, "name", "", "a name for it")
	checkpoints := &cobra.Command{
		Use: "checkpoints ID", Short: "List a session's checkpoints", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				list, err := c.Checkpoints(ctx, args[0])
				if err == nil && !f.json {
					printCheckpoints(cmd.OutOrStdout(), list)
				}
				return map[string]any{"checkpoints": list}, err
			})
		},
	}
	restore := &cobra.Command{
		Use:   "restore ID CHECKPOINT | restore SNAPSHOT",
		Short: "Put a session back exactly at a checkpoint (files written since are removed), or start a new session from a snapshot",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if !strings.HasPrefix(args[0], "snap-") {
					return usagef("restore takes a session and a checkpoint (restore ID cp2), or a snapshot id (restore snap-...)")
				}
				return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
					s, err := c.RestoreSnapshot(ctx, args[0], nil)
					if err == nil && !f.json {
						fmt.Fprintln(cmd.OutOrStdout(), s.ID)
						printRestored(cmd.ErrOrStderr(), s.ID, s.Restored)
					}
					return s, err
				})
			}
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				r, err := c.RestoreCheckpoint(ctx, args[0], args[1])
				if err == nil && !f.json {
					printRestored(cmd.OutOrStdout(), args[0], r)
				}
				return r, err
			})
		},
	}
	undo := &cobra.Command{
		Use: "undo ID", Short: "Revert a session's last execution (a session created with checkpoints auto)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				r, err := c.Undo(ctx, args[0])
				if err == nil && !f.json {
					printRestored(cmd.OutOrStdout(), args[0], r)
				}
				return r, err
			})
		},
	}
	var count int
	var from string
	fork := &cobra.Command{
		Use: "fork ID", Short: "Make new sessions with a session's variables and files", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 {
				return usagef("--count must be at least 1, not %d", count)
			}
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				kids, r, err := c.Fork(ctx, args[0], count, from)
				if err == nil && !f.json {
					w := cmd.OutOrStdout()
					for _, k := range kids {
						fmt.Fprintln(w, k.ID)
					}
					printRestored(cmd.ErrOrStderr(), "each", r)
				}
				return map[string]any{"sessions": kids, "restored": r}, err
			})
		},
	}
	fork.Flags().IntVarP(&count, "count", "n", 1, "how many sessions to make (at most 16)")
	fork.Flags().StringVar(&from, "checkpoint", "", "fork from this checkpoint instead of the live state")
	pause := &cobra.Command{
		Use: "pause ID", Short: "Freeze a session: no CPU, memory kept; any request resumes it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				s, err := c.Pause(ctx, args[0])
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.State)
				}
				return s, err
			})
		},
	}
	resume := &cobra.Command{
		Use: "resume ID", Short: "Thaw a paused session", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				s, err := c.Resume(ctx, args[0])
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.State)
				}
				return s, err
			})
		},
	}
	restart := &cobra.Command{
		Use: "restart ID", Short: "Start a session's kernel afresh (one that died, or to drop its state): its variables go, its files stay", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				s, err := c.Restart(ctx, args[0])
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s restarted: a new kernel (its variables and checkpoints are gone, its files stay)\n", s.ID)
				}
				return s, err
			})
		},
	}
	var snapName string
	snap := &cobra.Command{
		Use: "snapshot ID", Short: "Write a durable snapshot of a session (files exactly, variables as far as they serialize)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				sn, err := c.Snapshot(ctx, args[0], snapName)
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s, %s in all, %s written (the rest was stored already)\n",
						sn.ID, files(sn.Files), sizeText(sn.TotalBytes), sizeText(sn.NewBytes))
					if len(sn.Variables) > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "  variables saved: %s\n", strings.Join(sn.Variables, ", "))
					}
					for _, n := range sn.NotRestorable {
						fmt.Fprintf(cmd.OutOrStdout(), "  not restorable: %s: %s\n", n.Name, n.Reason)
					}
				}
				return sn, err
			})
		},
	}
	snap.Flags().StringVar(&snapName, "name", "", "a name for it")
	snaps := &cobra.Command{
		Use: "snapshots [ID]", Short: "List the token's snapshots (of session ID only, if given)", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				list, err := c.Snapshots(ctx, strings.Join(args, ""))
				if err == nil && !f.json {
					printSnapshots(cmd.OutOrStdout(), list)
				}
				return map[string]any{"snapshots": list}, err
			})
		},
	}
	dropSnap := &cobra.Command{
		Use: "drop-snapshot SNAPSHOT", Short: "Delete a snapshot", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				err := c.DeleteSnapshot(ctx, args[0])
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", args[0])
				}
				return map[string]any{"deleted": args[0]}, err
			})
		},
	}
	hibernate := &cobra.Command{
		Use: "hibernate ID", Short: "Move a session to the snapshot store and free its processes; any request restores it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, &f, func(ctx context.Context, c *client.Client) (any, error) {
				s, err := c.Hibernate(ctx, args[0])
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.State)
				}
				return s, err
			})
		},
	}
	cmd.AddCommand(ls)
	cmd.AddCommand(sessionUseCmds(&f)...)
	cmd.AddCommand(sessionFileCmds(&f)...)
	cmd.AddCommand(checkpoint, checkpoints, restore, undo, fork, pause, resume, restart, snap, snaps, dropSnap, hibernate, newSessionEventsCmd(&f))
	return cmd
}

// withClient runs call against the server and prints its answer as JSON
// with --json (call prints the human form itself). The server's refusals
// of bad input (400, 404) exit 2, as usage errors do.
func withClient(cmd *cobra.Command, f *sessionsFlags, call func(context.Context, *client.Client) (any, error)) error {
	return withClientFor(cmd, f, 5*time.Minute, call)
}

// withClientFor is withClient with the call bounded by d (0: by the
// command's context only).
func withClientFor(cmd *cobra.Command, f *sessionsFlags, d time.Duration, call func(context.Context, *client.Client) (any, error)) error {
	token := f.token
	if token == "" {
		token = strings.TrimSpace(os.Getenv("SANDLOOP_TOKEN"))
	}
	c, err := client.New(f.url, &client.Options{Token: token, OnRestored: func(r client.Restore) {
		printRestore(cmd.ErrOrStderr(), r)
	}})
	if err != nil {
		return usagef("--url: %v", err)
	}
	ctx, cancel := cmd.Context(), context.CancelFunc(func() {})
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	defer cancel()
	out, err := call(ctx, c)
	if err != nil {
		return serverError(f.url, err)
	}
	if f.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return nil
}

// serverError says what the server answered, or that it could not be
// reached and how to point at it.
func serverError(server string, err error) error {
	var ae *client.APIError
	var ue *url.Error
	var use *usageError
	var pe *fs.PathError
	var le *os.LinkError
	if errors.As(err, &use) || errors.As(err, &pe) || errors.As(err, &le) {
		return err // ours: a local file, or how the command was called
	}
	if errors.As(err, &ue) {
		err = ue.Err // the method and URL are known to the user
	}
	if !errors.As(err, &ae) {
		return fmt.Errorf("cannot reach the server at %s (is `sandloop serve` running? --url or SANDLOOP_URL name another): %v", server, err)
	}
	msg := ae.Message
	switch {
	case ae.StatusCode == http.StatusUnauthorized:
		msg += " (--token or SANDLOOP_TOKEN)"
	case strings.Contains(msg, "(its events: GET /v1/sessions/"):
		// A session closed lately (the API names its events' endpoint).
		if i := strings.Index(msg, "(its events: GET"); i >= 0 {
			msg = msg[:i] + "(`sandloop sessions events ID` says what happened to it)"
		}
	case ae.Code == "restart_required":
		// The API's hint names its endpoint; here, the command.
		msg = strings.TrimSuffix(msg, ": POST /v1/sessions/{id}/restart") + ": `sandloop sessions restart ID` starts a new kernel (its files stay)"
	}
	switch ae.StatusCode {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusUnauthorized:
		return usagef("%s", msg)
	}
	return errors.New(msg)
}

func listSessions(cmd *cobra.Command, f *sessionsFlags) error {
	return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
		list, err := c.ListSessions(ctx)
		if err != nil || f.json {
			return map[string]any{"sessions": list}, err
		}
		if len(list) == 0 {
			fmt.Fprintln(cmd.ErrOrStderr(), "no sessions (for this token)")
			return nil, nil
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tSTATUS\tCREATED\tLAST USED\tMEMORY LIMIT")
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d MiB\n", s.ID, cmp.Or(s.State, "running"), s.Status,
				s.CreatedAt.Local().Format("2006-01-02 15:04:05"), ago(s.LastUsedAt), s.MemoryMB)
		}
		return nil, tw.Flush()
	})
}

func printCheckpoints(w io.Writer, list []client.Checkpoint) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no checkpoints (take one with `sandloop sessions checkpoint ID`)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTAKEN\tEXECUTION\tMEMORY\tFILES")
	for _, cp := range list {
		name := cp.Name
		if cp.Auto && name == "" {
			name = "(auto)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d (%s)\n", cp.ID, name, cp.CreatedAt.Local().Format("15:04:05"),
			cp.ExecutionCount, sizeText(cp.MemoryBytes), cp.Files, sizeText(cp.FileBytes))
	}
	tw.Flush()
}

func printSnapshots(w io.Writer, list []client.Snapshot) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no snapshots (take one with `sandloop sessions snapshot ID`)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSESSION\tTAKEN\tFILES\tSIZE\tNOT RESTORABLE")
	for _, sn := range list {
		name := sn.Name
		if sn.Hibernation {
			name = "(hibernation)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\n", sn.ID, name, sn.Session, sn.CreatedAt.Local().Format("2006-01-02 15:04:05"),
			sn.Files, sizeText(sn.TotalBytes), len(sn.NotRestorable))
	}
	tw.Flush()
}

// printRestored says what came back, and above all what did not.
func printRestored(w io.Writer, who string, r *client.Restored) {
	if r == nil {
		return
	}
	vars := "" // a restore brings the whole state back; a fork lists what it carried
	if len(r.Variables) > 0 {
		vars = fmt.Sprintf(", variables %s", strings.Join(r.Variables, ", "))
	}
	prefix := who + ": "
	if who == "" { // under an event (sessions events)
		prefix = "  "
	}
	fmt.Fprintf(w, "%srestored from %s: %s%s, execution count %d\n", prefix, r.From, files(r.Files), vars, r.ExecutionCount)
	for _, n := range r.NotRestored {
		fmt.Fprintf(w, "  not restored: %s\n", n)
	}
	if r.Lost != "" {
		fmt.Fprintf(w, "  lost: %s\n", r.Lost)
	}
}

// printRestore says that a session's host was lost and the session
// restored from its latest snapshot under a new id, which the user must
// use from now on.
func printRestore(w io.Writer, r client.Restore) {
	what := "from its latest snapshot"
	if r.Summary != "" {
		what = r.Summary // "from snapshot snap-...: files exact (...); variables restored: ..."
	}
	fmt.Fprintf(w, "session %s was restored as %s %s (its host was lost; use %s from now on)\n", r.From, r.To, what, r.To)
}

func printNotCarried(w io.Writer, list []string) {
	for _, n := range list {
		fmt.Fprintf(w, "  not carried: %s\n", n)
	}
}

func files(n int) string {
	if n == 1 {
		return "1 file"
	}
	return fmt.Sprintf("%d files", n)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
