package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
)

// host is one host as this gateway sees it.
type host struct {
	name string
	url  *url.URL

	// Guarded by hosts.mu.
	epoch     string // "" until first seen
	reachable bool
	draining  bool
	slots     int
	used      int
	pool      int // kernels started ahead (pool_ready), at the last health answer
	spares    int // the zygote's spares ready (spares_ready), at the last health answer
	starting  int // creates under way there (waiting for a kernel), at the last health answer
	// placed are the sessions this gateway placed since the last health
	// answer, counted when placed (before the host answers: pick) and
	// taken back if the host did not make one (unpick).
	placed    int
	round     int // health answers so far: a placement counts in one round
	lastOK    time.Time
	firstBad  time.Time // when it stopped answering (zero while it answers)
	gone      bool      // no longer listed by the discovery
	unready   bool      // listed as draining by the discovery
	fenced    bool      // its sessions were marked lost while it was away
	templates []string  // as its last health answer listed them (nil: it did not)
	announced []string  // as its registration lists them
}

// templateNames is what hasTemplate goes by.
func (h *host) templateNames() []string {
	if h.templates != nil {
		return slices.Clone(h.templates)
	}
	return slices.Clone(h.announced)
}

// hasTemplate: the host has the template, as its health answer says, or
// its registration before the health answers.
func (h *host) hasTemplate(name string) bool {
	if h.templates != nil {
		return slices.Contains(h.templates, name)
	}
	return slices.Contains(h.announced, name)
}

// HostInfo is a host as GET /v1/hosts shows it.
type HostInfo struct {
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Epoch     string    `json:"epoch"`
	Ready     bool      `json:"ready"`
	Reachable bool      `json:"reachable"`
	Draining  bool      `json:"draining"`
	Slots     int       `json:"slots"`
	Used      int       `json:"used"`
	LastSeen  time.Time `json:"last_seen"`
	Listed    bool      `json:"listed"` // by the discovery
	// Templates are the host's templates (sessions naming one are placed
	// on a host that has it).
	Templates []string `json:"templates"`
}

// hosts tracks the cell's hosts: health rounds ask each for /healthz,
// learn its epoch and free slots, and fence the sessions of epochs that
// ended (a restarted host) or of hosts unreachable for LostAfter.
type hosts struct {
	g  *Gateway
	mu sync.Mutex
	m  map[string]*host
}

func (hs *hosts) snapshot() []HostInfo {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	var out []HostInfo
	for _, h := range hs.m {
		out = append(out, HostInfo{Name: h.name, URL: h.url.String(), Epoch: h.epoch, Ready: h.ready(), Reachable: h.reachable,
			Draining: h.draining || h.unready, Slots: h.slots, Used: h.used + h.placed, LastSeen: h.lastOK, Listed: !h.gone,
			Templates: h.templateNames()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ready: may take new sessions. Guarded by hosts.mu.
func (h *host) ready() bool {
	return h.reachable && !h.draining && !h.unready && !h.gone && h.epoch != ""
}

// get returns the host's URL and current epoch, if it is known.
func (hs *hosts) get(name string) (u *url.URL, epoch string, reachable, ok bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.m[name]
	if h == nil {
		return nil, "", false, false
	}
	return h.url, h.epoch, h.reachable, true
}

// candidates lists the ready hosts with their free slots and kernels
// warm; with a template, only the hosts that have it.
func (hs *hosts) candidates(exclude map[string]bool, template string) []candidate {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.candidatesLocked(exclude, template)
}

// candidatesLocked is candidates; hs.mu is held.
func (hs *hosts) candidatesLocked(exclude map[string]bool, template string) []candidate {
	var out []candidate
	for _, h := range hs.m {
		if h.ready() && !exclude[h.name] && (template == "" || h.hasTemplate(template)) {
			out = append(out, candidate{name: h.name, free: h.slots - h.used - h.placed, ready: h.pool + h.spares - h.starting - h.placed})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// pick chooses a host for a new session among the ready hosts not in
// exclude (with a template, those that have it), by choose, and counts
// the placement there at once: the requests of a burst all come before
// any host has answered one, and each must see the others' placements,
// else they all go to the host that looked best before the burst. It
// returns the host and the health round the placement counts in (for
// unpick), or "" if no host can take it. slotsOnly weighs free slots
// alone (the placement before issue 26). rnd breaks ties (rand.IntN).
func (hs *hosts) pick(exclude map[string]bool, template string, slotsOnly bool, rnd func(int) int) (name string, round int) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	cands := hs.candidatesLocked(exclude, template)
	if slotsOnly {
		for i := range cands {
			cands[i].ready = 0
		}
	}
	i := choose(cands, rnd)
	if i < 0 {
		return "", 0
	}
	h := hs.m[cands[i].name]
	h.placed++
	return h.name, h.round
}

// unpick takes back a placement pick counted on a host that made no
// session of it (it refused, failed or could not be reached), unless a
// health answer has come since (the host's own figures replaced it).
func (hs *hosts) unpick(name string, round int) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.m[name]; h != nil && h.round == round && h.placed > 0 {
		h.placed--
	}
}

// placedOn counts a session a host made that no pick chose (a fork's,
// on its parent's host) until the host's next health answer.
func (hs *hosts) placedOn(name string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.m[name]; h != nil {
		h.placed++
	}
}

// reachableHosts lists every host that answers, ready or draining.
func (hs *hosts) reachableHosts() []*url.URL {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	var out []*url.URL
	for _, h := range hs.m {
		if h.reachable {
			out = append(out, h.url)
		}
	}
	return out
}

// refused notes that a host turned a new session away (full or draining),
// so placement skips it until its next health answer.
func (hs *hosts) refused(name string, draining bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.m[name]; h != nil {
		if draining {
			h.draining = true
		} else {
			h.used = h.slots
		}
	}
}

// totals are the cell's session slots, for metrics and autoscaling.
func (hs *hosts) totals() (ready, slots, used int) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, h := range hs.m {
		if h.ready() {
			ready++
			slots += h.slots
			used += h.used
		}
	}
	return
}

// round is one health round: sync with the discovery, ask every host.
func (hs *hosts) round(ctx context.Context) {
	listed := map[string]bool{}
	for _, t := range hs.g.opts.Discovery.Targets() {
		listed[t.Name] = true
		u, err := url.Parse(t.URL)
		if err != nil {
			continue
		}
		hs.mu.Lock()
		h := hs.m[t.Name]
		if h == nil {
			h = &host{name: t.Name, url: u}
			hs.m[t.Name] = h
		}
		if h.url.String() != u.String() { // the pod was replaced: a new address
			h.url, h.reachable = u, false
		}
		h.gone, h.unready, h.announced = false, t.Draining, t.Templates
		hs.mu.Unlock()
	}
	hs.mu.Lock()
	var all []*host
	for _, h := range hs.m {
		if !listed[h.name] {
			h.gone = true
		}
		all = append(all, h)
	}
	hs.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range all {
		wg.Go(func() { hs.check(ctx, h) })
	}
	wg.Wait()
}

// check asks one host for its health and acts on what changed.
func (hs *hosts) check(ctx context.Context, h *host) {
	hs.mu.Lock()
	u, gone := h.url, h.gone
	hs.mu.Unlock()
	var health server.Health
	err := fmt.Errorf("not listed")
	if !gone {
		err = hs.g.healthOf(ctx, u, &health)
	}
	now := time.Now()
	hs.mu.Lock()
	if err != nil {
		if h.reachable || h.firstBad.IsZero() {
			h.firstBad = now
		}
		h.reachable = false
		lost := !h.fenced && now.Sub(h.firstBad) >= hs.g.opts.LostAfter
		name := h.name
		if lost {
			h.fenced = true
		}
		forget := h.gone && h.fenced
		if forget {
			delete(hs.m, h.name)
		}
		hs.mu.Unlock()
		if lost {
			hs.g.log.Warn("host lost: its sessions are gone", "host", name, "unreachable_for", now.Sub(h.firstBad).Round(time.Millisecond), "err", err)
			hs.g.fence(ctx, name, "")
		}
		return
	}
	changed := h.epoch != health.Epoch
	wasFenced := h.fenced
	h.epoch, h.reachable, h.draining = health.Epoch, true, health.Draining || health.Status != "ok"
	// Paused sessions take no slot; creates under way hold one.
	h.slots, h.used, h.pool, h.spares = health.MaxSessions, health.Sessions-health.Paused+health.Starting, health.PoolReady, health.SparesReady
	h.starting, h.placed = health.Starting, 0
	h.round++
	h.templates = health.Templates
	h.lastOK, h.firstBad, h.fenced = now, time.Time{}, false
	rec := store.HostRecord{Name: h.name, URL: u.String(), Epoch: h.epoch, Ready: h.ready(), Slots: h.slots, Used: h.used, SeenAt: now}
	hs.mu.Unlock()
	if changed || wasFenced {
		// A new epoch (a restarted host, or one this gateway sees for the
		// first time): sessions placed under any other epoch are gone.
		hs.g.log.Info("host epoch", "host", rec.Name, "epoch", rec.Epoch, "slots", rec.Slots, "used", rec.Used)
		hs.g.fence(ctx, rec.Name, rec.Epoch)
		if err := hs.g.opts.Cluster.PutHost(ctx, rec); err != nil {
			hs.g.log.Warn("record host", "host", rec.Name, "err", err)
		}
	}
}

// healthOf asks a host for /healthz.
func (g *Gateway) healthOf(ctx context.Context, u *url.URL, into *server.Health) error {
	ctx, cancel := context.WithTimeout(ctx, g.opts.HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.JoinPath("/healthz").String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret) // for the host's templates
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(into)
}
