package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/store"
)

// Hosts may register themselves in the cell's PostgreSQL (serve
// --register URL): each renews its row every few seconds with its
// address, epoch and slots, and marks it not ready while it drains. A
// gateway started with --registered-hosts lists the hosts whose heartbeat
// is fresh; one silent past the deadline is no longer listed (and, like a
// host gone from a static list or an EndpointSlice, its sessions are
// declared lost after --lost-after). For cells without Kubernetes and
// without a fixed list of hosts.

// Registry is where hosts' registrations are read (store.Postgres).
type Registry interface {
	Registrations(ctx context.Context, within time.Duration) ([]store.Registration, error)
}

// Registered is the discovery of hosts that keep a fresh heartbeat.
type Registered struct {
	reg      Registry
	deadline time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	targets []Target
}

// NewRegistered lists the hosts whose heartbeat is at most deadline old,
// as of the last Refresh. log may be nil.
func NewRegistered(reg Registry, deadline time.Duration, log *slog.Logger) *Registered {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registered{reg: reg, deadline: deadline, log: log}
}

// Targets returns the hosts as of the last Refresh.
func (d *Registered) Targets() []Target {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.targets
}

// Refresh reads the registrations. When the database cannot be read the
// last list stays: a database outage must not make every host look gone.
func (d *Registered) Refresh(ctx context.Context) error {
	regs, err := d.reg.Registrations(ctx, d.deadline)
	if err != nil {
		return err
	}
	targets := make([]Target, 0, len(regs))
	for _, r := range regs {
		targets = append(targets, Target{Name: r.Name, URL: r.URL, Draining: !r.Ready, Templates: r.Templates})
	}
	d.mu.Lock()
	d.targets = targets
	d.mu.Unlock()
	return nil
}

// Run refreshes every interval until ctx ends.
func (d *Registered) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := d.Refresh(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("read the registered hosts (keeping the last list)", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Heartbeater is where a host registers itself (store.Postgres).
type Heartbeater interface {
	Heartbeat(ctx context.Context, r store.Registration) error
	Deregister(ctx context.Context, name, epoch string) error
}

// Register keeps a host's registration fresh until ctx ends: it writes
// what self returns now and every interval, then removes it (the host is
// gone: gateways stop listing it at once rather than at the deadline).
func Register(ctx context.Context, hb Heartbeater, interval time.Duration, self func() store.Registration, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var last store.Registration
	for {
		last = self()
		if err := hb.Heartbeat(ctx, last); err != nil && ctx.Err() == nil {
			log.Warn("heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := hb.Deregister(dctx, last.Name, last.Epoch); err != nil {
				log.Warn("deregister", "err", err)
			}
			return
		case <-t.C:
		}
	}
}
