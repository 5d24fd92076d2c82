package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/sandloop/sandloop/internal/agent"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/spf13/cobra"
)

func newRunsCmd() *cobra.Command {
	var dataDir, database string
	cmd := &cobra.Command{
		Use:   "runs [ls|show ID|export ID]",
		Short: "The history of agent runs",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return listRuns(cmd, dataDir, database, 20) },
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "where run history is kept")
	cmd.PersistentFlags().StringVar(&database, "database", "", databaseHelp)
	var limit int
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List recent runs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return listRuns(cmd, dataDir, database, limit) },
	}
	ls.Flags().IntVarP(&limit, "limit", "n", 20, "how many runs")
	var full bool
	show := &cobra.Command{
		Use: "show ID", Short: "Show a run: its report, diff and steps", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return showRun(cmd, dataDir, database, args[0], full) },
	}
	show.Flags().BoolVar(&full, "full", false, "show each step whole: the model's text and every tool result, output and traceback included")
	var out string
	export := &cobra.Command{
		Use: "export ID", Short: "Export a run (report, steps, events, final files) as a .zip", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return exportRun(cmd, dataDir, database, args[0], out) },
	}
	export.Flags().StringVarP(&out, "output", "o", "", "where to write the zip (default RUNID.zip; - for stdout)")
	cmd.AddCommand(ls, show, export)
	return cmd
}

func openHistory(cmd *cobra.Command, dataDir, database string) (store.History, error) {
	if database != "" || os.Getenv("SANDLOOP_DATABASE_URL") != "" {
		return openStore(cmd.Context(), dataDir, database)
	}
	if _, err := os.Stat(dataDir + "/runs.db"); err != nil {
		return nil, usagef("no run history in %s (run `sandloop agent` first, or pass --data-dir)", dataDir)
	}
	return openStore(cmd.Context(), dataDir, "")
}

// openRun opens the history and finds the run an id prefix names.
func openRun(cmd *cobra.Command, dataDir, database, prefix string) (store.History, string, error) {
	st, err := openHistory(cmd, dataDir, database)
	if err != nil {
		return nil, "", err
	}
	id, err := resolveRun(cmd, st, prefix)
	if err != nil {
		st.Close()
		return nil, "", err
	}
	return st, id, nil
}

func resolveRun(cmd *cobra.Command, st store.History, prefix string) (string, error) {
	id, err := st.LookupRunID(cmd.Context(), prefix)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", usagef("no run %q (see sandloop runs ls)", prefix)
	case errors.Is(err, store.ErrAmbiguous):
		return "", usagef("%q matches several runs: give more of the id", prefix)
	}
	return id, err
}

func listRuns(cmd *cobra.Command, dataDir, database string, limit int) error {
	st, err := openHistory(cmd, dataDir, database)
	if err != nil {
		return err
	}
	defer st.Close()
	list, err := st.ListRuns(cmd.Context(), store.ListOptions{Limit: limit})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tSTATUS\tMODE\tSTEPS\tTOKENS\tCOST\tTASK")
	for _, r := range list {
		task := strings.ReplaceAll(r.Task, "\n", " ")
		if len(task) > 50 {
			task = task[:47] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.CreatedAt.Local().Format("2006-01-02 15:04"), r.Status, r.Mode, r.Steps, r.TokensIn+r.TokensOut, runCost(r), task)
	}
	return tw.Flush()
}

func showRun(cmd *cobra.Command, dataDir, database, prefix string, full bool) error {
	st, id, err := openRun(cmd, dataDir, database, prefix)
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := st.GetRun(cmd.Context(), id)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "run %s · %s · %s · %s\ntask: %s\n", r.ID, r.Status, r.Mode, r.Model, r.Task)
	fmt.Fprintf(w, "steps %d · tokens %d in, %d out · %s · created %s\n", r.Steps, r.TokensIn, r.TokensOut, runCost(*r), r.CreatedAt.Local().Format("2006-01-02 15:04:05"))
	steps, err := st.ListSteps(cmd.Context(), id)
	if err != nil {
		return err
	}
	// The figures are written out (once) so that their paths can be opened.
	figs, err := writeFigures(cmd.Context(), st, id, figureDir(dataDir, id))
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "sandloop: the run's figures could not be written: %v\n", err)
	}
	figsOf := map[int][]string{}
	for _, f := range figs {
		figsOf[f.Row] = append(figsOf[f.Row], f.Path)
	}
	var outputs map[string]string
	if full {
		if outputs, err = stepOutputs(cmd.Context(), st, id); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	for row, s := range steps {
		var e agent.Event
		_ = json.Unmarshal(s.Data, &e)
		switch s.Kind {
		case "model":
			if t := strings.TrimSpace(e.Text); t != "" {
				fmt.Fprintf(w, "[model] %s\n", stepText(t, 3, full))
			}
		case "reproduce":
			if c := e.Check; c != nil {
				text := stepText(c.Output, 4, full)
				if c.Status != string(kernel.StatusOK) && !full {
					text = headTail(c.Output, 2, 3) // the crash is at the end
				}
				fmt.Fprintf(w, "[reproduce %s] $ %s\n    %s\n", c.Status, c.Command, text)
			}
		case "tool":
			if full && e.Arguments != "" {
				var call strings.Builder
				newTerminalView(&call, false).showCall(s.Name, e.Arguments, true)
				fmt.Fprintf(w, "[%s call]\n    %s\n", s.Name, strings.ReplaceAll(strings.TrimRight(call.String(), "\n"), "\n", "\n    "))
			}
			mark := "ok"
			if e.IsError {
				mark = "error"
			}
			text := stepText(e.Text, 4, full)
			if e.IsError && !full {
				// The end of a traceback says what went wrong.
				text = headTail(e.Text, 2, 3)
			}
			fmt.Fprintf(w, "[%s %s] %s\n", s.Name, mark, text)
			if out := outputs[e.ToolCallID]; out != "" && tools.LeavesOut(e.Text) {
				// The model read a cut of the output; the run's history has it as it came.
				fmt.Fprintf(w, "    --- the whole output, as it came (%d lines) ---\n    %s\n", strings.Count(out, "\n"), stepText(out, 0, true))
			}
			for _, p := range figsOf[row] {
				fmt.Fprintf(w, "    figure: %s\n", p)
			}
		default:
			fmt.Fprintf(w, "[%s] %s\n", s.Kind, firstLines(e.Text, 2))
		}
	}
	if len(r.Report) > 0 {
		var rep agent.Report
		if json.Unmarshal(r.Report, &rep) == nil {
			newTerminalView(w, false).showReport(&rep)
		}
	}
	files, err := st.ListArtifacts(cmd.Context(), id)
	if err == nil && len(files) > 0 {
		fmt.Fprintln(w, "\nfiles:")
		for _, f := range files {
			fmt.Fprintf(w, "  %s (%d bytes)\n", f.Path, f.Size)
		}
	}
	return nil
}

// stepOutputs is the output of each of the run's tool calls, stdout and
// stderr as they came, by call id.
func stepOutputs(ctx context.Context, st store.History, id string) (map[string]string, error) {
	events, err := st.ListEvents(ctx, id, 0, 0)
	if err != nil {
		return nil, err
	}
	outs := map[string]*strings.Builder{}
	for _, ev := range events {
		if ev.Type != agent.EventOutput {
			continue
		}
		var e agent.Event
		if json.Unmarshal(ev.Data, &e) != nil || e.Exec == nil || e.ToolCallID == "" {
			continue
		}
		if e.Exec.Type != kernel.EventStdout && e.Exec.Type != kernel.EventStderr {
			continue
		}
		b := outs[e.ToolCallID]
		if b == nil {
			b = new(strings.Builder)
			outs[e.ToolCallID] = b
		}
		b.WriteString(e.Exec.Text)
	}
	m := make(map[string]string, len(outs))
	for k, b := range outs {
		m[k] = b.String()
	}
	return m, nil
}

// runCost is a run's cost, or "cost unknown" where its model has no price.
func runCost(r store.Run) string {
	var rep agent.Report
	unknown := r.CostUnknown || len(r.Report) > 0 && json.Unmarshal(r.Report, &rep) == nil && rep.Usage.CostUnknown
	return formatCost(r.CostUSD, unknown)
}

// formatCost is a cost as every view shows it (the web UI's fmtCost too):
// "cost unknown" where a model had no price, "$0" for nothing, then four
// decimals below a cent and two above.
func formatCost(usd float64, unknown bool) string {
	switch {
	case unknown:
		return "cost unknown"
	case usd == 0:
		return "$0"
	case usd < 0.0001:
		return "<$0.0001"
	case usd < 0.01:
		return fmt.Sprintf("$%.4f", usd)
	}
	return fmt.Sprintf("$%.2f", usd)
}

// stepText is a step's text: whole with --full, else its first n lines.
func stepText(s string, n int, full bool) string {
	if full {
		return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
	}
	return firstLines(s, n)
}

// headTail keeps the first head and the last tail lines of s.
func headTail(s string, head, tail int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= head+tail {
		return strings.Join(lines, "\n    ")
	}
	kept := append(append(lines[:head:head], fmt.Sprintf("... (%d lines; runs show --full shows them)", len(lines)-head-tail)), lines[len(lines)-tail:]...)
	return strings.Join(kept, "\n    ")
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		return strings.Join(lines[:n], "\n    ") + fmt.Sprintf(" ... (%d more lines)", len(lines)-n)
	}
	return strings.Join(lines, "\n    ")
}

func exportRun(cmd *cobra.Command, dataDir, database, prefix, out string) error {
	st, id, err := openRun(cmd, dataDir, database, prefix)
	if err != nil {
		return err
	}
	defer st.Close()
	var w io.Writer = cmd.OutOrStdout()
	if out != "-" {
		if out == "" {
			out = id + ".zip"
		}
		f, err := os.Create(out)
		if err != nil {
			return usagef("--output %s: %v", out, unwrapPathError(err))
		}
		defer f.Close()
		w = f
	}
	if err := st.ExportRun(cmd.Context(), id, w); err != nil {
		return err
	}
	if out != "-" {
		fmt.Fprintf(cmd.ErrOrStderr(), "sandloop: run %s exported to %s\n", id, out)
	}
	return nil
}
