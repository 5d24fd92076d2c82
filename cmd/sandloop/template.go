package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// registerTemplateServeFlags adds serve's template flags.
func registerTemplateServeFlags(f *pflag.FlagSet, c *host.Config) {
	f.StringVar(&c.TemplatesDir, "templates-dir", "", "where templates are kept (default DATA-DIR/templates; see 'sandloop template')")
	f.StringSliceVar(&c.WarmTemplates, "warm-templates", nil, "templates whose warm kernels (zygotes) start with the server (comma-separated)")
	f.IntVar(&c.MaxWarmTemplates, "max-warm-templates", 4, "templates' warm kernels kept at once (the least recently used idle one makes room)")
	f.StringVar(&c.DefaultTemplate, "default-template", "", `the template of sessions that name none (a client asks for the plain environment with {"template": ""})`)
}

type templateFlags struct {
	dataDir, dir string
}

func (tf *templateFlags) register(f *pflag.FlagSet) {
	f.StringVar(&tf.dataDir, "data-dir", defaultDataDir(), "serve's data directory")
	f.StringVar(&tf.dir, "templates-dir", "", "where templates are kept (default DATA-DIR/templates)")
}

func (tf *templateFlags) open() (*template.Store, error) {
	dir := tf.dir
	if dir == "" {
		dir = filepath.Join(tf.dataDir, "templates")
	}
	st, err := template.Open(dir)
	if err != nil {
		return nil, usagef("--templates-dir %s: %v", dir, unwrapPathError(err))
	}
	return st, nil
}

func newTemplateCmd() *cobra.Command {
	tf := &templateFlags{}
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build, list and remove templates: Python environments sessions start in",
		Long: `A template is a Python environment (a virtual environment on the sandbox's
/usr/bin/python3, the system's packages still visible) built once in a sandbox
through the egress proxy, frozen read-only and mounted at /opt/sandloop/env in
each session that asks for it ({"template": "NAME"} on POST /v1/sessions, or
E2B's Sandbox.create("NAME")). Each template in use gets its own warm kernel
that has imported its --preload modules.

A template may instead be an OCI image (build --image): its root file system
is then the sandbox's root (read-only) and its own python3 runs the kernel,
so a template can bring another Python version or system libraries.`,
	}
	tf.register(cmd.PersistentFlags())
	cmd.AddCommand(newTemplateBuildCmd(tf), newTemplateLsCmd(tf), newTemplateShowCmd(tf), newTemplateRmCmd(tf))
	return cmd
}

func newTemplateBuildCmd(tf *templateFlags) *cobra.Command {
	var pips, preload, envs, allow []string
	var requirements, caCert, pipIndex, wheelCache string
	var image, python, maxSize string
	var fromSnapshot, snapshotStore, token string
	cmd := &cobra.Command{
		Use:   "build NAME (--pip PKG... | --requirements FILE | --image REF | --from-snapshot ID)",
		Short: "Build a template from pip packages, a requirements file, an OCI image or a session's snapshot",
		Long: `Build a template in a sandbox from pip packages or a requirements file (a
virtual environment on the sandbox's Python), or from an OCI image (--image):
an OCI layout directory (podman save --format oci-dir), an OCI archive
(podman save --format oci-archive), a docker save tarball, or a registry
reference where a registry is reachable. An image's root file system becomes
the sandbox's root, read-only, and its own python3 runs the sessions: every
digest is checked, set-id bits and device nodes are dropped, and entries that
would reach outside the tree are refused.

--from-snapshot makes a configured session a template: the files of a
durable snapshot (sandloop sessions snapshot) are kept read-only in the
template, and its variables with them; each session of the template starts
with a writable copy of the files and the variables loaded. --token names the
snapshot's owner (the token its session was created with; none on a server
without tokens). A snapshot of a session of template T makes a template with
T's environment.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromSnapshot != "" {
				if image != "" || len(pips) > 0 || requirements != "" {
					return usagef("--from-snapshot builds from a snapshot alone: drop --image, --pip and --requirements")
				}
				return buildSnapshotTemplate(cmd, tf, args[0], fromSnapshot, snapshotStore, token, preload, envs)
			}
			if snapshotStore != "" {
				return usagef("--snapshot-store goes with --from-snapshot")
			}
			if image != "" {
				if len(pips) > 0 || requirements != "" {
					return usagef("--image builds from an image alone: drop --pip and --requirements (install packages in the image)")
				}
				return buildImageTemplate(cmd, tf, args[0], image, python, maxSize, preload, envs)
			}
			if python != "" || maxSize != "" {
				return usagef("--python and --max-size go with --image")
			}
			spec := template.Spec{Pip: pips, Preload: preload, Env: map[string]string{}}
			if requirements != "" {
				b, err := os.ReadFile(requirements)
				if err != nil {
					return usagef("--requirements: %v", unwrapPathError(err))
				}
				spec.Requirements = string(b)
			}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usagef("--env %q: give NAME=VALUE", kv)
				}
				spec.Env[k] = v
			}
			if len(allow) == 0 {
				allow = []string{"pypi"}
			}
			al, err := egress.ParseAllowlist(allow)
			if err != nil {
				return usagef("--allow: %v", err)
			}
			opts := &template.BuildOptions{Egress: &egress.Policy{Allow: al}, Files: map[string][]byte{}}
			if pipIndex != "" {
				opts.Env = append(opts.Env, "PIP_INDEX_URL="+pipIndex)
				if strings.HasPrefix(pipIndex, "http://") {
					// pip refuses plain HTTP unless told the host is trusted.
					host := strings.SplitN(strings.TrimPrefix(pipIndex, "http://"), "/", 2)[0]
					opts.Env = append(opts.Env, "PIP_TRUSTED_HOST="+strings.Split(host, ":")[0])
				}
			} else if opts.Cache, err = openWheelCache(wheelCache, tf.dataDir, egress.DefaultCacheBytes, egress.DefaultIndex(), nil); err != nil {
				return err
			}
			if caCert != "" {
				b, err := os.ReadFile(caCert)
				if err != nil {
					return usagef("--ca-cert: %v", unwrapPathError(err))
				}
				opts.Files["ca.pem"] = b
				opts.Env = append(opts.Env, "PIP_CERT=/workspace/ca.pem", "SSL_CERT_FILE=/workspace/ca.pem")
			}
			st, err := tf.open()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "building template %s in a sandbox...\n", args[0])
			t, err := st.Build(cmd.Context(), args[0], spec, opts)
			if err != nil {
				return templateError(err)
			}
			printTemplate(cmd.OutOrStdout(), t, 0)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&pips, "pip", nil, "packages to install (requirement specifiers; repeatable or comma-separated)")
	f.StringVar(&requirements, "requirements", "", "a pip requirements file")
	f.StringSliceVar(&preload, "preload", nil, "modules the template's warm kernel imports (default: numpy, pandas, matplotlib; with --image: none)")
	f.StringArrayVar(&envs, "env", nil, "NAME=VALUE set in the template's sessions (repeatable)")
	f.StringSliceVar(&allow, "allow", nil, "what the build's pip may reach (default: pypi; see serve --allow)")
	f.StringVar(&pipIndex, "pip-index", "", "the index pip installs from (default: PyPI through the wheel cache)")
	f.StringVar(&caCert, "ca-cert", "", "a CA certificate (PEM) the build's pip trusts, for a private index")
	f.StringVar(&wheelCache, "wheel-cache", "", "the package cache (default DATA-DIR/wheel-cache; off: none)")
	f.StringVar(&image, "image", "", "an OCI image: layout directory, OCI archive, docker save tarball or registry reference")
	f.StringVar(&python, "python", "", "with --image: the interpreter in the image (default /usr/local/bin/python3, else /usr/bin/python3)")
	f.StringVar(&maxSize, "max-size", "", "with --image: the most it may unpack to (default 4GiB)")
	f.StringVar(&fromSnapshot, "from-snapshot", "", "a durable snapshot's id (snap-...): its files and variables become the template's")
	f.StringVar(&snapshotStore, "snapshot-store", "", "with --from-snapshot: serve's snapshot store, a directory or s3://... (default DATA-DIR/snapshots)")
	f.StringVar(&token, "token", os.Getenv("SANDLOOP_TOKEN"), "with --from-snapshot: the token the snapshot's session was created with (also SANDLOOP_TOKEN)")
	return cmd
}

func buildSnapshotTemplate(cmd *cobra.Command, tf *templateFlags, name, id, storeSpec, token string, preload, envs []string) error {
	o := &template.SnapshotBuildOptions{Preload: preload}
	for _, kv := range envs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usagef("--env %q: give NAME=VALUE", kv)
		}
		if o.Env == nil {
			o.Env = map[string]string{}
		}
		o.Env[k] = v
	}
	if storeSpec == "" {
		storeSpec = filepath.Join(tf.dataDir, "snapshots")
		if _, err := os.Stat(storeSpec); err != nil {
			return usagef("no snapshot store at %s (give --snapshot-store, as serve has it)", storeSpec)
		}
	}
	b, err := snapshot.OpenBackend(cmd.Context(), storeSpec)
	if err != nil {
		return usagef("--snapshot-store: %v", err)
	}
	snaps, err := snapshot.New(b, nil)
	if err != nil {
		return err
	}
	st, err := tf.open()
	if err != nil {
		return err
	}
	owner := ""
	if token != "" {
		owner = server.OwnerOf(token)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "building template %s from the snapshot %s...\n", name, id)
	t, err := st.BuildFromSnapshot(cmd.Context(), name, template.SnapshotSource{Store: snaps, Owner: owner}, id, o)
	var sae *snapshot.ArgumentError
	switch {
	case errors.As(err, &sae):
		return usagef("--from-snapshot: %v", err)
	case errors.Is(err, snapshot.ErrNotFound):
		return usagef("%v: %s (sandloop sessions snapshots lists the token's snapshots; --token must be the one the session was created with)", err, id)
	case errors.Is(err, snapshot.ErrCorrupt):
		return fmt.Errorf("%v", err)
	case err != nil:
		return templateError(err)
	}
	printTemplate(cmd.OutOrStdout(), t, 0)
	return nil
}

func buildImageTemplate(cmd *cobra.Command, tf *templateFlags, name, image, python, maxSize string, preload, envs []string) error {
	spec := template.ImageSpec{Ref: image, Python: python, Preload: preload, Env: map[string]string{}}
	if maxSize != "" {
		n, err := parseSize(maxSize)
		if err != nil || n <= 0 {
			return usagef("--max-size %q: give a size such as 2GiB", maxSize)
		}
		spec.MaxSize = n
	}
	for _, kv := range envs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usagef("--env %q: give NAME=VALUE", kv)
		}
		spec.Env[k] = v
	}
	st, err := tf.open()
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "building template %s from the image %s...\n", name, image)
	t, err := st.BuildImage(cmd.Context(), name, spec, nil)
	if err != nil {
		return templateError(err)
	}
	printTemplate(cmd.OutOrStdout(), t, 0)
	return nil
}

func newTemplateLsCmd(tf *templateFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := tf.open()
			if err != nil {
				return err
			}
			ts, err := st.List()
			if err != nil {
				return err
			}
			if asJSON {
				ms := []template.Manifest{}
				for _, t := range ts {
					ms = append(ms, t.Manifest)
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(ms)
			}
			if len(ts) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no templates (sandloop template build NAME --pip PKG makes one)")
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPYTHON\tPACKAGES\tSIZE\tCREATED\tID")
			for _, t := range ts {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", t.Name, t.Python, len(t.Packages), sizeText(t.Size), t.Created.Format("2006-01-02 15:04"), t.ID[:12])
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTemplateShowCmd(tf *templateFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show a template: Python, packages, preloads, size",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := tf.open()
			if err != nil {
				return err
			}
			t, err := st.Get(args[0])
			if err != nil {
				return templateError(err)
			}
			printTemplate(cmd.OutOrStdout(), t, -1)
			return nil
		},
	}
}

func newTemplateRmCmd(tf *templateFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove templates",
		Long: `Remove templates. A running server's sessions keep their template while they
live; to have removal refused while sessions use it, remove it through the
server (DELETE /v1/templates/NAME answers 409).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := tf.open()
			if err != nil {
				return err
			}
			for _, n := range args {
				if err := st.Remove(n); err != nil {
					return templateError(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", n)
			}
			return nil
		},
	}
}

// templateError makes bad input a usage error (exit 2) and a failed
// build one line plus pip's words (exit 1).
func templateError(err error) error {
	var ae *template.ArgumentError
	var be *template.BuildError
	var le *template.LayerError
	var de *template.DigestError
	var se *template.ImageSizeError
	switch {
	case errors.As(err, &ae), errors.As(err, &le), errors.As(err, &de), errors.As(err, &se):
		return usagef("%v", err)
	case errors.Is(err, template.ErrNotFound):
		return usagef("%v (sandloop template ls lists them)", err)
	case errors.As(err, &be):
		return fmt.Errorf("%v", be)
	}
	return err
}

func printTemplate(w interface{ Write([]byte) (int, error) }, t *template.Template, maxPkgs int) {
	fmt.Fprintf(w, "template %s  (id %s)\n", t.Name, t.ID[:12])
	if t.Kind == template.KindImage {
		fmt.Fprintf(w, "  image    %s\n", t.Image)
		if t.ImageDigest != "" {
			fmt.Fprintf(w, "  digest   %s\n", t.ImageDigest)
		}
		fmt.Fprintf(w, "  python   %s (%s, the image's own: the image is the sandbox's root)\n", t.Python, t.Interpreter)
	} else {
		fmt.Fprintf(w, "  python   %s\n", t.Python)
	}
	if fs := t.Snapshot; fs != nil {
		from := "snapshot " + fs.ID
		if fs.Session != "" {
			from += " (of session " + fs.Session + ")"
		}
		if fs.Base != "" {
			from += ", based on template " + fs.Base
		}
		fmt.Fprintf(w, "  from     %s\n", from)
		fmt.Fprintf(w, "  files    %d (%s), copied into each session's workspace\n", fs.FileCount, sizeText(fs.FileBytes))
		vars := "none"
		if len(fs.Variables) > 0 {
			vars = strings.Join(fs.Variables, ", ") + " (" + sizeText(fs.StateBytes) + ", loaded into each session)"
		}
		fmt.Fprintf(w, "  variables %s\n", vars)
		for _, ns := range fs.NotSaved {
			fmt.Fprintf(w, "  not restorable %s\n", ns)
		}
	}
	if t.Kind != template.KindSnapshot {
		fmt.Fprintf(w, "  size     %s in %d files\n", sizeText(t.Size), t.Files)
	}
	preload := "numpy, pandas, matplotlib (the default)"
	if m := t.Modules(); m != nil {
		preload = strings.Join(m, ", ")
		if len(m) == 0 {
			preload = "none"
		}
	}
	fmt.Fprintf(w, "  preload  %s\n", preload)
	if t.Kind == template.KindImage {
		warm := "from a warm kernel (zygote) of its own where the host has zygotes"
		if t.ColdStart != "" {
			warm = "cold: sessions start a new Python each (" + t.ColdStart + ")"
		}
		fmt.Fprintf(w, "  starts   %s\n", warm)
		for _, n := range t.Neutralised {
			fmt.Fprintf(w, "  unpacked %s\n", n)
		}
	}
	fmt.Fprintf(w, "  created  %s\n", t.Created.Format("2006-01-02 15:04:05 MST"))
	if t.Kind == template.KindImage {
		fmt.Fprintf(w, "  packages %d (the image's Python's)\n", len(t.Packages))
	} else if t.Kind == template.KindSnapshot {
		fmt.Fprintf(w, "  packages the system's (the sandbox's own Python)\n")
	} else {
		fmt.Fprintf(w, "  packages %d (beside the system's)\n", len(t.Packages))
	}
	for i, p := range t.Packages {
		if maxPkgs >= 0 && i >= 20 {
			fmt.Fprintf(w, "    ... and %d more (sandloop template show %s)\n", len(t.Packages)-i, t.Name)
			break
		}
		fmt.Fprintf(w, "    %s==%s\n", p.Name, p.Version)
	}
}

// templateChoice is --template on the verbs that start their own
// sandboxes (run, exec, repl, agent, mcp).
type templateChoice struct {
	name, dir string
	dataDir   *string // the verb's --data-dir, if it has one
}

func (tc *templateChoice) register(f *pflag.FlagSet) {
	f.StringVar(&tc.name, "template", "", "run in this template's environment (sandloop template ls lists them)")
	f.StringVar(&tc.dir, "templates-dir", "", "where templates are kept (default DATA-DIR/templates)")
}

// use returns the chosen template's environment for one session (nil
// without --template). Its sessions start cold: a command's one session
// does not pay for a zygote of its own.
func (tc *templateChoice) use(ctx context.Context) (*session.TemplateUse, error) {
	if tc.name == "" {
		return nil, nil
	}
	dir := tc.dir
	if dir == "" {
		dd := defaultDataDir()
		if tc.dataDir != nil && *tc.dataDir != "" {
			dd = *tc.dataDir
		}
		dir = filepath.Join(dd, "templates")
	}
	if _, err := os.Stat(filepath.Join(dir, "names")); err != nil {
		return nil, usagef("--template %s: no such template in %s (sandloop template ls lists them; sandloop template build %s --pip PKG makes one)", tc.name, dir, tc.name)
	}
	st, err := template.Open(dir)
	if err != nil {
		return nil, usagef("--templates-dir %s: %v", dir, unwrapPathError(err))
	}
	u, err := template.NewPool(st, &template.PoolOptions{MaxWarm: -1}).Use(ctx, tc.name)
	if errors.Is(err, template.ErrNotFound) {
		return nil, usagef("--template %s: no such template in %s (sandloop template ls lists them)", tc.name, dir)
	}
	return u, err
}
