package template

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/sandloop/sandloop/internal/jail"
)

// ImageSpec is what an image template is built from.
type ImageSpec struct {
	// Ref is the image: an OCI layout directory (`podman save --format
	// oci-dir`, `buildah push IMAGE oci:DIR`), an OCI archive (a tar of
	// such a directory: `podman save --format oci-archive`), a `docker
	// save` tarball, or a registry reference (pulled by the host, where a
	// registry is reachable).
	Ref string
	// Python is the interpreter in the image that runs the sandbox's
	// kernel. If empty, /usr/local/bin/python3 or else /usr/bin/python3.
	Python string
	// Preload are the modules its zygote imports. If nil, none.
	Preload []string
	// Env is added to its sessions' environment, after the image's own.
	Env map[string]string
	// Limits are the default limits of its sessions (stored only).
	Limits jail.Limits
	// MaxSize bounds the bytes the image unpacks to (every layer's
	// files, counted as written). If zero, 4 GiB.
	MaxSize int64
	// MaxFiles bounds the entries it unpacks to. If zero, 500,000.
	MaxFiles int
}

// Defaults of ImageSpec's bounds.
const (
	DefaultImageMaxSize  = 4 << 30
	DefaultImageMaxFiles = 500000
)

func (s *ImageSpec) validate() error {
	if strings.TrimSpace(s.Ref) == "" {
		return &ArgumentError{"image", errors.New("empty: give an OCI layout directory, an OCI archive, a docker save tarball or a registry reference")}
	}
	if s.Python != "" && (!filepath.IsAbs(s.Python) || filepath.Clean(s.Python) != s.Python) {
		return &ArgumentError{"python", fmt.Errorf("%q: give the interpreter's absolute, clean path in the image", s.Python)}
	}
	sp := Spec{Preload: s.Preload, Env: s.Env, Pip: []string{"x"}}
	if err := sp.validate(); err != nil {
		return err
	}
	if s.MaxSize < 0 || s.MaxFiles < 0 {
		return &ArgumentError{"max size", errors.New("must not be negative")}
	}
	return nil
}

// ImageSizeError is an image that unpacks past ImageSpec's bounds.
type ImageSizeError struct {
	What  string // "bytes" or "files"
	Limit int64
}

func (e *ImageSizeError) Error() string {
	if e.What == "files" {
		return fmt.Sprintf("image refused: it unpacks to more than %d files and directories", e.Limit)
	}
	return fmt.Sprintf("image refused: it unpacks to more than %d MiB (raise the bound with --max-size if it is meant to)", e.Limit>>20)
}

// DigestError is image content that does not match the digest its
// manifest or index gives.
type DigestError struct {
	What      string
	Want, Got string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("image refused: %s has digest %s, but the image says %s (damaged or tampered with)", e.What, e.Got, e.Want)
}

// source is an image opened for reading.
type source struct {
	img v1.Image
	// desc is the manifest's digest as its index or registry names it
	// (zero for a docker save tarball, whose manifest.json has none).
	desc v1.Hash
	// uncompressedOnly: read layers through Uncompressed (a docker save
	// tarball's layers are stored uncompressed; Compressed would gzip).
	uncompressedOnly bool
	what             string
}

var blobRE = regexp.MustCompile(`^blobs/sha256/[0-9a-f]{64}$`)

// openImage opens ref; an OCI archive is extracted under tmp first (only
// its index, marker and blobs, within maxSize).
func openImage(ctx context.Context, ref, tmp string, maxSize int64) (*source, error) {
	fi, err := os.Stat(ref)
	switch {
	case err == nil && fi.IsDir():
		if _, err := os.Stat(filepath.Join(ref, "index.json")); err != nil {
			return nil, &ArgumentError{"image", fmt.Errorf("%s is a directory but not an OCI layout (no index.json)", ref)}
		}
		return fromLayout(ref, "OCI layout "+ref)
	case err == nil && fi.Mode().IsRegular():
		names, err := tarNames(ref)
		if err != nil {
			return nil, &ArgumentError{"image", fmt.Errorf("%s is not an image archive (a tar): %v", ref, err)}
		}
		if names["index.json"] && names["oci-layout"] {
			dir := filepath.Join(tmp, "layout")
			if err := extractLayout(ref, dir, maxSize); err != nil {
				return nil, err
			}
			return fromLayout(dir, "OCI archive "+ref)
		}
		if names["manifest.json"] {
			img, err := tarball.ImageFromPath(ref, nil)
			if err != nil {
				return nil, &ArgumentError{"image", fmt.Errorf("docker save tarball %s: %v", ref, err)}
			}
			return &source{img: img, uncompressedOnly: true, what: "docker save tarball " + ref}, nil
		}
		return nil, &ArgumentError{"image", fmt.Errorf("%s is a tar but neither an OCI archive (index.json, oci-layout) nor a docker save tarball (manifest.json)", ref)}
	case err == nil:
		return nil, &ArgumentError{"image", fmt.Errorf("%s is neither a directory nor a file", ref)}
	}
	if strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, ".") {
		return nil, &ArgumentError{"image", fmt.Errorf("%s: %v", ref, unwrapPath(err))}
	}
	r, perr := name.ParseReference(ref)
	if perr != nil {
		return nil, &ArgumentError{"image", fmt.Errorf("%s: no such file, and not an image reference: %v", ref, perr)}
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return &source{img: img, desc: d, what: "registry image " + r.Name()}, nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// fromLayout picks the layout's image for this machine (linux and
// GOARCH, or the only image it holds).
func fromLayout(dir, what string) (*source, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, &ArgumentError{"image", fmt.Errorf("%s: %v", what, err)}
	}
	var found []v1.Descriptor
	var walk func(ii v1.ImageIndex, depth int) error
	walk = func(ii v1.ImageIndex, depth int) error {
		im, err := ii.IndexManifest()
		if err != nil {
			return err
		}
		for _, d := range im.Manifests {
			switch {
			case d.MediaType.IsIndex() && depth < 4:
				sub, err := ii.ImageIndex(d.Digest)
				if err != nil {
					return err
				}
				if err := walk(sub, depth+1); err != nil {
					return err
				}
			case d.MediaType.IsImage():
				if d.Platform == nil || (d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH) {
					found = append(found, d)
				}
			}
		}
		return nil
	}
	if err := walk(idx, 0); err != nil {
		return nil, &ArgumentError{"image", fmt.Errorf("%s: %v", what, err)}
	}
	uniq := map[v1.Hash]v1.Descriptor{}
	for _, d := range found {
		uniq[d.Digest] = d
	}
	switch len(uniq) {
	case 0:
		return nil, &ArgumentError{"image", fmt.Errorf("%s holds no image for linux/%s", what, runtime.GOARCH)}
	case 1:
	default:
		return nil, &ArgumentError{"image", fmt.Errorf("%s holds %d images: give a layout with one", what, len(uniq))}
	}
	d := found[0]
	img, err := layout.Path(dir).Image(d.Digest)
	if err != nil {
		return nil, &ArgumentError{"image", fmt.Errorf("%s: %v", what, err)}
	}
	return &source{img: img, desc: d.Digest, what: what}, nil
}

// tarNames lists the names of a tar's entries (without "./").
func tarNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		// An image archive holds a few files per layer: a tar of
		// millions of names is not one (and would fill memory here).
		if len(names) >= 100000 {
			return nil, errors.New("more than 100,000 entries: not an image archive")
		}
		names[strings.TrimPrefix(h.Name, "./")] = true
	}
	if len(names) == 0 {
		return nil, errors.New("empty")
	}
	return names, nil
}

// extractLayout writes an OCI archive's index.json, oci-layout and
// blobs/sha256/<hex> files into dir; no other name is written (so no
// entry's path can lead out of dir), nothing but regular files, and at
// most maxSize bytes in all.
func extractLayout(archive, dir string, maxSize int64) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return err
	}
	var total int64
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &ArgumentError{"image", fmt.Errorf("OCI archive %s: %v", archive, err)}
		}
		n := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag != tar.TypeReg || !(n == "index.json" || n == "oci-layout" || blobRE.MatchString(n)) {
			continue
		}
		if total += h.Size; total > maxSize {
			return &ImageSizeError{"bytes", maxSize}
		}
		out, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(n)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, 0o600)
		if err != nil {
			return &ArgumentError{"image", fmt.Errorf("OCI archive %s: %s: %v", archive, n, unwrapPath(err))}
		}
		_, err = io.CopyN(out, tr, h.Size)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// verifyManifest checks the image's manifest and configuration against
// their digests, and returns its layers with the digests each must have.
func verifyManifest(src *source) ([]v1.Layer, []v1.Hash, *v1.ConfigFile, error) {
	raw, err := src.img.RawManifest()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: manifest: %w", src.what, err)
	}
	if src.desc != (v1.Hash{}) {
		if got := sha256Hash(raw); got != src.desc {
			return nil, nil, nil, &DigestError{"its manifest", src.desc.String(), got.String()}
		}
	}
	m, err := src.img.Manifest()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: manifest: %w", src.what, err)
	}
	rawCfg, err := src.img.RawConfigFile()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: configuration: %w", src.what, err)
	}
	if got := sha256Hash(rawCfg); got != m.Config.Digest {
		return nil, nil, nil, &DigestError{"its configuration", m.Config.Digest.String(), got.String()}
	}
	cfg, err := src.img.ConfigFile()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: configuration: %w", src.what, err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, nil, nil, &ArgumentError{"image", fmt.Errorf("%s is for %s, not linux", src.what, cfg.OS)}
	}
	if cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH {
		return nil, nil, nil, &ArgumentError{"image", fmt.Errorf("%s is for %s, not %s", src.what, cfg.Architecture, runtime.GOARCH)}
	}
	layers, err := src.img.Layers()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: layers: %w", src.what, err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) || len(layers) != len(m.Layers) {
		return nil, nil, nil, &ArgumentError{"image", fmt.Errorf("%s: %d layers, %d diff_ids in its configuration", src.what, len(layers), len(cfg.RootFS.DiffIDs))}
	}
	return layers, cfg.RootFS.DiffIDs, cfg, nil
}

func sha256Hash(b []byte) v1.Hash {
	s := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(s[:])}
}

// verifiedLayer reads one layer's tar stream while hashing it: check,
// once the stream has been read to its end, compares the compressed
// blob's digest with the manifest's and the tar's with the diff_id.
type verifiedLayer struct {
	io.Reader
	close          func()
	raw            io.Reader // the compressed blob, if any
	blob, diff     hash.Hash
	wantBlob, want v1.Hash
	n              int
}

func openLayer(src *source, l v1.Layer, n int, diffID v1.Hash) (*verifiedLayer, error) {
	vl := &verifiedLayer{diff: sha256.New(), want: diffID, n: n}
	if diffID.Algorithm != "sha256" {
		return nil, &ArgumentError{"image", fmt.Errorf("layer %d: diff_id %s is not sha256", n, diffID)}
	}
	if src.uncompressedOnly {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", n, err)
		}
		vl.Reader, vl.close = io.TeeReader(rc, vl.diff), func() { rc.Close() }
		return vl, nil
	}
	d, err := l.Digest()
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", n, err)
	}
	if d.Algorithm != "sha256" {
		return nil, &ArgumentError{"image", fmt.Errorf("layer %d: digest %s is not sha256", n, d)}
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", n, err)
	}
	vl.blob, vl.wantBlob = sha256.New(), d
	br := bufio.NewReader(io.TeeReader(rc, vl.blob))
	vl.raw = br
	magic, _ := br.Peek(4)
	var r io.Reader = br
	closers := []func(){func() { rc.Close() }}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		z, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, &ArgumentError{"image", fmt.Errorf("layer %d: %v", n, err)}
		}
		r = z
	case len(magic) == 4 && string(magic) == "\x28\xb5\x2f\xfd":
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("layer %d: %w", n, err)
		}
		r = z
		closers = append(closers, z.Close)
	}
	vl.Reader = io.TeeReader(r, vl.diff)
	vl.close = func() {
		for _, c := range closers {
			c()
		}
	}
	return vl, nil
}

// blobMismatch reads the rest of the compressed blob (at most limit
// bytes) and reports a *DigestError if it is not the one the manifest
// names: after a layer failed to unpack, the truer error.
func (vl *verifiedLayer) blobMismatch(limit int64) error {
	if vl.raw == nil {
		return nil
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(vl.raw, limit)); err != nil {
		return nil
	}
	if got := hex.EncodeToString(vl.blob.Sum(nil)); got != vl.wantBlob.Hex {
		return &DigestError{fmt.Sprintf("layer %d", vl.n+1), vl.wantBlob.String(), "sha256:" + got}
	}
	return nil
}

// finish reads what the tar reader left (padding, trailing blocks) and
// checks the digests. Reading past the tar is bounded: the rest of a
// blob is at most what its digest covers, and is only hashed.
func (vl *verifiedLayer) finish() error {
	defer vl.close()
	if _, err := io.Copy(io.Discard, io.LimitReader(vl.Reader, 1<<20)); err != nil {
		return fmt.Errorf("layer %d: %w", vl.n, err)
	}
	if vl.raw != nil {
		if _, err := io.Copy(io.Discard, io.LimitReader(vl.raw, 1<<20)); err != nil {
			return fmt.Errorf("layer %d: %w", vl.n, err)
		}
	}
	if vl.blob != nil {
		if got := hex.EncodeToString(vl.blob.Sum(nil)); got != vl.wantBlob.Hex {
			return &DigestError{fmt.Sprintf("layer %d", vl.n+1), vl.wantBlob.String(), "sha256:" + got}
		}
	}
	if got := hex.EncodeToString(vl.diff.Sum(nil)); got != vl.want.Hex {
		return &DigestError{fmt.Sprintf("layer %d (uncompressed)", vl.n+1), vl.want.String(), "sha256:" + got}
	}
	return nil
}
