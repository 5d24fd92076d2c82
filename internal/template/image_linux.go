package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/zygote"
)

// ImageBuildOptions say how an image template is built.
type ImageBuildOptions struct {
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
	// NoZygoteCheck skips starting a zygote at build time (the template's
	// sessions then try one on first use, as for any template).
	NoZygoteCheck bool
}

// probeScript prints what the manifest says of the image's Python.
const probeScript = `
import json, sys
try:
    import importlib.metadata as md
    pk = sorted({(d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]})
except Exception:
    pk = []
mods = json.loads(sys.argv[1])
for m in mods:
    __import__(m)
print("SANDLOOP-PROBE " + json.dumps({"python": sys.version.split()[0], "packages": pk}), flush=True)
`

// BuildImage builds the template name from an OCI image and stores it,
// replacing a template of that name not in use.
//
// The image is read with go-containerregistry; its manifest, its
// configuration and each layer (compressed and not) are checked against
// their digests while the layers are unpacked into a staging directory of
// the store (see unpacker for what is refused or neutralised), which is
// discarded whole on any error. Its Python is then run in a sandbox with
// the tree as its root, to learn its version and packages and to check
// the preloads import; a zygote is started on it, and where that fails
// the template is recorded as starting cold (Manifest.ColdStart).
func (s *Store) BuildImage(ctx context.Context, name string, spec ImageSpec, o *ImageBuildOptions) (*Template, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	var opts ImageBuildOptions
	if o != nil {
		opts = *o
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if spec.MaxSize == 0 {
		spec.MaxSize = DefaultImageMaxSize
	}
	if spec.MaxFiles == 0 {
		spec.MaxFiles = DefaultImageMaxFiles
	}
	work, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "image-")
	if err != nil {
		return nil, err
	}
	defer removeTree(work)
	src, err := openImage(ctx, spec.Ref, work, spec.MaxSize)
	if err != nil {
		return nil, err
	}
	layers, diffIDs, cfg, err := verifyManifest(src)
	if err != nil {
		return nil, err
	}
	stage := filepath.Join(work, "tree")
	if err := os.Mkdir(stage, 0o755); err != nil {
		return nil, err
	}
	u, err := newUnpacker(stage, spec.MaxSize, spec.MaxFiles)
	if err != nil {
		return nil, err
	}
	defer u.close()
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		vl, err := openLayer(src, l, i, diffIDs[i])
		if err != nil {
			return nil, err
		}
		err = u.apply(vl, i+1)
		if err == nil {
			err = vl.finish()
		} else {
			// A layer that would not unpack may be a damaged one: say so
			// if its blob (read to its end) is not the one named.
			var se *ImageSizeError
			if n, serr := l.Size(); serr == nil && !errors.As(err, &se) && n <= spec.MaxSize {
				if de := vl.blobMismatch(n); de != nil {
					err = de
				}
			}
			vl.close()
		}
		if err != nil {
			return nil, err
		}
	}
	m := &Manifest{Name: name, Kind: KindImage, Image: spec.Ref, Preload: spec.Preload, Limits: spec.Limits,
		Neutralised: u.neutralised(), Created: time.Now().UTC().Truncate(time.Second), Env: map[string]string{}}
	if src.desc.Hex != "" {
		m.ImageDigest = src.desc.String()
	}
	for _, kv := range cfg.Config.Env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" && !strings.ContainsAny(k, "\x00") && !baseEnv[k] {
			m.Env[k] = v
		}
	}
	for k, v := range spec.Env {
		m.Env[k] = v
	}
	if m.ID, m.Size, m.Files, err = u.seal(stage); err != nil {
		return nil, err
	}
	if m.Interpreter, err = findPython(u.root, spec.Python); err != nil {
		return nil, err
	}
	t := &Template{Manifest: *m, Dir: stage}
	if err := probe(ctx, t); err != nil {
		return nil, err
	}
	m.Python, m.Packages = t.Python, t.Packages
	if !opts.NoZygoteCheck {
		if err := checkZygote(ctx, t); err != nil {
			m.ColdStart = err.Error()
			log.Warn("image template: its Python cannot run a zygote; its sessions start cold", "name", name, "err", err)
		}
	}
	log.Info("image template built", "name", name, "id", m.ID[:12], "size", m.Size, "python", m.Python)
	t, err = s.install(m, stage)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(t.Dir, 0o555); err != nil {
		return nil, err
	}
	return t, nil
}

// baseEnv are the variables the jail sets itself: an image's do not
// replace them.
var baseEnv = map[string]bool{"HOME": true, "USER": true, "LOGNAME": true, "TMPDIR": true, "PWD": true, "HOSTNAME": true}

// findPython finds the interpreter in the tree (links resolved inside
// it): want, or else /usr/local/bin/python3 or /usr/bin/python3.
func findPython(root int, want string) (string, error) {
	cands := []string{"/usr/local/bin/python3", "/usr/bin/python3"}
	if want != "" {
		cands = []string{want}
	}
	for _, c := range cands {
		fd, err := unix.Openat2(root, strings.TrimPrefix(c, "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveFlags()})
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return c, nil
		}
	}
	if want != "" {
		return "", &ArgumentError{"python", fmt.Errorf("the image has no executable %s", want)}
	}
	return "", &ArgumentError{"image", errors.New("it has no python3 (/usr/local/bin/python3 or /usr/bin/python3): install one in the image, or name it with --python")}
}

// probe runs the image's Python in a sandbox with the tree as its root:
// its version and packages, and the preloads imported.
func probe(ctx context.Context, t *Template) error {
	ws, err := jail.NewQuotaDir(16<<20, 1000)
	if err != nil {
		return fmt.Errorf("template build: workspace: %w", err)
	}
	defer ws.Remove()
	mods, _ := json.Marshal(nonNil(t.Preload))
	out := &tailBuffer{max: 64 << 10}
	res, err := jail.Run(ctx, &jail.Config{
		Path: t.Interpreter, Args: []string{"python3", "-c", probeScript, string(mods)},
		Env: append([]string{"PYTHONDONTWRITEBYTECODE=1"}, t.SessionEnv()...), Workspace: ws.Path,
		Mounts: []jail.Mount{t.Mount()}, Stdout: out, Stderr: out,
		Limits: jail.Limits{Timeout: 2 * time.Minute, Memory: 1 << 30},
	})
	if err != nil {
		return fmt.Errorf("template build: run the image's python: %w", err)
	}
	text := out.String()
	i := strings.LastIndex(text, "SANDLOOP-PROBE ")
	if res.ExitCode != 0 || i < 0 {
		return &BuildError{Step: "run the image's " + t.Interpreter, Output: lastLines(text, 20)}
	}
	var facts struct {
		Python   string
		Packages [][2]string
	}
	if err := json.Unmarshal([]byte(strings.SplitN(text[i+len("SANDLOOP-PROBE "):], "\n", 2)[0]), &facts); err != nil {
		return fmt.Errorf("template build: the image's python: %w", err)
	}
	t.Python = facts.Python
	for _, p := range facts.Packages {
		t.Packages = append(t.Packages, Package{Name: p[0], Version: p[1]})
	}
	return nil
}

// checkZygote starts a zygote on the template: its Python runs the
// zygote's program and imports the preloads.
func checkZygote(ctx context.Context, t *Template) error {
	if err := zygote.Supported(); err != nil {
		return nil // no zygotes on this host at all: not the image's fault
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out := &outputHandler{}
	z, err := zygote.New(ctx, &zygote.Options{Modules: t.Modules(), Env: append(session.KernelEnv(), t.SessionEnv()...),
		Python: t.PythonPath(), Mounts: []jail.Mount{t.Mount()}, Logger: slog.New(out)})
	if err != nil {
		// What the image's Python said (its last line: the exception)
		// tells the user more than how the zygote's pipe ended.
		if last := lastLines(strings.TrimSpace(out.text.String()), 1); last != "" {
			return fmt.Errorf("its Python cannot run sandloop's zygote: %s", last)
		}
		return fmt.Errorf("its Python cannot run sandloop's zygote: %v", firstLine(err.Error()))
	}
	z.Close()
	return nil
}

// outputHandler keeps what a zygote's Python printed (its log records'
// "text").
type outputHandler struct {
	mu   sync.Mutex
	text bytes.Buffer
}

func (h *outputHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *outputHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *outputHandler) WithGroup(string) slog.Handler            { return h }
func (h *outputHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "text" && h.text.Len() < 64<<10 {
			h.mu.Lock()
			h.text.WriteString(a.Value.String())
			h.text.WriteString("\n")
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
