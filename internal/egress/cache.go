package egress

import (
	"cmp"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// CacheOptions configure a Cache.
type CacheOptions struct {
	// Dir holds the cached files (made, mode 0700, if missing). Only the
	// host writes in it; no sandbox mounts it.
	Dir string
	// MaxBytes caps the files' total size: the least recently used are
	// removed to stay under it. If zero, 2 GiB.
	MaxBytes int64
	// Index is the PEP 503 "simple" index the cache mirrors for pip, an
	// absolute http(s) URL ending in "/". If empty, DefaultIndex().
	Index string
	// RootCAs verify the index's and its file hosts' certificates. If
	// nil, the host's roots. (Tests trust their own CA.)
	RootCAs *x509.CertPool
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// DefaultIndex is the simple index of the pypi preset.
func DefaultIndex() string { return "https://" + Presets["pypi"][0] + "/simple/" }

// DefaultCacheBytes is a Cache's size cap when none is given.
const DefaultCacheBytes = 2 << 30

// Cache is the host's store of package files (wheels and sdists) shared by
// the sessions of a server, and the PEP 503 index it mirrors for them.
//
// A file is stored under the SHA-256 of its bytes, computed here from the
// upstream response this process fetched itself, and only when it equals
// the sha256 its index page gave for it: sandboxes can ask for files but
// never supply them, so one session cannot plant a file another session
// gets. A file is served only to a session whose allowlist covers the host
// it came from. Only package files (named *.whl, *.tar.gz, *.zip, ...)
// with a sha256 in their index link are cached; index pages never are.
// Its methods are safe for concurrent use, and several processes may share
// a directory (files are written to a temporary name and renamed).
type Cache struct {
	dir   string
	index *url.URL
	max   int64
	roots *x509.CertPool
	log   *slog.Logger

	mu    sync.Mutex
	files map[string]*cachedFile // by sha256 (hex)
	size  int64

	hits, misses, evictions atomic.Int64
}

type cachedFile struct {
	size int64
	used time.Time
}

// OpenCache opens (or makes) a cache in opts.Dir and removes the least
// recently used files above its cap.
func OpenCache(o *CacheOptions) (*Cache, error) {
	opts := *cmp.Or(o, &CacheOptions{}) // nil: every default
	if opts.Dir == "" {
		return nil, errors.New("wheel cache: no directory given")
	}
	if opts.MaxBytes < 0 {
		return nil, errors.New("wheel cache: the size must not be negative")
	}
	index, err := parseIndexURL(cmp.Or(opts.Index, DefaultIndex()))
	if err != nil {
		return nil, err
	}
	c := &Cache{dir: opts.Dir, index: index, max: cmp.Or(opts.MaxBytes, DefaultCacheBytes), roots: opts.RootCAs,
		log: opts.Logger, files: map[string]*cachedFile{}}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{c.dir, filepath.Join(c.dir, "files"), filepath.Join(c.dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("wheel cache: %w", err)
		}
	}
	if err := os.Chmod(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("wheel cache: %w", err)
	}
	// Downloads a killed process left half done.
	if tmp, err := os.ReadDir(filepath.Join(c.dir, "tmp")); err == nil {
		for _, e := range tmp {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				os.Remove(filepath.Join(c.dir, "tmp", e.Name()))
			}
		}
	}
	paths, _ := filepath.Glob(filepath.Join(c.dir, "files", "??", "*"))
	for _, p := range paths {
		sum := filepath.Base(p)
		fi, err := os.Stat(p)
		if err != nil || !validSum(sum) || filepath.Base(filepath.Dir(p)) != sum[:2] || !fi.Mode().IsRegular() {
			continue
		}
		c.files[sum] = &cachedFile{size: fi.Size(), used: fi.ModTime()}
		c.size += fi.Size()
	}
	c.mu.Lock()
	victims := c.evictLocked("")
	c.mu.Unlock()
	c.remove(victims)
	return c, nil
}

func parseIndexURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("package index %q: must be an http(s) URL like https://host/simple/", s)
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u, nil
}

// validSum reports whether s is a SHA-256 in lower-case hex.
func validSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// packageExts are the file names the cache keeps: distributions.
var packageExts = []string{".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz"}

func isPackageFile(name string) bool {
	return slices.ContainsFunc(packageExts, func(ext string) bool { return len(name) > len(ext) && strings.HasSuffix(name, ext) })
}

func (c *Cache) path(sum string) string { return filepath.Join(c.dir, "files", sum[:2], sum) }

// Index is the upstream index the cache mirrors.
func (c *Cache) Index() string { return c.index.String() }

// get opens the cached file whose SHA-256 is sum and marks it used.
func (c *Cache) get(sum string) (*os.File, int64, bool) {
	c.mu.Lock()
	e, ok := c.files[sum]
	c.mu.Unlock()
	if !ok {
		return nil, 0, false
	}
	f, err := os.Open(c.path(sum))
	if err != nil { // removed by another process sharing the directory
		c.mu.Lock()
		if c.files[sum] == e {
			delete(c.files, sum)
			c.size -= e.size
		}
		c.mu.Unlock()
		return nil, 0, false
	}
	now := time.Now()
	c.mu.Lock()
	e.used = now
	c.mu.Unlock()
	os.Chtimes(c.path(sum), now, now) // the order of use survives a restart
	c.hits.Add(1)
	return f, e.size, true
}

// HashError is a download whose bytes are not those its index promised.
type HashError struct {
	URL       string
	Want, Got string
}

func (e *HashError) Error() string {
	return fmt.Sprintf("the file at %s does not match the sha256 its index gave (expected %s, got %s); it was not cached", e.URL, e.Want, e.Got)
}

// errTooLarge is a download above what the session may still receive.
var errTooLarge = errors.New("too large")

// put reads r (at most limit bytes, else errTooLarge) and, if its SHA-256
// is sum, stores it; it returns the file open at its start (removed
// already if it alone is larger than the cache's cap). src names r in a
// HashError.
func (c *Cache) put(sum, src string, r io.Reader, limit int64) (*os.File, int64, error) {
	c.misses.Add(1)
	tmp, err := os.CreateTemp(filepath.Join(c.dir, "tmp"), "download-")
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) (*os.File, int64, error) {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, limit+1))
	if err != nil {
		return fail(err)
	}
	if n > limit {
		return fail(errTooLarge)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fail(&HashError{URL: src, Want: sum, Got: got})
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	if n > c.max { // served once, never kept
		os.Remove(tmp.Name())
		return tmp, n, nil
	}
	final := c.path(sum)
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fail(err)
	}
	c.mu.Lock()
	if old, ok := c.files[sum]; ok {
		c.size -= old.size
	}
	c.files[sum] = &cachedFile{size: n, used: time.Now()}
	c.size += n
	victims := c.evictLocked(sum)
	c.mu.Unlock()
	c.remove(victims)
	c.log.Debug("wheel cache: stored", "sha256", sum, "bytes", n, "from", src)
	return tmp, n, nil
}

// evictLocked drops the least recently used files (never keep) until the
// total is within the cap, and returns their sums.
func (c *Cache) evictLocked(keep string) []string {
	if c.size <= c.max {
		return nil
	}
	sums := make([]string, 0, len(c.files))
	for s := range c.files {
		if s != keep {
			sums = append(sums, s)
		}
	}
	slices.SortFunc(sums, func(a, b string) int { return c.files[a].used.Compare(c.files[b].used) })
	var victims []string
	for _, s := range sums {
		if c.size <= c.max {
			break
		}
		c.size -= c.files[s].size
		delete(c.files, s)
		victims = append(victims, s)
	}
	return victims
}

// remove deletes evicted files (a reader that has one open keeps reading it).
func (c *Cache) remove(sums []string) {
	for _, s := range sums {
		os.Remove(c.path(s))
		c.evictions.Add(1)
	}
}

// CacheStats describe a Cache.
type CacheStats struct {
	Dir       string `json:"dir"`
	Index     string `json:"index"`
	Files     int    `json:"files"`
	Bytes     int64  `json:"bytes"`
	MaxBytes  int64  `json:"max_bytes"`
	Hits      int64  `json:"hits"`
	Misses    int64  `json:"misses"`
	Evictions int64  `json:"evictions"`
}

// Stats reports the cache's contents and counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Dir: c.dir, Index: c.index.String(), Files: len(c.files), Bytes: c.size, MaxBytes: c.max,
		Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}
