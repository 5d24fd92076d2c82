package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// exitError carries the exit code a command wants; a nil error exits 0.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is bad input: one line saying what to fix, exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "sandloop",
		Short:         "Run Python in a sandbox, and let an AI write, run and fix it",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetVersionTemplate("sandloop {{.Version}}\n")
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{err.Error() + " (see '" + c.CommandPath() + " --help')"}
	})
	// Every command, in one list (cobra lists them sorted in --help).
	root.AddCommand(
		newRunCmd(), newExecCmd(), newReplCmd(),
		newAgentCmd(), newRunsCmd(), newLessonsCmd(),
		newServeCmd(), newGatewayCmd(), newMCPCmd(),
		newSessionsCmd(), newDoctorCmd(), newVersionCmd(), newTemplateCmd(),
	)
	explainArgs(root)
	return root
}

// explainArgs makes a wrong number of arguments, in c and every command
// under it, say how the command is used: cobra's words alone ("accepts 1
// arg(s), received 2") do not say which argument is wanted where.
func explainArgs(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usagef("%v (usage: %s; see '%s --help')", err, strings.TrimSuffix(cmd.UseLine(), " [flags]"), cmd.CommandPath())
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		explainArgs(sub)
	}
}

func execute(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	var ee *exitError
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue), isCobraUsage(err):
		fmt.Fprintln(stderr, "sandloop: "+err.Error())
		return 2
	default:
		fmt.Fprintln(stderr, "sandloop: "+err.Error())
		return 1
	}
}

// isCobraUsage recognises cobra's own argument errors (unknown command,
// wrong number of arguments), which are bad input too.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "requires at most", "unknown flag", "unknown shorthand", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
