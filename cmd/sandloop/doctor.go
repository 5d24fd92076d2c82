package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/zygote"
	"github.com/spf13/cobra"
)

// doctorPackages are the libraries users reach for most; doctor checks
// that each imports inside the sandbox.
var doctorPackages = []string{"numpy", "pandas", "matplotlib", "flask", "requests", "pytest"}

const doctorScript = `
import importlib, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        out["packages"][name] = {"ok": True, "version": getattr(m, "__version__", "")}
    except Exception as e:
        out["packages"][name] = {"ok": False, "error": type(e).__name__ + ": " + str(e)}
print(json.dumps(out))
`

type doctorReport struct {
	Python     string `json:"python"`
	Executable string `json:"executable"`
	Packages   map[string]struct {
		OK      bool   `json:"ok"`
		Version string `json:"version"`
		Error   string `json:"error"`
	} `json:"packages"`
}

func newDoctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Show which isolation layers this host supports and what the sandbox's Python can import",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !runDoctor(cmd.Context(), cmd.OutOrStdout()) {
				return &exitError{1}
			}
			return nil
		},
	}
}

// runDoctor prints the report and says whether a safe sandbox can be built.
func runDoctor(ctx context.Context, w io.Writer) bool {
	ok := true
	line := func(good bool, name, detail string) {
		mark := "ok  "
		if !good {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s  %-17s %s\n", mark, name, detail)
	}
	r := jail.Probe()
	who := fmt.Sprintf("uid %d (sandbox user %d maps to host uid %d)", os.Geteuid(), jail.SandboxUID, r.HostID)
	if r.Root {
		who = fmt.Sprintf("root (sandbox user %d maps to host uid %d)", jail.SandboxUID, r.HostID)
	}
	fmt.Fprintf(w, "sandloop doctor: running as %s\n", who)
	line(r.UserNamespaces.OK, "user namespaces", r.UserNamespaces.Detail)
	line(r.Namespaces.OK, "namespaces", r.Namespaces.Detail)
	line(r.Seccomp.OK, "seccomp", r.Seccomp.Detail)
	line(r.Cgroups.OK, "cgroups", r.Cgroups.Detail)
	fmt.Fprintf(w, "--    %-17s %s\n", "jail init", jail.InitInfo())
	quota := fmt.Sprintf("%s and %d files per workspace by default (--disk, --files)", formatSize(jail.DefaultDisk), jail.DefaultFiles)
	if q := jail.QuotaSupport(); q.OK {
		line(true, "workspace quota", quota+": "+q.Detail)
	} else {
		fmt.Fprintf(w, "--    %-17s %s: not enforced inside the sandbox: %s\n", "workspace quota", quota, q.Detail)
	}
	if err := zygote.Supported(); err == nil {
		line(true, "zygote", "serve, mcp and agent fork sessions from a template with numpy, pandas and matplotlib imported (--zygote=off to start them cold)")
	} else {
		fmt.Fprintf(w, "--    %-17s not used: %v; sessions start cold\n", "zygote", err)
	}
	if r.Landlock.OK {
		line(true, "landlock", r.Landlock.Detail)
	} else {
		fmt.Fprintf(w, "--    %-17s %s\n", "landlock", r.Landlock.Detail)
	}
	ok = r.UserNamespaces.OK && r.Namespaces.OK && r.Seccomp.OK

	if _, err := os.Stat(jail.DefaultPython); err != nil {
		line(false, "python", jail.DefaultPython+" not found: install Debian's python3 (apt-get install python3)")
		return false
	}
	ws, err := os.MkdirTemp("", "sandloop-doctor-")
	if err != nil {
		line(false, "jail", err.Error())
		return false
	}
	defer os.RemoveAll(ws)
	var out, errb bytes.Buffer
	start := time.Now()
	res, err := jail.Run(ctx, &jail.Config{
		Path:      jail.DefaultPython,
		Args:      append([]string{"python3", "-c", doctorScript}, doctorPackages...),
		Workspace: ws,
		Limits:    jail.Limits{Timeout: 60 * time.Second, Memory: 1 << 30},
		Env:       []string{"MPLBACKEND=Agg", "MPLCONFIGDIR=/tmp"},
		Stdout:    &out,
		Stderr:    &errb,
	})
	if err != nil {
		line(false, "jail", "cannot start a sandbox: "+err.Error())
		return false
	}
	var rep doctorReport
	if res.ExitCode != 0 || json.Unmarshal(out.Bytes(), &rep) != nil {
		line(false, "jail", fmt.Sprintf("python exited %d in the sandbox: %s", res.ExitCode, bytes.TrimSpace(errb.Bytes())))
		return false
	}
	line(true, "jail", fmt.Sprintf("started, ran python and cleaned up in %s (limits by %s)", time.Since(start).Round(time.Millisecond), res.Enforcement))
	for _, wmsg := range res.Warnings {
		fmt.Fprintln(w, "warn  "+wmsg)
	}
	line(true, "python", fmt.Sprintf("%s (Python %s)", jail.DefaultPython, rep.Python))
	for _, name := range doctorPackages {
		p := rep.Packages[name]
		if p.OK {
			line(true, "  "+name, p.Version)
		} else {
			fmt.Fprintf(w, "--    %-17s not importable in the sandbox: %s (apt-get install python3-%s)\n", "  "+name, p.Error, name)
		}
	}
	if ok {
		fmt.Fprintln(w, "a safe sandbox can be built on this host")
	} else {
		fmt.Fprintln(w, "a safe sandbox cannot be built on this host: see the FAIL lines")
	}
	return ok
}
