package template_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/template"
	"github.com/sandloop/sandloop/internal/zygote"
)

// The marker only the image has, and its text.
const (
	imageMarker     = "/usr/share/sandloop-image/marker.txt"
	imageMarkerText = "from the image"
)

// miniRoot is a tar of a minimal root made here: the host's python3 with
// the libraries it and its extension modules load, its standard library,
// a marker file, and entries a malicious image would carry (a set-user-id
// file, device nodes, links aimed at the host through the jail's own
// build directories).
var miniRoot struct {
	once sync.Once
	path string
	err  error
}

func miniRootTar(t *testing.T) string {
	t.Helper()
	miniRoot.once.Do(func() {
		dir, err := makeTempDir()
		if err != nil {
			miniRoot.err = err
			return
		}
		miniRoot.path = filepath.Join(dir, "root.tar")
		miniRoot.err = writeMiniRoot(miniRoot.path)
	})
	if miniRoot.err != nil {
		t.Fatal(miniRoot.err)
	}
	return miniRoot.path
}

func writeMiniRoot(out string) error {
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		return err
	}
	stdlib := filepath.Join("/usr/lib", filepath.Base(py))
	files := map[string]bool{py: true, "/usr/bin/python3": true, "/etc/ld.so.cache": true}
	bins := []string{py}
	skip := map[string]bool{"idlelib": true, "tkinter": true, "turtledemo": true, "pydoc_data": true, "lib2to3": true, "ensurepip": true, "test": true}
	err = filepath.WalkDir(stdlib, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (skip[d.Name()] || strings.HasPrefix(d.Name(), "config-")) {
			return filepath.SkipDir
		}
		files[p] = true
		if strings.HasSuffix(p, ".so") {
			bins = append(bins, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, b := range bins {
		o, err := exec.Command("ldd", b).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(o), "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					files[f] = true
					if real, err := filepath.EvalSymlinks(f); err == nil {
						files[real] = true
					}
				}
			}
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	dirs := map[string]bool{}
	var mkdirs func(string) error
	mkdirs = func(d string) error {
		if d == "." || d == "/" || dirs[d] {
			return nil
		}
		if err := mkdirs(filepath.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(d, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	// The host's top-level links (merged /usr) as they are.
	for _, l := range []string{"/bin", "/lib", "/lib64", "/sbin"} {
		if target, err := os.Readlink(l); err == nil {
			tw.WriteHeader(&tar.Header{Name: l[1:], Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
		}
	}
	var names []string
	for p := range files {
		// Paths under the top-level links go in under their real directory.
		if real, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
			p = filepath.Join(real, filepath.Base(p))
		}
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		fi, err := os.Lstat(p)
		if err != nil || dirs[p] {
			continue
		}
		if err := mkdirs(filepath.Dir(p)); err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = p[1:], 0, 0, "", ""
		switch {
		case fi.IsDir():
			dirs[p] = true
			h.Name += "/"
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case fi.Mode()&os.ModeSymlink != 0:
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, in)
			in.Close()
			if err != nil {
				return err
			}
		}
	}
	extra := []*tar.Header{
		{Name: "usr/share/sandloop-image/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: imageMarker[1:], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(imageMarkerText))},
		// What a malicious image carries.
		{Name: "usr/bin/su-evil", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2},
		{Name: "usr/share/sandloop-image/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8},
		{Name: "usr/share/sandloop-image/mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1},
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		// The jail's init builds the root with the host's under /oldroot:
		// links that would reach it there, were they followed as paths.
		{Name: "etc/mime.types", Typeflag: tar.TypeSymlink, Linkname: "/oldroot/etc/hostname", Mode: 0o777},
		{Name: "etc/ssl/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/ssl/certs", Typeflag: tar.TypeSymlink, Linkname: "../../../../../oldroot/etc", Mode: 0o777},
		{Name: "etc/python3", Typeflag: tar.TypeSymlink, Linkname: "/oldroot/etc", Mode: 0o777},
	}
	bodies := map[string]string{imageMarker[1:]: imageMarkerText, "usr/bin/su-evil": "#!"}
	for _, h := range extra {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		io.WriteString(tw, bodies[h.Name])
	}
	return tw.Close()
}

// writeLayout writes an OCI layout of one layer (the tar at root) with
// go-containerregistry, as podman's oci-dir would.
func imageOf(t *testing.T, root string) v1.Image {
	t.Helper()
	layer, err := tarball.LayerFromFile(root, tarball.WithCompressionLevel(1))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR=set by the image", "HOME=/root"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// imageTemplate is the "mini" template, built once for the tests below.
var imageTmpl struct {
	once  sync.Once
	store *template.Store
	err   error
}

func imageStore(t *testing.T) *template.Store {
	t.Helper()
	root := miniRootTar(t)
	imageTmpl.once.Do(func() {
		dir, err := makeTempDir()
		if err != nil {
			imageTmpl.err = err
			return
		}
		if imageTmpl.store, imageTmpl.err = template.Open(dir); imageTmpl.err != nil {
			return
		}
		ref := writeLayout(t, imageOf(t, root))
		_, imageTmpl.err = imageTmpl.store.BuildImage(context.Background(), "mini", template.ImageSpec{Ref: ref, Env: map[string]string{"TMPL_VAR": "set by the template"}}, nil)
	})
	if imageTmpl.err != nil {
		t.Fatal(imageTmpl.err)
	}
	return imageTmpl.store
}

func TestImageTemplateManifest(t *testing.T) {
	st := imageStore(t)
	tm, err := st.Get("mini")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Kind != template.KindImage || tm.Interpreter != "/usr/bin/python3" || !strings.HasPrefix(tm.ImageDigest, "sha256:") {
		t.Errorf("manifest: kind %q interpreter %q digest %q", tm.Kind, tm.Interpreter, tm.ImageDigest)
	}
	want, _ := exec.Command("/usr/bin/python3", "-c", "import sys; print(sys.version.split()[0])").Output()
	if tm.Python != strings.TrimSpace(string(want)) {
		t.Errorf("python %q, want the host's %q", tm.Python, want)
	}
	got := strings.Join(tm.Neutralised, "; ")
	for _, w := range []string{"1 set-user-id", "2 device node"} {
		if !strings.Contains(got, w) {
			t.Errorf("neutralised = %q, want %q", got, w)
		}
	}
	if tm.Env["IMAGE_VAR"] != "set by the image" || tm.Env["TMPL_VAR"] != "set by the template" || tm.Env["HOME"] != "" {
		t.Errorf("env = %v", tm.Env)
	}
	if zygote.Supported() == nil && tm.ColdStart != "" {
		t.Errorf("the host's python3 could not run a zygote: %s", tm.ColdStart)
	}
	fi, err := os.Stat(tm.Dir)
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("tree %s: %v %v, want read-only", tm.Dir, fi.Mode(), err)
	}
}

// redTeam runs in a session of the image template: the root is the
// image's, read-only, with no set-id program, no device but the jail's,
// and none of the image's links reaching the host.
const redTeam = `
import os, sys, stat
print("MARKER", open(%q).read())
print("HOST-ONLY", os.path.exists("/usr/bin/apt"), os.path.exists("/usr/lib/python3/dist-packages"))
print("ENV", os.environ.get("IMAGE_VAR"), "|", os.environ.get("TMPL_VAR"), "|", os.environ["HOME"])
st = os.stat("/usr/bin/su-evil")
print("SETID", bool(st.st_mode & (stat.S_ISUID | stat.S_ISGID)))
status = open("/proc/self/status").read()
print("NNP", [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")][0],
      "CAPEFF", [l.split()[1] for l in status.splitlines() if l.startswith("CapEff")][0], "UID", os.geteuid(),
      "SECCOMP", [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp:")][0])
print("DEVICES-IN-IMAGE", sorted(os.listdir("/usr/share/sandloop-image")))
print("DEV", sorted(os.listdir("/dev")))
try:
    os.mknod("/tmp/sda", stat.S_IFBLK | 0o600, os.makedev(8, 0)); print("MKNOD-OK")
except OSError as e:
    print("MKNOD-REFUSED")
for p in ("/usr/bin/new", %q, "/etc/new", "/new"):
    try:
        open(p, "a").write("x"); print("WROTE", p)
    except OSError as e:
        print("RO", p, type(e).__name__)
for p in ("/etc/mime.types", "/etc/ssl/certs/hostname", "/etc/python3/hostname", "/oldroot"):
    print("LEAK?", p, os.path.exists(p))
print("ROOTFLAGS", [l.split()[3].split(",")[0] for l in open("/proc/self/mounts") if l.split()[1] == "/"])
`

func TestImageTemplateSession(t *testing.T) {
	st := imageStore(t)
	for _, mode := range []string{"cold", "forked"} {
		t.Run(mode, func(t *testing.T) {
			opts := &template.PoolOptions{MaxWarm: -1}
			if mode == "forked" {
				if err := zygote.Supported(); err != nil {
					t.Skip(err)
				}
				opts = nil
			}
			pool := template.NewPool(st, opts)
			t.Cleanup(pool.Close)
			if mode == "forked" {
				if err := pool.Warm(context.Background(), []string{"mini"}); err != nil {
					t.Fatal(err)
				}
			}
			m := session.NewManager(&session.ManagerOptions{Templates: pool})
			t.Cleanup(func() { m.Close() })
			s, err := m.Create(context.Background(), session.CreateOptions{Template: "mini"})
			if err != nil {
				t.Fatal(err)
			}
			r := execute(t, s, strings.Replace(strings.Replace(redTeam, "%q", `"`+imageMarker+`"`, 1), "%q", `"`+imageMarker+`"`, 1))
			out := r.Stdout
			if r.Status != "ok" {
				t.Fatalf("status %s: %s %s %v", r.Status, r.Stdout, r.Stderr, r.Error)
			}
			for _, want := range []string{
				"MARKER " + imageMarkerText,
				"HOST-ONLY False False",
				"ENV set by the image | set by the template | /workspace",
				"SETID False",
				"NNP 1 CAPEFF 0000000000000000 UID 1000 SECCOMP 2",
				"DEVICES-IN-IMAGE ['marker.txt']",
				"MKNOD-REFUSED",
				"RO /usr/bin/new", "RO " + imageMarker, "RO /etc/new", "RO /new",
				"LEAK? /etc/mime.types False", "LEAK? /etc/ssl/certs/hostname False", "LEAK? /etc/python3/hostname False", "LEAK? /oldroot False",
				"ROOTFLAGS ['ro']",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("missing %q in:\n%s", want, out)
				}
			}
			if strings.Contains(out, "WROTE") || strings.Contains(out, "MKNOD-OK") {
				t.Errorf("a write or mknod succeeded:\n%s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "DEV ") && (strings.Contains(line, "sda") || strings.Contains(line, "mem")) {
					t.Errorf("a device beyond the jail's: %s", line)
				}
			}
		})
	}
}

func TestImageTemplateRemoveInUse(t *testing.T) {
	st := imageStore(t)
	pool := template.NewPool(st, &template.PoolOptions{MaxWarm: -1})
	t.Cleanup(pool.Close)
	u, err := pool.Use(context.Background(), "mini")
	if err != nil {
		t.Fatal(err)
	}
	var inUse *template.InUseError
	if err := pool.Remove("mini"); !errors.As(err, &inUse) {
		t.Fatalf("remove while in use: %v, want an InUseError", err)
	}
	u.Release()
	if _, err := st.Get("mini"); err != nil {
		t.Fatalf("the template went: %v", err)
	}
}

func TestImageFormats(t *testing.T) {
	root := miniRootTar(t)
	img := imageOf(t, root)
	dir := t.TempDir()
	layoutDir := writeLayout(t, img)
	// An OCI archive: a tar of the layout, as podman save --format oci-archive.
	archive := filepath.Join(dir, "image.oci.tar")
	if out, err := exec.Command("tar", "-C", layoutDir, "-cf", archive, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	docker := filepath.Join(dir, "image.docker.tar")
	if err := tarball.WriteToFile(docker, mustTag(t), img); err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ref := range []string{layoutDir, archive, docker} {
		tm, err := st.BuildImage(context.Background(), "f", template.ImageSpec{Ref: ref}, &template.ImageBuildOptions{NoZygoteCheck: true})
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		out, code := runIn(t, tm, `import os; print(open("`+imageMarker+`").read(), os.path.exists("/usr/bin/apt"))`)
		if code != 0 || !strings.Contains(out, imageMarkerText+" False") {
			t.Fatalf("%s: %d %s", ref, code, out)
		}
		ids = append(ids, tm.ID)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Errorf("one image in three forms gave trees %v", ids)
	}
	trees, _ := os.ReadDir(filepath.Join(dir, "store", "trees"))
	if len(trees) != 1 {
		t.Errorf("%d trees in the store, want 1 (content-addressed)", len(trees))
	}
}

func TestImageDigestsChecked(t *testing.T) {
	root := miniRootTar(t)
	img := imageOf(t, root)
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A layer blob changed after the manifest named it.
	dir := writeLayout(t, img)
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	blob := filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(blob, 0o644)
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = st.BuildImage(context.Background(), "bad", template.ImageSpec{Ref: dir}, nil)
	var de *template.DigestError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "layer 1") {
		t.Fatalf("a changed layer: %v, want a DigestError", err)
	}
	// The configuration changed (a diff_id swapped).
	dir = writeLayout(t, img)
	m, _ := img.Manifest()
	cfg := filepath.Join(dir, "blobs", "sha256", m.Config.Digest.Hex)
	c, _ := os.ReadFile(cfg)
	os.Chmod(cfg, 0o644)
	os.WriteFile(cfg, []byte(strings.Replace(string(c), `"IMAGE_VAR=`, `"IMAGE_VAX=`, 1)), 0o644)
	_, err = st.BuildImage(context.Background(), "bad", template.ImageSpec{Ref: dir}, nil)
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "configuration") {
		t.Fatalf("a changed configuration: %v, want a DigestError", err)
	}
	if _, err := st.Get("bad"); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("a refused image was stored: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(st.Dir(), "tmp"))
	if len(ents) != 0 {
		t.Errorf("a refused build left %d entries in the store's tmp", len(ents))
	}
}

func TestImageTooBig(t *testing.T) {
	root := miniRootTar(t)
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.BuildImage(context.Background(), "big", template.ImageSpec{Ref: writeLayout(t, imageOf(t, root)), MaxSize: 4 << 20}, nil)
	var se *template.ImageSizeError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "more than 4 MiB") {
		t.Fatalf("err = %v, want an ImageSizeError", err)
	}
}

func mustTag(t *testing.T) name.Tag {
	tag, err := name.NewTag("mini:1")
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// TestImageTemplateColdStart: an image whose Python cannot run a zygote
// (a second layer whites out ctypes, which the zygote needs and the
// kernel does not) is kept, says so, and its sessions start cold.
func TestImageTemplateColdStart(t *testing.T) {
	if err := zygote.Supported(); err != nil {
		t.Skip(err)
	}
	root := miniRootTar(t)
	so, err := filepath.Glob("/usr/lib/python3*/lib-dynload/_ctypes.cpython-*.so")
	if err != nil || len(so) != 1 {
		t.Skipf("no _ctypes extension module to white out: %v", so)
	}
	py, _ := filepath.EvalSymlinks("/usr/bin/python3")
	so[0] = filepath.Join("/usr/lib", filepath.Base(py), "lib-dynload", filepath.Base(so[0]))
	wh := filepath.Join(t.TempDir(), "whiteout.tar")
	f, err := os.Create(wh)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(filepath.Join(filepath.Dir(so[0]), ".wh."+filepath.Base(so[0])), "/"), Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	f.Close()
	layer, err := tarball.LayerFromFile(wh)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(imageOf(t, root), layer)
	if err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := st.BuildImage(context.Background(), "noctypes", template.ImageSpec{Ref: writeLayout(t, img)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tm.ColdStart, "No module named '_ctypes'") {
		t.Fatalf("cold start %q, want the Python's own words (no _ctypes)", tm.ColdStart)
	}
	t.Logf("cold start: %s", tm.ColdStart)
	pool := template.NewPool(st, nil)
	t.Cleanup(pool.Close)
	if err := pool.Warm(context.Background(), []string{"noctypes"}); err == nil || !strings.Contains(err.Error(), "starts cold") {
		t.Errorf("Warm = %v, want an error saying it starts cold", err)
	}
	m := session.NewManager(&session.ManagerOptions{Templates: pool})
	t.Cleanup(func() { m.Close() })
	s, err := m.Create(context.Background(), session.CreateOptions{Template: "noctypes"})
	if err != nil {
		t.Fatal(err)
	}
	r := execute(t, s, "import importlib.util; print('ctypes', importlib.util.find_spec('_ctypes'))")
	if r.Status != "ok" || !strings.Contains(r.Stdout, "ctypes None") {
		t.Fatalf("%s: %s %s %v", r.Status, r.Stdout, r.Stderr, r.Error)
	}
	if len(pool.WarmNames()) != 0 {
		t.Errorf("a zygote was started for it: %v", pool.WarmNames())
	}
}

// TestImageFromRegistry pulls the image from a registry: go-containerregistry's
// own registry server on loopback (this machine reaches no other).
func TestImageFromRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/mini:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, imageOf(t, miniRootTar(t))); err != nil {
		t.Fatal(err)
	}
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tm, err := st.BuildImage(context.Background(), "pulled", template.ImageSpec{Ref: ref.String()}, &template.ImageBuildOptions{NoZygoteCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tm.ImageDigest, "sha256:") {
		t.Errorf("digest %q", tm.ImageDigest)
	}
	out, code := runIn(t, tm, `print(open("`+imageMarker+`").read())`)
	if code != 0 || !strings.Contains(out, imageMarkerText) {
		t.Fatalf("%d %s", code, out)
	}
	// An unknown tag is an error that names it.
	_, err = st.BuildImage(context.Background(), "nope", template.ImageSpec{Ref: strings.TrimPrefix(srv.URL, "http://") + "/mini:2"}, nil)
	if err == nil || !strings.Contains(err.Error(), "mini:2") {
		t.Errorf("unknown tag: %v", err)
	}
}

// TestImagePythonFlag: --python names the image's interpreter, recorded
// and run; one the image lacks is refused before anything is stored.
func TestImagePythonFlag(t *testing.T) {
	ref := writeLayout(t, imageOf(t, miniRootTar(t)))
	st, err := template.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	py, _ := filepath.EvalSymlinks("/usr/bin/python3")
	tm, err := st.BuildImage(context.Background(), "named", template.ImageSpec{Ref: ref, Python: py}, &template.ImageBuildOptions{NoZygoteCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	if tm.Interpreter != py || tm.PythonPath() != py {
		t.Errorf("interpreter %q, want %q", tm.Interpreter, py)
	}
	if out, code := runIn(t, tm, "import os; print(os.readlink(\"/proc/self/exe\"))"); code != 0 || strings.TrimSpace(out) != py {
		t.Errorf("%d %q, want %s", code, out, py)
	}
	_, err = st.BuildImage(context.Background(), "missing", template.ImageSpec{Ref: ref, Python: "/opt/conda/bin/python3"}, nil)
	var ae *template.ArgumentError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "no executable /opt/conda/bin/python3") {
		t.Errorf("err = %v, want an ArgumentError naming the path", err)
	}
	if _, err := st.Get("missing"); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("stored anyway: %v", err)
	}
}
