package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
	"github.com/spf13/cobra"
)

// doctorPackages are the libraries users reach for most; doctor checks
// that each imports inside the sandbox.
var doctorPackages = []string{"numpy", "pandas", "matplotlib", "flask", "requests", "pytest"}

const doctorScript = `
import importlib, json, sys, time
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
start = time.perf_counter()
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        out["packages"][name] = {"ok": True, "version": getattr(m, "__version__", "")}
    except Exception as e:
        out["packages"][name] = {"ok": False, "error": type(e).__name__ + ": " + str(e)}
out["import_seconds"] = time.perf_counter() - start
print(json.dumps(out))
`

type doctorReport struct {
	Python        string  `json:"python"`
	Executable    string  `json:"executable"`
	ImportSeconds float64 `json:"import_seconds"`
	Packages      map[string]struct {
		OK      bool   `json:"ok"`
		Version string `json:"version"`
		Error   string `json:"error"`
	} `json:"packages"`
}

func newDoctorCmd() *cobra.Command {
	timeout := defaultDoctorTimeout
	var templatesDir string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show which isolation layers this host supports and what the sandbox's Python can import",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usagef("--timeout %s: want a positive duration such as 60s or 5m", timeout)
			}
			if !runDoctor(cmd.Context(), cmd.OutOrStdout(), timeout, templatesDir) {
				return &exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&templatesDir, "templates-dir", filepath.Join(defaultDataDir(), "templates"), "the templates to check (whether each can fork its sessions)")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long the sandbox's Python may take to start and import the packages (a slow or emulated host may need more)")
	return cmd
}

// runDoctor prints the report, one line per layer (ok, warn where a
// documented weaker layer stands in, FAIL with the fix), and says whether a
// safe sandbox can be built: yes exactly when no line says FAIL.
func runDoctor(ctx context.Context, w io.Writer, timeout time.Duration, templatesDir string) bool {
	fails, warns := 0, 0
	line := func(c jail.Check, name string) {
		mark := "ok  "
		switch {
		case c.OK:
		case c.Fallback:
			mark = "warn"
			warns++
		default:
			mark = "FAIL"
			fails++
		}
		fmt.Fprintf(w, "%s  %-17s %s\n", mark, name, c.Detail)
		if !c.OK && c.Fix != "" {
			fmt.Fprintf(w, "      %-17s fix: %s\n", "", c.Fix)
		}
	}
	info := func(name, detail string) { fmt.Fprintf(w, "--    %-17s %s\n", name, detail) }
	r := jail.Probe()
	// In a pod, the fix for a missing layer is a pod setting: the layers'
	// lines point to the pod's, printed last.
	kube := inKubernetes()
	jailFailed := false
	verdict := func() bool {
		if kube != "" {
			info("kubernetes", "in a pod ("+kube+"): the settings the jail needs, see docs/kubernetes.md")
			for _, c := range podChecks(podFacts{Confinement: jail.ProbeConfinement(), Cgroups: r.Cgroups,
				NamespacesRefused: !r.UserNamespaces.OK, JailFailed: jailFailed}) {
				if c.info {
					info(c.name, c.Detail)
				} else {
					line(c.Check, c.name)
				}
			}
		}
		switch {
		case fails > 0:
			fmt.Fprintln(w, "a safe sandbox cannot be built on this host: see the FAIL lines")
		case warns > 0:
			fmt.Fprintln(w, "a safe sandbox can be built on this host, with weaker limits: see the warn lines")
		default:
			fmt.Fprintln(w, "a safe sandbox can be built on this host")
		}
		return fails == 0
	}
	if kube != "" {
		if !r.UserNamespaces.OK {
			r.UserNamespaces.Fix = podFix
		}
		if !r.Cgroups.OK {
			r.Cgroups.Fix = podFix
		}
	}
	who := fmt.Sprintf("uid %d (sandbox user %d maps to host uid %d)", os.Geteuid(), jail.SandboxUID, r.HostID)
	if r.Root {
		who = fmt.Sprintf("root (sandbox user %d maps to host uid %d)", jail.SandboxUID, r.HostID)
	}
	if r.Container != "" {
		who += ", in a container (" + r.Container + ")"
	}
	fmt.Fprintf(w, "sandloop doctor: running as %s\n", who)
	line(r.UserNamespaces, "user namespaces")
	line(r.Namespaces, "namespaces")
	line(r.Seccomp, "seccomp")
	line(r.Cgroups, "cgroups")
	line(r.Pause, "pause")
	quota := jail.QuotaSupport()
	quota.Detail = fmt.Sprintf("%s and %d files per workspace by default (--disk, --files): %s", formatSize(jail.DefaultDisk), jail.DefaultFiles, quota.Detail)
	line(quota, "workspace quota")
	if n, bytes := jail.LeftWorkspaces(); n > 0 {
		info("left workspaces", fmt.Sprintf("%d, holding %s, of sessions whose server died: a serve restarted on their --data-dir takes their files; each goes %s after a sandloop first saw it left (%s)",
			n, formatSize(bytes), jail.LeftoverGrace, os.TempDir()))
	}
	if how, why := session.ForkFilesSupport(); how == session.ForkFilesOverlay {
		line(jail.Check{OK: true, Detail: "a fork's children share one read-only copy of the parent's files (an overlayfs each; what a child writes goes to its own capped tmpfs)"}, "fork files")
	} else {
		info("fork files", "each child of a fork gets its own copy of the parent's files (shared only as root: "+why+")")
	}
	if err := zygote.Supported(); err == nil {
		line(jail.Check{OK: true, Detail: "serve, mcp and agent fork sessions from a template with numpy, pandas and matplotlib imported (--zygote=off to start them cold)"}, "zygote")
	} else {
		info("zygote", fmt.Sprintf("not used: %s; sessions start cold", host.UnsupportedReason(err)))
	}
	info("jail init", jail.InitInfo())
	info("jail join", jail.JoinInfo())
	if zygote.Supported() == nil {
		info("zygote reaper", zygote.ReaperInfo())
	}
	if r.Landlock.OK {
		line(r.Landlock, "landlock")
	} else {
		info("landlock", r.Landlock.Detail)
	}
	if _, err := os.Stat(jail.DefaultPython); err != nil {
		line(jail.Check{Detail: jail.DefaultPython + " not found", Fix: "apt-get install python3"}, "python")
		return verdict()
	}
	ws, err := os.MkdirTemp("", "sandloop-doctor-")
	if err != nil {
		jailFailed = true
		line(jail.Check{Detail: err.Error()}, "jail")
		return verdict()
	}
	defer os.RemoveAll(ws)
	var out, errb bytes.Buffer
	start := time.Now()
	res, err := jail.Run(ctx, &jail.Config{
		Path:      jail.DefaultPython,
		Args:      append([]string{"python3", "-c", doctorScript}, doctorPackages...),
		Workspace: ws,
		Limits:    jail.Limits{Timeout: timeout, Memory: doctorMemory},
		Env:       []string{"MPLBACKEND=Agg", "MPLCONFIGDIR=/tmp"},
		Stdout:    &out,
		Stderr:    &errb,
	})
	total := time.Since(start)
	if err != nil {
		jailFailed = true
		line(jail.Check{Detail: "cannot start a sandbox: " + err.Error(), Fix: podFixIf(kube)}, "jail")
		return verdict()
	}
	var rep doctorReport
	if res.ExitCode != 0 || json.Unmarshal(out.Bytes(), &rep) != nil {
		jailFailed = true
		line(jail.Check{Detail: doctorJailFailure(res, errb.Bytes(), timeout), Fix: podFixIf(kube)}, "jail")
		return verdict()
	}
	// What the jail costs, apart from importing the packages (slow the
	// first time, from a cold file cache).
	imports := time.Duration(rep.ImportSeconds * float64(time.Second))
	line(jail.Check{OK: true, Detail: fmt.Sprintf("started, ran python and cleaned up in %s, of which importing %d packages took %s (limits by %s)",
		total.Round(time.Millisecond), len(doctorPackages), imports.Round(time.Millisecond), res.Enforcement)}, "jail")
	line(jail.Check{OK: true, Detail: fmt.Sprintf("%s (Python %s)", jail.DefaultPython, rep.Python)}, "python")
	line(doctorEgress(ctx), "egress proxy")
	line(doctorWheelCache(), "wheel cache")
	for _, name := range doctorPackages {
		p := rep.Packages[name]
		if p.OK {
			line(jail.Check{OK: true, Detail: p.Version}, "  "+name)
		} else {
			info("  "+name, fmt.Sprintf("not importable in the sandbox: %s (apt-get install python3-%s)", p.Error, name))
		}
	}
	doctorTemplates(ctx, w, templatesDir, timeout)
	return verdict()
}

// The limits of doctor's sandbox: room for importing numpy, pandas and
// matplotlib from a cold file cache on a slow host (--timeout for slower).
const (
	defaultDoctorTimeout = 60 * time.Second
	doctorMemory         = 1 << 30
)

// doctorJailFailure says why doctor's Python did not report: how it ended
// (a timeout or an OOM kill is named, not left as a bare 137) and what it
// printed.
func doctorJailFailure(res *jail.Result, stderr []byte, timeout time.Duration) string {
	how := fmt.Sprintf("python exited %d in the sandbox", res.ExitCode)
	switch {
	case res.TimedOut:
		how = fmt.Sprintf("python did not finish within %s in the sandbox (importing %s; a very slow or overloaded host? run doctor again with a longer --timeout)", timeout, strings.Join(doctorPackages, ", "))
	case res.OOMKilled:
		how = fmt.Sprintf("python was killed by the kernel's OOM killer at doctor's %d MiB memory limit in the sandbox", doctorMemory>>20)
	case res.Signal != "":
		how = fmt.Sprintf("python was killed by %s in the sandbox", res.Signal)
	}
	if msg := bytes.TrimSpace(stderr); len(msg) > 0 {
		return how + ": " + string(msg)
	}
	return how
}

// podFixIf points a failed jail line to the pod lines, in a pod.
func podFixIf(kube string) string {
	if kube == "" {
		return ""
	}
	return podFix
}

const podFix = "see the pod lines below"

// doctorTemplates lists the templates in dir and whether each can fork
// its sessions: its zygote is started (its Python, read-only tree and
// preloads) and the time it took to be ready is said, or why it cannot.
// A template that cannot fork still works: its sessions start cold.
func doctorTemplates(ctx context.Context, w io.Writer, dir string, timeout time.Duration) {
	info := func(name, detail string) { fmt.Fprintf(w, "--    %-17s %s\n", name, detail) }
	if _, err := os.Stat(filepath.Join(dir, "names")); err != nil {
		info("templates", "none in "+dir+" (sandloop template build NAME --pip PKG makes one)")
		return
	}
	st, err := template.Open(dir)
	var ts []*template.Template
	if err == nil {
		ts, err = st.List()
	}
	if err != nil {
		info("templates", fmt.Sprintf("cannot read %s: %v", dir, unwrapPathError(err)))
		return
	}
	if len(ts) == 0 {
		info("templates", "none in "+dir+" (sandloop template build NAME --pip PKG makes one)")
		return
	}
	info("templates", fmt.Sprintf("%d in %s", len(ts), dir))
	zerr := zygote.Supported()
	for _, t := range ts {
		what := fmt.Sprintf("Python %s, %d package(s), %s", t.Python, len(t.Packages), formatSize(t.Size))
		if zerr != nil {
			info("  "+t.Name, what+"; cannot fork: "+host.UnsupportedReason(zerr)+" (its sessions start cold)")
			continue
		}
		pool := template.NewPool(st, &template.PoolOptions{MaxWarm: 1, Spares: 1})
		wctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		err := pool.Warm(wctx, []string{t.Name})
		took := time.Since(start)
		cancel()
		pool.Close()
		preload := "the default preloads"
		if len(t.Preload) > 0 {
			preload = strings.Join(t.Preload, ", ")
		}
		if err != nil {
			fmt.Fprintf(w, "warn  %-17s %s; cannot fork (its sessions start cold): %v\n", "  "+t.Name, what, err)
			continue
		}
		fmt.Fprintf(w, "ok    %-17s %s; forks: its zygote was ready in %s with %s imported\n", "  "+t.Name, what, took.Round(time.Millisecond), preload)
	}
}
