package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/spf13/cobra"
)

// newSessionEventsCmd is `sandloop sessions events ID`: a session's
// lifecycle, one line per transition (--json: the server's events), and
// with --follow each new one as it comes until the session closes.
func newSessionEventsCmd(f *sessionsFlags) *cobra.Command {
	var follow bool
	var since int64
	cmd := &cobra.Command{
		Use:   "events ID",
		Short: "What happened to a session: created, paused, hibernated, woken, restored, forked, taken over, lost, closed, each with why",
		Long: `A session's lifecycle events, oldest first: how it was created, each pause and resume,
hibernation and wake, checkpoint, undo, fork, snapshot and restart, a kernel that died,
a loss of its processes (its keeper or the server died) and its close, each with why and,
where something was restored, what came back. The server keeps a session's latest 256,
and a closed session's for an hour. --follow prints each new one as it comes, until the
session closes (watching does not keep it open nor wake it).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if !follow {
				return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
					evs, ended, err := c.SessionEvents(ctx, args[0], since)
					if err == nil && !f.json {
						for _, e := range evs {
							printSessionEvent(out, e)
						}
					}
					return map[string]any{"events": evs, "ended": ended}, err
				})
			}
			enc := json.NewEncoder(out)
			printed := *f
			printed.json = false // each event is printed as it comes
			return withClientFor(cmd, &printed, 0, func(ctx context.Context, c *client.Client) (any, error) {
				err := c.WatchSessionEvents(ctx, args[0], since, func(e client.SessionEvent) error {
					if f.json {
						return enc.Encode(e) // one per line, as they come
					}
					printSessionEvent(out, e)
					return nil
				})
				if err != nil && ctx.Err() != nil {
					err = nil // interrupted: not a failure
				}
				return nil, err
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print each new event as it comes, until the session closes")
	cmd.Flags().Int64Var(&since, "since", 0, "only the events after this number (the # of the last one seen)")
	return cmd
}

// printSessionEvent prints one event on a line, with what it restored
// below it (printRestored).
func printSessionEvent(w io.Writer, e client.SessionEvent) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  #%d  %s", e.Time.Local().Format(time.DateTime), e.Seq, e.Type)
	if e.State != "" && e.State != "running" && e.Type != e.State { // lost (hibernated)
		fmt.Fprintf(&b, " (%s)", e.State)
	}
	var parts []string
	switch e.How {
	case "":
	case "new":
		parts = append(parts, "a new kernel")
	case "pool":
		parts = append(parts, "from the warm pool")
	case "fork":
		parts = append(parts, "a fork of "+e.Parent)
	default: // template, snapshot: named below
		parts = append(parts, "from a "+e.How)
	}
	if e.Reason != "" {
		parts = append(parts, e.Reason)
	}
	for _, f := range [][2]string{{"template", e.Template}, {"checkpoint", e.Checkpoint}, {"snapshot", e.Snapshot}} {
		if f[1] != "" {
			parts = append(parts, f[0]+" "+f[1])
		}
	}
	if len(e.Children) > 0 {
		parts = append(parts, "into "+strings.Join(e.Children, ", "))
	}
	if len(parts) > 0 {
		b.WriteString(": " + strings.Join(parts, "; "))
	}
	fmt.Fprintln(w, b.String())
	printRestored(w, "", e.Restored)
}
