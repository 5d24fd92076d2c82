package snapshot

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Backend is where a Store keeps its objects: a flat key space of small
// objects (a compressed chunk is at most 2 MiB, a manifest a few MiB).
// Keys are ASCII paths ("blobs/ab/abcd…", "manifests/…/snap-….json").
type Backend interface {
	// Put stores data under key, atomically: a reader sees the whole new
	// object or, if Put fails or the process dies, whatever was there
	// before (nothing, for a new key). Never a part.
	Put(ctx context.Context, key string, data []byte) error
	// Get returns the object, or an error wrapping fs.ErrNotExist.
	// maxBytes bounds what is read: a larger object is an error.
	Get(ctx context.Context, key string, maxBytes int64) ([]byte, error)
	// Stat describes the object, or returns an error wrapping fs.ErrNotExist.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Delete removes the object; a missing one is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn for every object whose key starts with prefix.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
}

// A Backend that also has Sync(ctx) error may leave blobs ("blobs/…"
// keys) not yet durable after Put; the Store calls Sync before it puts a
// manifest.

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Dir is the directory backend: one file per object under a directory
// (by default <data-dir>/snapshots). It needs only POSIX rename to be
// atomic, so it works on a local disk and on a shared ReadWriteMany volume
// (NFS, CephFS) mounted by every host of a cell.
type Dir struct {
	dir string
}

// NewDir opens (creating it) the directory backend at dir.
func NewDir(dir string) (*Dir, error) {
	for _, sub := range []string{"", "blobs", "manifests", "locks", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("snapshot directory: %w", err)
		}
	}
	return &Dir{dir: dir}, nil
}

func (d *Dir) path(key string) (string, error) {
	if key == "" || strings.Contains(key, "..") || strings.HasPrefix(key, "/") || strings.ContainsRune(key, 0) {
		return "", fmt.Errorf("snapshot storage: bad key %q", key)
	}
	return filepath.Join(d.dir, filepath.FromSlash(key)), nil
}

// Put writes a temporary file and renames it over key: a crash leaves the
// old object or the new one, and the temporary file (in tmp/, removed by
// Collect). Manifests and locks are synced (file and directory) before
// Put returns; blobs are not, one by one: Sync flushes them all at once
// before a Write puts its manifest (700 small blobs synced one by one
// took seconds).
func (d *Dir) Put(ctx context.Context, key string, data []byte) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tmp := filepath.Join(d.dir, "tmp", rand.Text())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot storage: %w", err)
	}
	blob := strings.HasPrefix(key, "blobs/")
	_, err = f.Write(data)
	if err == nil && !blob {
		err = f.Sync()
	}
	if err == nil && blob {
		startWriteback(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.MkdirAll(filepath.Dir(p), 0o700)
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("snapshot storage: put %s: %w", key, err)
	}
	if !blob {
		if df, err := os.Open(filepath.Dir(p)); err == nil {
			df.Sync()
			df.Close()
		}
	}
	return nil
}

// Sync makes every object put so far durable (the blobs Put left to it).
func (d *Dir) Sync(ctx context.Context) error {
	if err := syncFS(d.dir); err != nil {
		return fmt.Errorf("snapshot storage: sync %s: %w", d.dir, err)
	}
	return nil
}

func (d *Dir) Get(ctx context.Context, key string, maxBytes int64) ([]byte, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("snapshot storage: get %s: %w", key, err)
	}
	if fi.Size() > maxBytes {
		return nil, fmt.Errorf("snapshot storage: %s is %d bytes, more than the %d expected", key, fi.Size(), maxBytes)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("snapshot storage: get %s: %w", key, err)
	}
	return b, nil
}

func (d *Dir) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("snapshot storage: stat %s: %w", key, err)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot storage: delete %s: %w", key, err)
	}
	return nil
}

func (d *Dir) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	// Walk the deepest directory that the prefix names entirely.
	base := prefix[:strings.LastIndex(prefix, "/")+1]
	root := filepath.Join(d.dir, filepath.FromSlash(base))
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if de.IsDir() || !de.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		return fn(ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("snapshot storage: list %s: %w", prefix, err)
	}
	return nil
}

// cleanTmp removes temporary files left by a crashed Put, older than age.
func (d *Dir) cleanTmp(age time.Duration) {
	des, _ := os.ReadDir(filepath.Join(d.dir, "tmp"))
	for _, de := range des {
		if fi, err := de.Info(); err == nil && time.Since(fi.ModTime()) > age {
			os.Remove(filepath.Join(d.dir, "tmp", de.Name()))
		}
	}
}
