package template

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
)

// BuildOptions say how a template is built. The zero value builds with
// no way out (only a requirements file of packages already on the
// system would install).
type BuildOptions struct {
	// Egress is what the build's pip may reach (the package index).
	// If nil, nothing: the build has loopback only.
	Egress *egress.Policy
	// Lookup resolves names for the egress gate. If nil, the host's.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// Cache is the server's package cache; pip installs through it when
	// Egress allows its index.
	Cache *egress.Cache
	// Env is added to the build's environment (PIP_INDEX_URL, PIP_CERT...).
	Env []string
	// Files are placed in the build's workspace, /workspace (a CA to
	// trust, for example).
	Files map[string][]byte
	// Limits bound the build's sandbox. Zero fields: 2 GiB of memory, 1
	// GiB of disk for the environment, 100,000 files, 10 minutes.
	Limits jail.Limits
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// buildScript makes the environment at EnvDir and installs into it with
// the system's pip (the environment itself holds no pip), checks the
// preloads import, then prints the manifest's facts.
const buildScript = `
import glob, json, subprocess, sys
env = "/opt/sandloop/env"
def run(step, args):
    print("+ " + " ".join(args), flush=True)
    r = subprocess.run(args)
    if r.returncode != 0:
        print("SANDLOOP-FAILED " + step, flush=True)
        sys.exit(1)
run("make the environment", ["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", env])
spec = json.load(open("/workspace/.sandloop-build.json"))
args = ["/usr/bin/python3", "-m", "pip", "--python", env + "/bin/python3", "install", "--no-input", "--no-cache-dir", "--disable-pip-version-check"]
if spec["requirements"]:
    args += ["-r", "/workspace/requirements.txt"]
if spec["requirements"] or spec["pip"]:
    run("pip install", args + spec["pip"])
if spec["preload"]:
    run("import the preloads", [env + "/bin/python3", "-c", "import " + ", ".join(spec["preload"])])
import importlib.metadata as md
sp = glob.glob(env + "/lib/python3*/site-packages")
out = subprocess.run([env + "/bin/python3", "-c", """
import glob, json, sys, importlib.metadata as md
sp = glob.glob(sys.prefix + "/lib/python3*/site-packages")
pk = sorted({(d.metadata["Name"], d.version) for d in md.distributions(path=sp)})
print(json.dumps({"python": sys.version.split()[0], "prefix": sys.prefix, "packages": pk}))
"""], capture_output=True, text=True)
if out.returncode != 0:
    print(out.stderr)
    print("SANDLOOP-FAILED list the packages", flush=True)
    sys.exit(1)
print("SANDLOOP-MANIFEST " + out.stdout.strip(), flush=True)
`

// Build builds the template name from spec in a sandbox and stores it,
// replacing a template of that name not in use.
//
// The environment is made inside a jail whose only way out is the egress
// gate (BuildOptions.Egress), in a memory-backed directory capped in
// bytes and files; what the build leaves is copied out and frozen on the
// host (freeze): read-only, owned by root, with set-id files and devices
// refused.
func (s *Store) Build(ctx context.Context, name string, spec Spec, o *BuildOptions) (*Template, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	var opts BuildOptions
	if o != nil {
		opts = *o
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := opts.Limits
	if l.Memory == 0 {
		l.Memory = 2 << 30
	}
	if l.Disk == 0 {
		l.Disk = 1 << 30
	}
	if l.Files == 0 {
		l.Files = 100000
	}
	if l.Timeout == 0 {
		l.Timeout = 10 * time.Minute
	}
	if l.Pids == 0 {
		l.Pids = 256
	}
	q, err := jail.NewQuotaDir(l.Disk, l.Files)
	if err != nil {
		return nil, fmt.Errorf("template build: workspace: %w", err)
	}
	defer q.Remove()
	envHost := filepath.Join(q.Path, "env")
	if err := os.Mkdir(envHost, 0o755); err != nil {
		return nil, fmt.Errorf("template build: %w", err)
	}
	js, _ := json.Marshal(map[string]any{"requirements": spec.Requirements != "", "pip": nonNil(spec.Pip), "preload": nonNil(spec.Preload)})
	files := map[string][]byte{".sandloop-build.json": js, "requirements.txt": []byte(spec.Requirements)}
	for k, v := range opts.Files {
		if strings.ContainsAny(k, "/\x00") || k == "env" {
			return nil, &ArgumentError{"build file", fmt.Errorf("%q", k)}
		}
		files[k] = v
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(q.Path, k), v, 0o644); err != nil {
			return nil, fmt.Errorf("template build: %w", err)
		}
	}

	// SOURCE_DATE_EPOCH makes pip's byte-code hash-checked rather than
	// stamped with the install's time: the same packages give the same
	// tree (one id), and the byte-code stays valid once copied out.
	env := []string{"PYTHONDONTWRITEBYTECODE=1", "SOURCE_DATE_EPOCH=315532800"}
	cfg := &jail.Config{
		Path: jail.DefaultPython, Args: []string{"python3", "-c", buildScript},
		Workspace: q.Path, Limits: l,
		Mounts: []jail.Mount{{Host: envHost, Path: EnvDir, Writable: true}},
	}
	var gate *egress.Gate
	if opts.Egress != nil {
		gate = egress.New(&egress.Options{Policy: *opts.Egress, LookupIP: opts.Lookup, Cache: opts.Cache, Logger: log})
		defer gate.Close()
		cfg.ListenPort = egress.Port
		env = append(append(env, egress.Env(egress.Port)...), gate.PipEnv(egress.Port)...)
	}
	cfg.Env = append(env, opts.Env...) // the caller's last: they win
	out := &tailBuffer{max: 64 << 10}
	cfg.Stdout, cfg.Stderr = out, out
	p, err := jail.Start(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("template build: %w", err)
	}
	if gate != nil {
		gate.Serve(p.Listener())
	}
	res, err := p.Wait()
	if err != nil {
		return nil, fmt.Errorf("template build: %w", err)
	}
	text := out.String()
	if res.ExitCode != 0 {
		step := "the build's sandbox ended with status " + fmt.Sprint(res.ExitCode)
		switch {
		case res.TimedOut:
			step = "timed out after " + l.Timeout.String()
		case res.OOMKilled:
			step = fmt.Sprintf("out of memory (%d MiB)", l.Memory>>20)
		default:
			if i := strings.LastIndex(text, "SANDLOOP-FAILED "); i >= 0 {
				step = strings.TrimSpace(strings.SplitN(text[i+len("SANDLOOP-FAILED "):], "\n", 2)[0])
				text = text[:i]
			}
		}
		return nil, &BuildError{Step: step, Output: lastLines(text, 40)}
	}
	i := strings.LastIndex(text, "SANDLOOP-MANIFEST ")
	if i < 0 {
		return nil, fmt.Errorf("template build: no manifest in its output:\n%s", lastLines(text, 20))
	}
	var facts struct {
		Python   string
		Prefix   string
		Packages [][2]string
	}
	if err := json.Unmarshal([]byte(strings.SplitN(text[i+len("SANDLOOP-MANIFEST "):], "\n", 2)[0]), &facts); err != nil || facts.Prefix != EnvDir {
		return nil, fmt.Errorf("template build: its manifest (%v): %s", err, lastLines(text, 5))
	}
	m := &Manifest{Name: name, Python: facts.Python, Preload: spec.Preload, Env: spec.Env, Limits: spec.Limits, Created: time.Now().UTC().Truncate(time.Second)}
	for _, p := range facts.Packages {
		m.Packages = append(m.Packages, Package{Name: p[0], Version: p[1]})
	}
	stage, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "build-")
	if err != nil {
		return nil, err
	}
	if m.ID, m.Size, m.Files, err = freeze(envHost, stage); err != nil {
		removeTree(stage)
		return nil, err
	}
	log.Info("template built", "name", name, "id", m.ID[:12], "size", m.Size, "packages", len(m.Packages))
	return s.install(m, stage)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { t.mu.Lock(); defer t.mu.Unlock(); return t.buf.String() }
