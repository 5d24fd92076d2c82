package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion is set at link time by `make build`
// (-ldflags "-X main.buildVersion=...").
var buildVersion string

// version is this build's version: the one given at link time, else from
// its build info the module version (`go install ...@vX`), else the VCS
// revision (with "+dirty" for a modified tree), else "dev".
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return "dev"
	}
	return "dev-" + rev + dirty
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sandloop's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi, _ := debug.ReadBuildInfo()
			gov := ""
			if bi != nil {
				gov = " (" + bi.GoVersion + ")"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sandloop %s%s\n", version(), gov)
			return nil
		},
	}
}
