package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/zygote"
)

// PoolOptions configure a Pool.
type PoolOptions struct {
	// MaxWarm bounds the templates' zygotes kept at once (each holds a
	// Python with its preloads, tens to hundreds of MiB); the least
	// recently used idle one is closed to make room, and where none is
	// idle a new template's sessions start cold. If zero, 4; negative:
	// no zygotes (every template session starts cold).
	MaxWarm int
	// Spares is each zygote's spares (zygote.Options.Spares). If zero, 1.
	Spares int
	// Limits bound each zygote's own jail. If zero, zygote's defaults.
	Limits jail.Limits
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Pool hands templates to sessions (it is a session.Templates), each
// template with a zygote of its own, started on its first use and kept
// while used. Its methods are safe for concurrent use.
type Pool struct {
	store *Store
	opts  PoolOptions
	log   *slog.Logger

	mu     sync.Mutex
	warm   map[string]*warmZygote // by zygoteKey
	states map[string]*os.File    // sealed state files, by sha256 (seedOf)
	closed bool
	wg     sync.WaitGroup
}

// warmZygote is a template's zygote: starting (ready open), or ready
// (z set, or err if it could not start).
type warmZygote struct {
	name     string
	ready    chan struct{}
	z        *zygote.Zygote
	err      error
	users    int
	lastUsed time.Time
}

// NewPool returns a pool of store's templates.
func NewPool(store *Store, o *PoolOptions) *Pool {
	p := &Pool{store: store, warm: map[string]*warmZygote{}, states: map[string]*os.File{}}
	if o != nil {
		p.opts = *o
	}
	if p.opts.MaxWarm == 0 {
		p.opts.MaxWarm = 4
	}
	p.log = p.opts.Logger
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p
}

// Store is the pool's store.
func (p *Pool) Store() *Store { return p.store }

var _ session.Templates = (*Pool)(nil)

// Use implements session.Templates: the template's environment and its
// zygote when that is ready (its first sessions start cold while it
// starts).
func (p *Pool) Use(ctx context.Context, name string) (*session.TemplateUse, error) {
	t, release, err := p.store.Acquire(name)
	if err != nil {
		return nil, err
	}
	u := &session.TemplateUse{Name: t.Name, Python: t.PythonPath(), Mounts: t.Mounts(), Env: t.SessionEnv(), Limits: t.Limits,
		PythonVersion: t.Python, Packages: make([]session.Package, len(t.Packages))}
	for i, p := range t.Packages {
		u.Packages[i] = session.Package(p)
	}
	if t.Snapshot != nil {
		seed, err := p.seedOf(t)
		if err != nil {
			release()
			return nil, err
		}
		u.Seed = seed
	}
	w := p.zygoteFor(t)
	if w != nil {
		select {
		case <-w.ready:
			if w.err == nil {
				u.Zygote = w.z
			}
		default:
		}
	}
	var once sync.Once
	u.Release = func() {
		once.Do(func() {
			release()
			if w != nil {
				p.mu.Lock()
				w.users--
				w.lastUsed = time.Now()
				p.mu.Unlock()
			}
		})
	}
	return u, nil
}

// Warm starts the zygotes of the templates named and waits until they are
// ready (serve --warm-templates).
func (p *Pool) Warm(ctx context.Context, names []string) error {
	for _, name := range names {
		t, err := p.store.Get(name)
		if err != nil {
			return err
		}
		if t.ColdStart != "" {
			return fmt.Errorf("template %s starts cold (its Python could not run a zygote when it was built: %s)", name, t.ColdStart)
		}
		w := p.zygoteFor(t)
		if w == nil {
			return fmt.Errorf("template %s: no room for its zygote (--max-warm-templates %d)", name, p.opts.MaxWarm)
		}
		p.mu.Lock()
		w.users-- // Warm holds no session
		p.mu.Unlock()
		select {
		case <-w.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if w.err != nil {
			return fmt.Errorf("template %s: %w", name, w.err)
		}
	}
	return nil
}

// WarmNames lists the templates whose zygotes run or start, by name.
func (p *Pool) WarmNames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, w := range p.warm {
		out = append(out, w.name)
	}
	sort.Strings(out)
	return out
}

// zygoteFor returns t's zygote, counting one more user, starting it (in
// the background) if none runs: nil where zygotes are off or none fits.
func (p *Pool) zygoteFor(t *Template) *warmZygote {
	if p.opts.MaxWarm < 0 || t.ColdStart != "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if w := p.warm[zygoteKey(t)]; w != nil {
		w.users++
		w.lastUsed = time.Now()
		return w
	}
	if len(p.warm) >= p.opts.MaxWarm && !p.evictLocked() {
		return nil
	}
	w := &warmZygote{name: t.Name, ready: make(chan struct{}), users: 1, lastUsed: time.Now()}
	p.warm[zygoteKey(t)] = w
	opts := &zygote.Options{Modules: t.Modules(), Env: append(session.KernelEnv(), t.SessionEnv()...), Python: t.PythonPath(),
		Mounts: t.Mounts(), Spares: p.opts.Spares, Limits: p.opts.Limits, Logger: p.log.With("template", t.Name)}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		z, err := zygote.New(context.Background(), opts)
		if err != nil {
			p.log.Warn("template zygote did not start: its sessions start cold", "template", t.Name, "err", err)
		}
		p.mu.Lock()
		w.z, w.err = z, err
		p.mu.Unlock()
		close(w.ready)
	}()
	return w
}

// evictLocked closes the least recently used idle, ready zygote.
func (p *Pool) evictLocked() bool {
	var oldest string
	for id, w := range p.warm {
		select {
		case <-w.ready:
		default:
			continue
		}
		if w.users > 0 {
			continue
		}
		if oldest == "" || w.lastUsed.Before(p.warm[oldest].lastUsed) {
			oldest = id
		}
	}
	if oldest == "" {
		return false
	}
	w := p.warm[oldest]
	delete(p.warm, oldest)
	if w.z != nil {
		w.z.Close()
	}
	p.log.Info("template zygote closed to make room", "template", w.name)
	return true
}

// Remove removes the template from the store (refused with *InUseError
// while sessions use it), closing its zygote if no other name shares its tree.
func (p *Pool) Remove(name string) error {
	t, err := p.store.Get(name)
	if err != nil {
		return err
	}
	if err := p.store.Remove(name); err != nil {
		return err
	}
	if _, err := p.store.Get(name); !errors.Is(err, ErrNotFound) {
		return nil
	}
	for _, o := range p.store.listLocked() {
		if zygoteKey(o) == zygoteKey(t) {
			return nil
		}
	}
	p.mu.Lock()
	w := p.warm[zygoteKey(t)]
	if w != nil && w.users <= 0 {
		delete(p.warm, zygoteKey(t))
	} else {
		w = nil
	}
	p.mu.Unlock()
	if w != nil {
		<-w.ready
		if w.z != nil {
			w.z.Close()
		}
	}
	return nil
}

// Close closes every zygote (and the sessions they forked).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	ws := p.warm
	p.warm = map[string]*warmZygote{}
	states := p.states
	p.states = map[string]*os.File{}
	p.mu.Unlock()
	for _, f := range states {
		f.Close() // kernels that mapped it keep their mappings
	}
	p.wg.Wait() // every zygote being started is ready (or failed)
	for _, w := range ws {
		if w.z != nil {
			w.z.Close()
		}
	}
}

// Has reports a template called name.
func (p *Pool) Has(name string) bool {
	_, err := p.store.Get(name)
	return err == nil
}

// seedOf is what t (built from a snapshot) gives each session: its files'
// tree, and its variables in a sealed state file loaded once from the
// store and shared by every session's kernel (each maps it
// copy-on-write).
func (p *Pool) seedOf(t *Template) (*session.TemplateSeed, error) {
	fs := t.Snapshot
	seed := &session.TemplateSeed{Files: t.SeedFiles(p.store), Variables: fs.Variables, NotSaved: fs.NotSaved}
	if fs.State == "" {
		return seed, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.states[fs.State]; f != nil {
		seed.State = f
		return seed, nil
	}
	f, err := loadState(p.store.statePath(fs.State), fs.State)
	if err != nil {
		return nil, fmt.Errorf("template %s: its variables: %w", t.Name, err)
	}
	p.states[fs.State] = f
	seed.State = f
	return seed, nil
}

// loadState copies the state file at path into a sealed kernel state file,
// checking its sha256.
func loadState(path, sum string) (*os.File, error) {
	in, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	f, err := kernel.NewStateFile("sandloop-template-" + sum[:12])
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), in); err != nil {
		f.Close()
		return nil, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		f.Close()
		return nil, fmt.Errorf("%s is damaged (sha256 %s, not %s): rebuild the template", path, got, sum)
	}
	if err := kernel.SealStateFile(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// zygoteKey says which templates can share a zygote: those of one tree
// (its id), and the KindSnapshot ones (the system's Python, no tree) with
// the same preloads and environment, whatever their files.
func zygoteKey(t *Template) string {
	if t.Kind != KindSnapshot {
		return t.ID
	}
	mods := "(default)"
	if m := t.Modules(); m != nil {
		mods = strings.Join(m, ",")
	}
	return "system\x00" + mods + "\x00" + strings.Join(t.SessionEnv(), "\x00")
}
